"""The pinned components, built from their published Go modules into a cache keyed by version.

Production installs the release artefacts the roles pin (kube_component's release-<minor>.yml);
the lab runs the same components built here from their Go modules at the same versions, since no
release download can be reached from the lab's machine. Nothing upstream is vendored or committed:
each build is a throwaway module of a few lines (written in a temporary folder) that requires the
component's module at its pinned version and names the commands to build as tools.

    <cache>/<component>/<version>/go<go version>/
        bin/<binary>...        the binaries, static (CGO_ENABLED=0, as the releases are)
        manifest.json          component, module, version, Go version, sha256 of each binary
        go.mod, go.sum         the build module, as resolved: what went into the binaries
        build.log              everything go printed

A second run finds the manifest, checks each binary's sha256 against it, and builds nothing. A build
is made in a sibling folder and renamed into place, under a lock per component, so an interrupted or
concurrent run never leaves a half-built entry that looks done.

Kubernetes publishes its staging modules (k8s.io/api, k8s.io/apiserver, ...) in its go.mod at v0.0.0
with no replace directives; the build module replaces each with its published release (v0.35.0 for
v1.35.0). scheduler-plugins pins its Kubernetes libraries with replace directives, which only apply
in the main module: the build module repeats them. Both are read from the modules' own go.mod files
through the module proxy at build time, never written down here.

Every component is built with one Go, `GO_VERSION`: the installed `go` when it is that version, else
that release's toolchain fetched as the module golang.org/toolchain through the module proxy (so the
checksum database verifies it, as it does every module) by whatever `go` is installed (Debian 12's
own 1.19 will do) and unpacked into the checkout's `.tools/`. Independent components build two at a
time (`jobs`): on a cold cache a component spends much of its time resolving and downloading modules
and linking, which leaves a core idle; two builds of one module never run at once, as they would
compile the same packages twice.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
import threading
import time
import zipfile
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from superkube.cluster.dns import COREDNS_MODULE, COREDNS_VERSION
from superkube.cluster.gang import MPI_OPERATOR_VERSION, RELEASES, scheduler_plugins_version

CACHE_DIR = Path(os.environ.get("SUPERKUBE_BUILD_CACHE", "/var/cache/superkube/build"))
GO_VERSION = "1.26.8"
"""The Go every component is built with. It is part of each cache entry's key: changing it builds every
component again (about half an hour on two cores from empty Go caches)."""
TOOLCHAIN_DIR = Path(__file__).resolve().parents[3] / ".tools" / f"go{GO_VERSION}"
"""Where the pinned toolchain is unpacked when the installed Go is another version (the checkout's
.tools/, which git ignores)."""
MANIFEST = "manifest.json"
RECIPE = 2
"""Bump when how a component is built changes: entries made by another recipe are built again."""
HEARTBEAT_S = 30.0

Progress = Callable[[str, str], None]
"""progress(component, what is happening now)."""


class BuildError(Exception):
    """A build that failed: one line naming the component, the step, and where the full log is."""


class PinError(ValueError):
    """A request for a component or version that cannot be: one line saying what to ask instead."""


NAMES = (
    "etcd",
    "kubernetes",
    "kubernetes-node",
    "scheduler-plugins",
    "containerd",
    "runc",
    "kwok",
    "scheduler-plugins-controller",
    "mpi-operator",
    "coredns",
    "prometheus",
)
HOST_COMPONENTS = (
    "etcd",
    "kubernetes",
    "kubernetes-node",
    "scheduler-plugins",
    "containerd",
    "runc",
    "prometheus",
)
"""what `lab up` gives the lab's hosts as programs. Not kwok (it runs beside the lab, against its API
server)."""
IMAGE_COMPONENTS = ("coredns", "scheduler-plugins-controller", "mpi-operator")
"""what `lab up` makes into images its nodes import under the names the in-cluster layer pins
(superkube.lab.images): cluster DNS and the gang controllers run as the layer's pods there. The
loopback harness runs the gang controllers as host processes (`superkube.harness.gang`)."""
LAB_COMPONENTS = HOST_COMPONENTS + IMAGE_COMPONENTS
KWOK_VERSION = "v0.8.0"
"""kwok simulates Nodes (and their pods) against the lab's real API server: a lab-only tool, never
installed by the roles, so it is pinned here rather than in the release file"""


@dataclass(frozen=True)
class Component:
    """One pinned upstream project, built from its Go module."""

    name: str
    module: str
    version: str
    binaries: Mapping[str, str]
    """binary name -> the Go package (a main package) it is built from"""
    also_require: Mapping[str, str] = field(default_factory=dict)
    """further modules the commands come from, at their versions (etcdctl is its own module)"""
    replaces: str = ""
    """how the build module's replace directives are made: "staging" or "copy" (see the module doc)"""
    ldflags: tuple[str, ...] = ()
    tags: tuple[str, ...] = ()
    cgo: bool = False
    """runc links C (its nsenter and libseccomp): built with cgo; everything else is static Go"""

    @property
    def label(self) -> str:
        return f"{self.name} {self.version}"


