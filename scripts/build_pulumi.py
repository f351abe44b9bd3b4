#!/usr/bin/env python3
"""Build the Pulumi CLI, its Python language host and the Kubernetes provider (bench/pulumi_up.py).

No Pulumi release can be installed on the lab's machine, so the three programs a `pulumi up` of the
in-cluster layer needs are built from source into the lab's build cache
(`superkube.harness.pulumi_engine`), with the components' Go (GOTOOLCHAIN=local):

    scripts/build_pulumi.py --pulumi DIR [--cli-version V] [--host-ref TAG] [--provider-version V]

- The CLI from its module `github.com/pulumi/pulumi/pkg/v3` through the module proxy, at the served
  release nearest the Python SDK's pin. Its go.mod replaces the SDK module with a sibling folder (as a
  repository's go.mod does), which stops `go install module@version`: the build copies the module
  into a scratch folder, drops that one replace, and builds `./cmd/pulumi` there with the SDK module
  at the same version from the proxy.
- The language host (`sdk/python/cmd/pulumi-language-python`) is not served as a module: its own
  package comes from `DIR`, a git clone of pulumi/pulumi (or a bare git directory), at `--host-ref`
  (`git archive`; the clone is left as it was), and everything it imports, the Python toolchain
  package included, from the proxy at the CLI's version. Beside it goes the checkout's
  `pulumi-language-python-exec`, the script the host runs the program with, as a release ships it.
  The checkout has no `pulumi-analyzer-policy-python`: a CLI with the Python language host runs a
  Python policy pack through that host, so none is needed.
- The provider from `github.com/pulumi/pulumi-kubernetes/provider/v4` through the proxy. Its go.mod
  replaces its SDK module with a sibling folder: dropped the same way, the SDK module then comes from
  the proxy at the version the provider requires. Its binary embeds the schema the module carries
  (`schema.json`, with the version set, as the provider's own `go generate` step writes it).

The manifest records, for each program, where it came from, the version got and how far that is from
the Python SDK pins in constraints.txt. Nothing of Pulumi's source is kept: each build happens in a
temporary folder. A build the cache already holds is skipped unless `--force`.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "src")]

from superkube.harness import build, pulumi_engine  # noqa: E402
from superkube.harness.pulumi_engine import (  # noqa: E402
    CLI_MODULE,
    PROVIDER_MODULE,
    PROVIDER_SDK_MODULE,
    SDK_MODULE,
)

HOST_DIR = "sdk/python/cmd/pulumi-language-python"
HOST_MODULE = "github.com/pulumi/pulumi/sdk/python/cmd/pulumi-language-python/v3"
EXEC_SCRIPT = "sdk/python/cmd/pulumi-language-python-exec"
PROVIDER_CMD = "cmd/pulumi-resource-kubernetes"
VERSION_VAR = {
    "cli": f"{SDK_MODULE}/go/common/version.Version",
    "provider": f"{PROVIDER_MODULE}/pkg/version.Version",
}


class Failed(Exception):
    pass


def say(what: str) -> None:
    print(f"build_pulumi: {what}", file=sys.stderr, flush=True)


def run(argv: list[str], cwd: Path, env: dict[str, str], log: Path) -> str:
    """Run a command, its output appended to `log`; raise Failed with its last line on failure."""
    with log.open("a") as sink:
        sink.write(f"$ {' '.join(argv)}   (in {cwd})\n")
        sink.flush()
        proc = subprocess.run(argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=sink, text=True)
        sink.write(proc.stdout)
    if proc.returncode != 0:
        lines = [line for line in log.read_text().splitlines() if line.strip()]
        raise Failed(f"{argv[0]} {argv[1]} failed (exit {proc.returncode}): {lines[-1] if lines else ''}")
    return proc.stdout


def download(
    module: str, version: str, work: Path, env: dict[str, str], go: str, log: Path
) -> dict[str, Any]:
    """`go mod download -json module@version`: the module's folder in the module cache and its origin."""
    work.mkdir(parents=True, exist_ok=True)
    (work / "go.mod").write_text("module superkube.download\n\ngo 1.24\n")
    try:
        info: dict[str, Any] = json.loads(
            run([go, "mod", "download", "-json", f"{module}@{version}"], work, env, log)
        )
    except Failed:
        text = log.read_text()
        why = next((line for line in reversed(text.splitlines()) if '"Error"' in line), "see the log")
        raise Failed(f"the module proxy does not serve {module}@{version}: {why.strip()}") from None
    return info