def _version_ldflags(version: str, commit: str = "") -> tuple[str, ...]:
    """What Kubernetes' own build stamps into component-base and client-go (`--version`, /version)."""
    major, minor = version.lstrip("v").split(".")[:2]
    flags = []
    for package in ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version"):
        flags += [f"-X {package}.gitVersion={version}", f"-X {package}.gitMajor={major}"]
        flags += [f"-X {package}.gitMinor={minor}", f"-X {package}.gitTreeState=clean"]
        if commit:
            flags.append(f"-X {package}.gitCommit={commit}")
    return tuple(flags)


MONITORING_DEFAULTS = RELEASES.parents[1] / "monitoring" / "defaults" / "main.yml"


def prometheus_version() -> str:
    """The Prometheus release the monitoring role pins (`monitoring_prometheus_version`), e.g. 2.53.2."""
    return str(yaml.safe_load(MONITORING_DEFAULTS.read_text())["monitoring_prometheus_version"])


def prometheus_module_version(release_: str) -> str:
    """Prometheus' Go module tags release 2.M.P as v0.M.P."""
    major, minor, patch = release_.lstrip("v").split(".")
    if major != "2":
        raise PinError(f"prometheus {release_}: the lab builds Prometheus 2 releases (module v0.M.P)")
    return f"v0.{minor}.{patch}"


def release(minor: str = "1.35") -> dict[str, Any]:
    """The pinned release the roles install (kube_component's release-<minor>.yml)."""
    path = RELEASES / f"release-{minor}.yml"
    return dict(yaml.safe_load(path.read_text())["kube_component_release"])


def components(pins: Mapping[str, str] | None = None, minor: str = "1.35") -> list[Component]:
    """The components the lab builds, at the versions the roles pin (or `pins`: name -> version)."""
    pinned = release(minor)
    versions = {
        "etcd": f"v{pinned['etcd']['version']}",
        "kubernetes": f"v{pinned['version']}",
        "scheduler-plugins": scheduler_plugins_version(pinned["version"]),
        "containerd": f"v{pinned['runtime']['containerd']['version']}",
        "runc": f"v{pinned['runtime']['runc']['version']}",
        "kwok": KWOK_VERSION,
        "scheduler-plugins-controller": scheduler_plugins_version(pinned["version"]),
        "mpi-operator": f"v{MPI_OPERATOR_VERSION}",
        "coredns": COREDNS_VERSION,
        "prometheus": prometheus_module_version(prometheus_version()),
    }
    unknown = sorted(set(pins or {}) - set(versions))  # kubernetes-node follows kubernetes' pin
    if unknown:
        raise PinError(f"no component named {', '.join(unknown)}; the components are {', '.join(versions)}")
    for name, version in (pins or {}).items():
        if not re.fullmatch(r"v?\d+\.\d+\.\d+(-[0-9A-Za-z.]+)?", version):
            raise PinError(f"{name}={version}: not a release version; give one like {versions[name]}")
        versions[name] = version if version.startswith("v") else f"v{version}"
    etcd, kube, plugins = versions["etcd"], versions["kubernetes"], versions["scheduler-plugins"]
    return [
        Component(
            name="etcd",
            module="go.etcd.io/etcd/server/v3",
            version=etcd,
            binaries={"etcd": "go.etcd.io/etcd/server/v3", "etcdctl": "go.etcd.io/etcd/etcdctl/v3"},
            also_require={"go.etcd.io/etcd/etcdctl/v3": etcd},
        ),
        Component(
            name="kubernetes",
            module="k8s.io/kubernetes",
            version=kube,
            binaries={
                "kube-apiserver": "k8s.io/kubernetes/cmd/kube-apiserver",
                "kube-controller-manager": "k8s.io/kubernetes/cmd/kube-controller-manager",
                "kubectl": "k8s.io/kubernetes/cmd/kubectl",
            },
            replaces="staging",
            # the release's commit is stamped only when building that release
            ldflags=_version_ldflags(kube, str(pinned["commit"]) if kube == f"v{pinned['version']}" else ""),
        ),
        Component(  # the node's half of the same release (its own entry: the control plane's stays cached)
            name="kubernetes-node",
            module="k8s.io/kubernetes",
            version=kube,
            binaries={
                "kubelet": "k8s.io/kubernetes/cmd/kubelet",
                "kube-proxy": "k8s.io/kubernetes/cmd/kube-proxy",
            },
            replaces="staging",
            ldflags=_version_ldflags(kube, str(pinned["commit"]) if kube == f"v{pinned['version']}" else ""),
        ),
        Component(
            name="scheduler-plugins",
            module="sigs.k8s.io/scheduler-plugins",
            version=plugins,
            binaries={"kube-scheduler": "sigs.k8s.io/scheduler-plugins/cmd/scheduler"},
            replaces="copy",
            # stamped with the Kubernetes release it is built on (scheduler-plugins v0.M.P is built on
            # Kubernetes v1.M.P), not its own v0.M.P as its Makefile does: the scheduler takes its
            # binary version from the stamp, and component-base refuses to start a 0.M binary
            # ("emulation version 0.34 is not between [1.31, 0.34.0]")
            ldflags=_version_ldflags("v1." + plugins.removeprefix("v0.")),
        ),
        Component(
            name="containerd",
            module="github.com/containerd/containerd/v2",
            version=versions["containerd"],
            binaries={
                "containerd": "github.com/containerd/containerd/v2/cmd/containerd",
                "containerd-shim-runc-v2": "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2",
                "ctr": "github.com/containerd/containerd/v2/cmd/ctr",
            },
            ldflags=(
                f"-X github.com/containerd/containerd/v2/version.Version={versions['containerd']}",
                "-X github.com/containerd/containerd/v2/version.Package=github.com/containerd/containerd/v2",
            ),
        ),
        Component(
            name="runc",
            module="github.com/opencontainers/runc",
            version=versions["runc"],
            binaries={"runc": "github.com/opencontainers/runc"},
            ldflags=(f"-X main.version={versions['runc'].removeprefix('v')}",),
            tags=("seccomp", "urfave_cli_no_docs"),
            cgo=True,
        ),
        Component(
            name="kwok",
            module="sigs.k8s.io/kwok",
            version=versions["kwok"],
            binaries={"kwok": "sigs.k8s.io/kwok/cmd/kwok"},
            ldflags=(f"-X sigs.k8s.io/kwok/pkg/consts.Version={versions['kwok'].removeprefix('v')}",),
        ),
        Component(  # the scheduler's in-cluster half (keeps each PodGroup's status), at its pin
            name="scheduler-plugins-controller",
            module="sigs.k8s.io/scheduler-plugins",
            version=versions["scheduler-plugins-controller"],
            binaries={"controller": "sigs.k8s.io/scheduler-plugins/cmd/controller"},
            replaces="copy",
            ldflags=_version_ldflags("v1." + versions["scheduler-plugins-controller"].removeprefix("v0.")),
        ),
        Component(  # its go.mod has no replace directives: minimum version selection builds it as is
            name="mpi-operator",
            module="github.com/kubeflow/mpi-operator",
            version=versions["mpi-operator"],
            binaries={"mpi-operator": "github.com/kubeflow/mpi-operator/cmd/mpi-operator"},
        ),
        Component(  # cluster DNS, at the release kubeadm installs; no replace directives either
            name="coredns",
            module=COREDNS_MODULE,
            version=versions["coredns"],
            binaries={"coredns": COREDNS_MODULE},
        ),
        Component(  # the monitoring hosts' shards, with Kubernetes discovery (Debian builds it without)
            name="prometheus",
            module="github.com/prometheus/prometheus",
            version=versions["prometheus"],
            binaries={
                "prometheus": "github.com/prometheus/prometheus/cmd/prometheus",
                "promtool": "github.com/prometheus/prometheus/cmd/promtool",
            },
            replaces="copy",  # its klog replacements apply only in the main module
            ldflags=(
                "-X github.com/prometheus/common/version.Version="
                + "2."
                + versions["prometheus"].removeprefix("v0."),
                "-X github.com/prometheus/common/version.Branch=release",
            ),
        ),
    ]