def copy_module(source: Path, target: Path) -> None:
    """A writable copy of a module-cache folder (whose files are read-only)."""
    shutil.copytree(source, target, copy_function=shutil.copyfile)
    for path in [target, *target.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)


def go_build(
    go: str, env: dict[str, str], cwd: Path, package: str, out: Path, ldflags: str, log: Path
) -> None:
    run(
        ["nice", "-n", "19", go, "build", "-trimpath", "-ldflags", ldflags, "-o", str(out), package],
        cwd,
        env,
        log,
    )


def build_cli(
    go: str, env: dict[str, str], version: str, scratch: Path, bin_dir: Path, log: Path
) -> dict[str, Any]:
    info = download(CLI_MODULE, version, scratch / "dl-cli", env, go, log)
    src = scratch / "cli"
    copy_module(Path(info["Dir"]), src)
    run([go, "mod", "edit", f"-dropreplace={SDK_MODULE}", f"-require={SDK_MODULE}@{version}"], src, env, log)
    say(f"building the CLI {CLI_MODULE}@{version}")
    go_build(
        go, env, src, "./cmd/pulumi", bin_dir / "pulumi", f"-s -w -X {VERSION_VAR['cli']}={version}", log
    )
    return {"from": f"module proxy: {CLI_MODULE}@{version}", "version": version, "sum": info.get("Sum")}


def build_host(
    go: str,
    env: dict[str, str],
    checkout: Path,
    ref: str,
    version: str,
    scratch: Path,
    bin_dir: Path,
    log: Path,
) -> dict[str, Any]:
    git_dir = checkout / ".git" if (checkout / ".git").exists() else checkout
    commit = subprocess.run(
        ["git", f"--git-dir={git_dir}", "rev-parse", f"{ref}^{{commit}}"], capture_output=True, text=True
    )
    if commit.returncode != 0:
        raise Failed(f"{checkout} has no {ref} ({commit.stderr.strip()}): fetch its tags, or give --host-ref")
    archive = subprocess.run(
        ["git", f"--git-dir={git_dir}", "archive", ref, HOST_DIR, EXEC_SCRIPT], capture_output=True
    )
    if archive.returncode != 0:
        raise Failed(f"{ref} has no {HOST_DIR}: {archive.stderr.decode().strip()}")
    tree = scratch / "host"
    tree.mkdir()
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive.stdout, check=True)
    src = tree / HOST_DIR
    gomod = (src / "go.mod").read_text()
    if f"module {HOST_MODULE}" not in gomod:
        raise Failed(f"{HOST_DIR}/go.mod at {ref} is not module {HOST_MODULE}")
    # its go.mod replaces the SDK and pkg modules with the repository's own folders, which this
    # build does not take: both come from the proxy at the CLI's version, the CLI's own code
    run(
        [go, "mod", "edit", f"-dropreplace={SDK_MODULE}", f"-dropreplace={CLI_MODULE}",
         f"-require={SDK_MODULE}@{version}", f"-require={CLI_MODULE}@{version}"],
        src, env, log,
    )  # fmt: skip
    say(f"building the language host ({ref}'s package, its imports at {version})")
    go_build(
        go, env, src, ".", bin_dir / "pulumi-language-python", f"-s -w -X {VERSION_VAR['cli']}={version}", log
    )
    shutil.copyfile(tree / EXEC_SCRIPT, bin_dir / "pulumi-language-python-exec")
    (bin_dir / "pulumi-language-python-exec").chmod(0o755)
    return {
        "from": f"checkout of pulumi/pulumi at {ref} ({commit.stdout.strip()}): {HOST_DIR} and {EXEC_SCRIPT}; "
        f"its imports ({SDK_MODULE}, {CLI_MODULE}) from the module proxy at {version}",
        "version": ref,
        "imports_version": version,
    }