def go_version() -> str:
    """The Go toolchain's version the components are built with (part of the cache key)."""
    return GO_VERSION


def _version_of(go: str) -> str | None:
    try:
        text = subprocess.run(
            [go, "env", "GOVERSION"],
            check=True,
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, "GOTOOLCHAIN": "local"},
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return text.strip().removeprefix("go")


def go_binary(progress: Callable[[str], None] = lambda what: None, toolchain: Path = TOOLCHAIN_DIR) -> str:
    """The `go` of GO_VERSION: the installed one if it is that version, else the pinned toolchain in
    `toolchain`, fetched there first if it is not yet."""
    installed = shutil.which("go")
    if installed and _version_of(installed) == GO_VERSION:
        return installed
    local = toolchain / "bin" / "go"
    if local.is_file() and _version_of(str(local)) == GO_VERSION:
        return str(local)
    if installed is None:
        raise BuildError(
            f"no go to fetch Go {GO_VERSION} with: install Debian's golang-go (any version will do: "
            f"apt-get install golang-go), or Go {GO_VERSION} itself"
        )
    progress(
        f"fetching Go {GO_VERSION} as a module (the installed go is {_version_of(installed) or 'unknown'})"
    )
    fetch_toolchain(installed, toolchain)
    return str(local)


def fetch_toolchain(go: str, toolchain: Path = TOOLCHAIN_DIR) -> None:
    """Download golang.org/toolchain at GO_VERSION for this machine through the module proxy with
    `go` (which verifies it against the checksum database) and unpack it into `toolchain`."""
    machine = {"x86_64": "amd64", "aarch64": "arm64"}.get(os.uname().machine, os.uname().machine)
    module = f"golang.org/toolchain@v0.0.1-go{GO_VERSION}.linux-{machine}"
    with tempfile.TemporaryDirectory(prefix="superkube-go.") as tmp:
        # a throwaway main module: an old go may not download outside one
        Path(tmp, "go.mod").write_text("module superkube.toolchain\n\ngo 1.19\n")
        env = {**os.environ, "GOTOOLCHAIN": "local", "GOFLAGS": "-mod=mod"}
        proc = subprocess.run(
            [go, "mod", "download", "-json", module], cwd=tmp, env=env, capture_output=True, text=True
        )
        try:
            info = json.loads(proc.stdout)
        except ValueError:
            info = {}
        if proc.returncode != 0 or info.get("Error") or not info.get("Zip") or not info.get("Sum"):
            why = info.get("Error") or (_cause(proc.stderr) if proc.stderr else "no answer")
            raise BuildError(f"fetching {module} through the module proxy failed: {why}")
        toolchain.parent.mkdir(parents=True, exist_ok=True)
        partial = Path(tempfile.mkdtemp(prefix=f".{toolchain.name}.", dir=toolchain.parent))
        try:
            prefix = module + "/"
            with zipfile.ZipFile(info["Zip"]) as archive:
                for member in archive.infolist():
                    if not member.filename.startswith(prefix) or member.is_dir():
                        continue
                    target = partial / member.filename.removeprefix(prefix)
                    target.parent.mkdir(parents=True, exist_ok=True)
                    with archive.open(member) as source, target.open("wb") as sink:
                        shutil.copyfileobj(source, sink)
                    target.chmod(0o755 if (member.external_attr >> 16) & 0o111 else 0o644)
            if _version_of(str(partial / "bin" / "go")) != GO_VERSION:
                raise BuildError(f"{module}: the unpacked toolchain does not say it is Go {GO_VERSION}")
            shutil.rmtree(toolchain, ignore_errors=True)
            partial.rename(toolchain)
        finally:
            shutil.rmtree(partial, ignore_errors=True)


def go_env(go: str) -> dict[str, str]:
    """The environment a build runs go in: the pinned go first on PATH, never a go it downloads itself."""
    return {
        **os.environ,
        "PATH": f"{Path(go).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "GOTOOLCHAIN": "local",
    }


@dataclass
class Built:
    component: Component
    path: Path
    """the cache entry: bin/, manifest.json, go.mod, go.sum, build.log"""
    manifest: dict[str, Any]
    cached: bool
    seconds: float

    def binary(self, name: str) -> Path:
        return self.path / "bin" / name


def entry(component: Component, go: str, cache_dir: Path = CACHE_DIR) -> Path:
    return cache_dir / component.name / component.version / f"go{go}"


def build_all(
    wanted: list[Component],
    progress: Progress = lambda component, what: None,
    cache_dir: Path = CACHE_DIR,
    jobs: int = 2,
) -> list[Built]:
    """Build each component (or find it in the cache), `jobs` at a time, in `wanted`'s order of
    priority; two components of one module never at once. Raises BuildError for the first that
    failed, once the builds under way have ended."""
    go = go_binary(lambda what: progress("go", what))
    pending = list(wanted)
    done: dict[str, Built] = {}
    failed: list[BaseException] = []
    busy: set[str] = set()  # modules being built now
    lock = threading.Condition()

    def worker() -> None:
        while True:
            with lock:
                while True:
                    if failed or not pending:
                        return
                    ready = next((c for c in pending if c.module not in busy), None)
                    if ready is not None:
                        break
                    lock.wait()
                pending.remove(ready)
                busy.add(ready.module)
            try:
                result = build(ready, go, progress, cache_dir)
            except BaseException as exc:
                with lock:
                    failed.append(exc)
                    busy.discard(ready.module)
                    lock.notify_all()
                return
            with lock:
                done[ready.name] = result
                busy.discard(ready.module)
                lock.notify_all()

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(max(1, min(jobs, len(wanted))))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if failed:
        raise failed[0]
    return [done[c.name] for c in wanted]


def build(component: Component, go: str, progress: Progress, cache_dir: Path = CACHE_DIR) -> Built:
    """One component into its cache entry (found there if built before); `go`: the pinned go's path."""
    started = time.monotonic()
    target = entry(component, GO_VERSION, cache_dir)
    found = _cached(target, component)
    if found is not None:
        progress(component.label, "cached")
        return Built(component, target, found, True, time.monotonic() - started)
    target.parent.mkdir(parents=True, exist_ok=True)
    with _locked(target.parent / f"go{GO_VERSION}.lock"):
        found = _cached(target, component)  # another run may have built it while we waited
        if found is not None:
            progress(component.label, "cached")
            return Built(component, target, found, True, time.monotonic() - started)
        if target.exists():
            shutil.rmtree(target)  # an entry whose binaries no longer match its manifest
        work = Path(tempfile.mkdtemp(prefix=f"go{GO_VERSION}.", dir=target.parent))
        work.chmod(0o755)  # mkdtemp makes it private; the entry is read by whoever runs the lab
        try:
            manifest = _build_into(component, go, work, progress)
            work.rename(target)
        except BaseException as exc:
            log = target.parent / f"go{GO_VERSION}.failed.log"
            with contextlib.suppress(OSError):
                shutil.copyfile(work / "build.log", log)
            shutil.rmtree(work, ignore_errors=True)
            if isinstance(exc, BuildError):
                raise BuildError(f"{exc} (full log: {log})") from None
            raise
    seconds = time.monotonic() - started
    progress(component.label, f"built in {seconds:.0f} s")
    return Built(component, target, manifest, False, seconds)