def build_provider(
    go: str, env: dict[str, str], version: str, scratch: Path, bin_dir: Path, log: Path
) -> dict[str, Any]:
    info = download(PROVIDER_MODULE, version, scratch / "dl-provider", env, go, log)
    src = scratch / "provider"
    copy_module(Path(info["Dir"]), src)
    run([go, "mod", "edit", f"-dropreplace={PROVIDER_SDK_MODULE}"], src, env, log)
    cmd = src / PROVIDER_CMD
    plain = version.removeprefix("v")
    schema = json.loads((cmd / "schema.json").read_text())
    schema["version"] = plain
    (cmd / "schema-embed.json").write_text(json.dumps(schema, separators=(",", ":")))
    mapping = json.loads((cmd / "terraform-mapping.json").read_text())
    (cmd / "terraform-mapping-embed.json").write_text(json.dumps(mapping, separators=(",", ":")))
    say(f"building the provider {PROVIDER_MODULE}@{version}")
    go_build(
        go, env, src, f"./{PROVIDER_CMD}", bin_dir / "pulumi-resource-kubernetes",
        f"-s -w -X {VERSION_VAR['provider']}={plain}", log,
    )  # fmt: skip
    origin = info.get("Origin") or {}
    return {
        "from": f"module proxy: {PROVIDER_MODULE}@{version}",
        "version": version,
        "commit": origin.get("Hash", ""),
        "sum": info.get("Sum"),
    }


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def main() -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument(
        "--pulumi", type=Path, required=True, help="a git clone (or git directory) of pulumi/pulumi"
    )
    p.add_argument("--cli-version", default=pulumi_engine.CLI_VERSION)
    p.add_argument("--host-ref", default=pulumi_engine.HOST_REF)
    p.add_argument("--provider-version", default=pulumi_engine.PROVIDER_VERSION)
    p.add_argument("--cache", type=Path, default=build.CACHE_DIR)
    p.add_argument("--force", action="store_true", help="build again even if the cache holds this build")
    args = p.parse_args()
    if not args.pulumi.is_dir():
        print(
            f"build_pulumi: --pulumi {args.pulumi} is not a folder: give a git clone of pulumi/pulumi",
            file=sys.stderr,
        )
        return 2
    for flag, value in (("--cli-version", args.cli_version), ("--provider-version", args.provider_version)):
        if not value.startswith("v"):
            print(f"build_pulumi: {flag} {value!r}: write a module version such as v3.274.0", file=sys.stderr)
            return 2
    out = pulumi_engine.entry(args.cache, args.cli_version)
    if not args.force and pulumi_engine.manifest(args.cache, args.cli_version):
        say(f"already built: {out} (--force to build again)")
        print(out)
        return 0
    go = build.go_binary(say)
    env = {**build.go_env(go), "CGO_ENABLED": "0", "GOFLAGS": "-mod=mod -buildvcs=false"}
    pins = pulumi_engine.pins(ROOT / "constraints.txt")
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    partial.chmod(0o755)  # mkdtemp makes it the owner's alone; the cache's other entries are readable
    log = partial / "build.log"
    bin_dir = partial / "bin"
    bin_dir.mkdir()
    started = time.monotonic()
    try:
        with tempfile.TemporaryDirectory(prefix="superkube-pulumi-") as tmp:
            scratch = Path(tmp)
            built = {"cli": build_cli(go, env, args.cli_version, scratch, bin_dir, log)}
            built["language_host"] = build_host(
                go, env, args.pulumi, args.host_ref, args.cli_version, scratch, bin_dir, log
            )
            built["provider"] = build_provider(go, env, args.provider_version, scratch, bin_dir, log)
        built["cli"]["pin"] = built["language_host"]["pin"] = f"pulumi=={pins.get('pulumi', '?')}"
        built["cli"]["distance"] = pulumi_engine.distance(args.cli_version, pins.get("pulumi", "0.0.0"))
        built["language_host"]["distance"] = pulumi_engine.distance(
            args.host_ref, pins.get("pulumi", "0.0.0")
        )
        built["provider"]["pin"] = f"pulumi_kubernetes=={pins.get('pulumi_kubernetes', '?')}"
        built["provider"]["distance"] = pulumi_engine.distance(
            args.provider_version, pins.get("pulumi_kubernetes", "0.0.0")
        )
        manifest = {
            "built": built,
            "go": build._version_of(go),
            "seconds": round(time.monotonic() - started, 1),
            "sha256": {name: sha256(bin_dir / name) for name in pulumi_engine.BINARIES},
        }
        (partial / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
        shutil.rmtree(out, ignore_errors=True)
        partial.rename(out)
    except Failed as error:
        say(f"{error} (the whole log: {log})")
        return 1
    finally:
        if partial.exists() and partial != out:
            shutil.rmtree(partial / "bin", ignore_errors=True)
    say(f"built in {manifest['seconds']} s")
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