def _cached(target: Path, component: Component) -> dict[str, Any] | None:
    """The entry's manifest when every binary it lists is there with the sha256 it records, and it
    was built by this recipe with these version stamps."""
    try:
        manifest: dict[str, Any] = json.loads((target / MANIFEST).read_text())
    except (OSError, ValueError):
        return None
    if manifest.get("recipe") != RECIPE or manifest.get("ldflags", []) != list(component.ldflags):
        return None
    binaries = manifest.get("binaries") or {}
    if set(binaries) != set(component.binaries) or manifest.get("tags", []) != list(component.tags):
        return None  # built for another set of binaries, or with other build tags
    for name, recorded in binaries.items():
        path = target / "bin" / name
        if not path.is_file() or _sha256(path) != recorded.get("sha256"):
            return None
    return manifest if binaries else None


def _build_into(component: Component, go: str, work: Path, progress: Progress) -> dict[str, Any]:
    log = work / "build.log"
    env = {
        **go_env(go),
        "CGO_ENABLED": "1" if component.cgo else "0",
        "GOFLAGS": "-mod=mod -buildvcs=false",
        "GOWORK": "off",
    }

    def go_cmd(step: str, *args: str, check: bool = True) -> str:
        return _run(component, step, [go, *args], work, env, log, progress, check)

    minor = ".".join(GO_VERSION.split(".")[:2])
    (work / "go.mod").write_text(
        f"module superkube.build/{component.name}\n\ngo {minor}\n\n"
        f"require {component.module} {component.version}\n"
    )
    progress(component.label, "resolving modules")
    for module, version in component.also_require.items():
        go_cmd("resolving modules", "mod", "edit", f"-require={module}@{version}")
    upstream = _upstream(component, go_cmd) if component.replaces else {}
    replaces = _replaces(component, upstream) if component.replaces else {}
    substituted = _substitute_refused(replaces, go_cmd)
    if replaces:
        go_cmd(
            "resolving modules",
            "mod",
            "edit",
            *(f"-replace={old}={new}" for old, new in sorted(replaces.items())),
        )
    for package in sorted(set(component.binaries.values())):
        go_cmd("resolving modules", "mod", "edit", f"-tool={package}")
    go_cmd("resolving modules", "mod", "tidy")
    names = ", ".join(component.binaries)
    progress(component.label, f"compiling {names}")
    (work / "bin").mkdir()
    ldflags = " ".join(("-s", "-w", *component.ldflags))
    tags = [f"-tags={','.join(component.tags)}"] if component.tags else []
    for name, package in component.binaries.items():
        go_cmd(
            f"compiling {name}",
            "build",
            "-trimpath",
            *tags,
            f"-ldflags={ldflags}",
            "-o",
            f"bin/{name}",
            package,
        )
    compiled_in: dict[str, list[str]] = {}
    if upstream:  # one upstream module, whose tidy go.mod names every version its commands are built at
        pins = {r["Path"]: r["Version"] for r in upstream.get("Require") or []}
        pins.update({old.split("@")[0]: new.split("@")[1] for old, new in replaces.items()})
        for name in component.binaries:
            listing = go_cmd(f"reading {name}", "version", "-m", f"bin/{name}")
            compiled_in[name] = _check_modules(component, name, listing, pins, substituted)
    manifest = {
        "component": component.name,
        "module": component.module,
        "version": component.version,
        "go": GO_VERSION,
        "recipe": RECIPE,
        "ldflags": list(component.ldflags),
        "tags": list(component.tags),
        "built": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "binaries": {
            name: {
                "package": package,
                "sha256": _sha256(work / "bin" / name),
                "substitutes_compiled_in": compiled_in.get(name, []),
            }
            for name, package in component.binaries.items()
        },
        "substituted": substituted,
    }
    (work / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    return manifest


def _upstream(component: Component, go_cmd: Callable[..., str]) -> dict[str, Any]:
    """The component's own go.mod, as `go mod edit -json` reads it."""
    info = json.loads(
        go_cmd("resolving modules", "mod", "download", "-json", f"{component.module}@{component.version}")
    )
    doc: dict[str, Any] = json.loads(go_cmd("resolving modules", "mod", "edit", "-json", info["GoMod"]))
    return doc


def _replaces(component: Component, upstream: dict[str, Any]) -> dict[str, str]:
    """The replace directives the build module needs, read from the component's own go.mod.

    Every module upstream requires is pinned at upstream's version by a replace directive (a replace
    wins over minimum version selection, so a substitute below cannot pull anything else up), then
    upstream's own replace directives are repeated (they only apply in a main module).
    """
    release = "v0." + component.version.lstrip("v").split(".", 1)[1]
    requires = upstream.get("Require") or []
    if component.replaces == "staging" and not any(r["Version"] == "v0.0.0" for r in requires):
        raise BuildError(f"{component.label}: its go.mod requires no staging module at v0.0.0")
    out = {}
    for r in requires:
        # k8s.io/kubernetes v1.X.Y requires its staging modules at exactly v0.0.0: their releases are v0.X.Y
        staging = component.replaces == "staging" and r["Version"] == "v0.0.0"
        out[r["Path"]] = f"{r['Path']}@{release if staging else r['Version']}"
    for r in upstream.get("Replace") or []:
        new = r["New"]
        if not new.get("Version"):
            continue  # a local path: only meaningful inside the upstream repository
        old = r["Old"]["Path"] + (f"@{r['Old']['Version']}" if r["Old"].get("Version") else "")
        out[old] = f"{new['Path']}@{new['Version']}"
    return out


def _substitute_refused(replaces: dict[str, str], go_cmd: Callable[..., str]) -> dict[str, dict[str, str]]:
    """Replace targets the module proxy refuses, moved to the nearest patch release it serves.

    A proxy may not serve every version of every module (the one the project's machines reach does
    not serve some Kubernetes staging modules at some patch releases, or serves them without a
    checksum database record). Each target is downloaded and verified once here, which is the only
    probe that sees both. A refused version is swapped
    for the next patch release of the same minor (or, failing that, the closest earlier one) and
    recorded; `_check_modules` then holds every other module in the binary to upstream's pin.
    """
    wanted = sorted(set(replaces.values()))
    if not wanted:
        return {}
    refused = [
        doc["Path"] + "@" + doc["Version"]
        for doc in _json_stream(go_cmd("resolving modules", "mod", "download", "-json", *wanted, check=False))
        if doc.get("Error")
    ]
    substituted: dict[str, dict[str, str]] = {}
    for target in refused:
        path, pinned = target.split("@")
        served = _nearest_served(path, pinned, go_cmd)
        for old, new in list(replaces.items()):
            if new != target:
                continue
            if served is None:
                # no release of that minor at all: the replace is dropped; if the build needs the
                # module, `go mod tidy` fails naming it, and the build stops there
                del replaces[old]
            else:
                replaces[old] = f"{path}@{served}"
        why = "the module proxy refused the pinned version"
        if served is None:
            why += " and serves no other patch release of its minor: replace dropped (the build needs no package of it)"
        substituted[path] = {"pinned": pinned, "built": served or "", "why": why}
    return substituted


def _nearest_served(path: str, pinned: str, go_cmd: Callable[..., str]) -> str | None:
    major_minor, patch = pinned.rsplit(".", 1)
    listed = go_cmd("resolving modules", "list", "-m", "-versions", path, check=False).split()[1:]
    same_minor = [v for v in listed if v.startswith(major_minor + ".") and v.rsplit(".", 1)[1].isdigit()]
    later = sorted((v for v in same_minor if int(v.rsplit(".", 1)[1]) > int(patch)), key=_patch)
    earlier = sorted(
        (v for v in same_minor if int(v.rsplit(".", 1)[1]) < int(patch)), key=_patch, reverse=True
    )
    for candidate in later + earlier:  # the proxy's list is not a promise: try each
        docs = _json_stream(
            go_cmd("resolving modules", "mod", "download", "-json", f"{path}@{candidate}", check=False)
        )
        if docs and not docs[0].get("Error"):
            return candidate
    return None


def _patch(version: str) -> int:
    return int(version.rsplit(".", 1)[1])


def _json_stream(text: str) -> list[dict[str, Any]]:
    """`go ... -json` prints one JSON object after another, not a list."""
    decoder, docs, at = json.JSONDecoder(), [], 0
    while at < len(text):
        while at < len(text) and text[at].isspace():
            at += 1
        if at == len(text):
            break
        doc, at = decoder.raw_decode(text, at)
        docs.append(doc)
    return docs


def _check_modules(
    component: Component,
    binary: str,
    listing: str,
    pins: dict[str, str],
    substituted: dict[str, dict[str, str]],
) -> list[str]:
    """Every module compiled into the binary is at the version upstream's go.mod pins (through its
    replace directives), but for the substitutes recorded: nothing else moved. Returns the
    substitutes that are compiled in (the others only completed the module graph)."""
    built: dict[str, str] = {}
    last = ""
    for line in listing.splitlines():
        fields = line.split()
        if len(fields) >= 3 and fields[0] == "dep":
            last = fields[1]
            built[last] = fields[2]
        elif len(fields) >= 3 and fields[0] == "=>" and last:
            built[last] = fields[2]  # the replacement is what was compiled
    if not built:
        raise BuildError(f"{component.label}: go version -m lists no modules in {binary}")
    for path, version in sorted(built.items()):
        want = (substituted[path]["built"] or None) if path in substituted else pins.get(path)
        if want is not None and version != want:
            raise BuildError(f"{component.label}: {binary} has {path} {version}, upstream pins {want}")
    return [f"{path} {built[path]}" for path in sorted(substituted) if path in built]


def _run(
    component: Component,
    step: str,
    argv: list[str],
    cwd: Path,
    env: Mapping[str, str],
    log: Path,
    progress: Progress,
    check: bool = True,
) -> str:
    """Run one go command, its output appended to the log; a heartbeat while it runs long."""
    with log.open("a") as sink:
        sink.write(f"$ {' '.join(argv)}\n")
        sink.flush()
        started = time.monotonic()
        stop = threading.Event()

        def heartbeat() -> None:
            while not stop.wait(HEARTBEAT_S):
                progress(component.label, f"{step}, {time.monotonic() - started:.0f} s")

        beat = threading.Thread(target=heartbeat, daemon=True)
        beat.start()
        try:
            proc = subprocess.run(argv, cwd=cwd, env=dict(env), capture_output=True, text=True)
        finally:
            stop.set()
            beat.join()
        sink.write(proc.stdout + proc.stderr)
    if check and proc.returncode != 0:
        raise BuildError(f"{component.label}: {step} failed: {_cause(proc.stderr)}")
    return proc.stdout


def _cause(stderr: str) -> str:
    """The line of go's output that says what went wrong (its first error, not the last noise)."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    for line in lines:
        if re.search(r"error|not found|unknown revision|invalid|cannot|no matching", line, re.IGNORECASE):
            return line
    return lines[-1] if lines else "go exited with an error and printed nothing"


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()
