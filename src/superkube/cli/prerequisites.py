"""What each way of using superkube needs on the machine, and what of it is missing: one line each.

Three paths, each needing the one before it: offline (plan, check, render: Python and a virtualenv),
the lab (root, Debian 12 and the packages the lab's hosts are made of) and Azure (the Pulumi CLI with
a backend and a secrets passphrase or provider, an Azure login, Ansible and ssh). Only the standard
library is used, so `make doctor` runs this file with the system's python3 before anything is
installed; `superkube doctor` runs the same checks once it is.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

PATHS = ("offline", "lab", "azure")
ROOT = Path(__file__).resolve().parents[3]
PYTHON = (3, 11)
PULUMI_CLI = "3.272.0"
"""The Pulumi CLI the program is meant for: the release of the pulumi SDK that constraints.txt pins."""
GO = "1.21"
"""The oldest Go that fetches the pinned toolchain by itself (harness/build.py says which)."""
LAB_DISK_GIB = 10
"""Free space the lab's build cache, its host images and the hosts' disks take (about 2.5 GiB of
builds, 1 GiB per image, the rest the hosts' writes during the suite)."""
APT = "apt-get install"


@dataclass(frozen=True)
class Finding:
    path: str
    what: str
    ok: bool
    says: str
    """when ok, what was found; else how to get it"""

    def line(self) -> str:
        return f"{'ok' if self.ok else 'missing':7} {self.path:7} {self.what}: {self.says}"


def _command(name: str, package: str, path: str, why: str = "") -> Finding:
    found = shutil.which(name)
    if found:
        return Finding(path, name, True, found)
    return Finding(path, name, False, f"{APT} {package} (or as root: make debian-deps){why}")


def _version(argv: list[str]) -> str:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return (done.stdout or done.stderr).strip().splitlines()[0] if done.returncode == 0 else ""


def _tuple(version: str) -> tuple[int, ...]:
    digits = version.strip().lstrip("vgo").split("-")[0].split(" ")[0]
    return tuple(int(p) for p in digits.split(".") if p.isdigit())


def offline() -> list[Finding]:
    have = sys.version_info[:2]
    found = [
        Finding(
            "offline",
            "python",
            have >= PYTHON,
            f"{platform.python_version()}"
            if have >= PYTHON
            else f"{platform.python_version()} is too old; install Python 3.11 or newer (Debian 12's python3)",
        )
    ]
    try:
        import ensurepip  # noqa: F401  (what `python3 -m venv` needs, and stock Debian leaves out)

        found.append(Finding("offline", "python3-venv", True, "venv can install pip"))
    except ImportError:
        found.append(Finding("offline", "python3-venv", False, f"{APT} python3-venv"))
    found.append(_command("make", "make", "offline"))
    superkube = ROOT / ".venv" / "bin" / "superkube"
    found.append(
        Finding("offline", "superkube", True, str(superkube))
        if superkube.exists() or shutil.which("superkube")
        else Finding("offline", "superkube", False, "make install (installs it into .venv)")
    )
    return found


def _os_release() -> dict[str, str]:
    try:
        text = Path("/etc/os-release").read_text()
    except OSError:
        return {}
    pairs = (line.partition("=") for line in text.splitlines() if "=" in line)
    return {k: v.strip().strip('"') for k, _, v in pairs}


def lab() -> list[Finding]:
    release = _os_release()
    debian12 = release.get("ID") == "debian" and release.get("VERSION_ID") == "12"
    found = [
        Finding(
            "lab",
            "root",
            os.geteuid() == 0,
            "yes" if os.geteuid() == 0 else "the lab makes network namespaces and containers: run as root",
        ),
        Finding(
            "lab",
            "Debian 12",
            debian12,
            release.get("PRETTY_NAME", "no /etc/os-release")
            + ("" if debian12 else " (the lab's hosts are Debian 12, made with debootstrap: use Debian 12)"),
        ),
    ]
    for name, package in (
        ("debootstrap", "debootstrap"),
        ("systemd-nspawn", "systemd-container"),
        ("ip", "iproute2"),
        ("iptables", "iptables"),
        ("ssh", "openssh-client"),
        ("nc", "netcat-openbsd"),
        ("openssl", "openssl"),
        ("gcc", "gcc"),
        ("pkg-config", "pkg-config"),
        ("kubectl", "kubernetes-client"),
    ):
        found.append(_command(name, package, "lab"))
    cni = Path("/usr/lib/cni/bridge")
    found.append(
        Finding("lab", "CNI plugins", True, str(cni.parent))
        if cni.exists()
        else Finding("lab", "CNI plugins", False, f"{APT} containernetworking-plugins")
    )
    go = shutil.which("go")
    have = _version([go, "env", "GOVERSION"]) if go else ""
    if not go:
        found.append(Finding("lab", "go", False, f"{APT} golang-go, or Go {GO} or newer"))
    else:
        ok = _tuple(have) >= _tuple(GO)
        found.append(
            Finding(
                "lab",
                "go",
                ok,
                f"{have} (it fetches the pinned toolchain itself)"
                if ok
                else f"{have} is older than {GO}, which fetches the pinned toolchain; install Go {GO} or newer",
            )
        )
    for tool in ("prometheus", "promtool", "haproxy"):
        at = ROOT / ".tools" / "bin" / tool
        found.append(
            Finding("lab", tool, True, str(at))
            if at.exists()
            else Finding("lab", tool, False, "as root: make debian-deps (unpacks it into .tools/bin)")
        )
    cache = Path("/var/cache")
    free = shutil.disk_usage(cache).free / 2**30 if cache.exists() else 0.0
    found.append(
        Finding(
            "lab",
            "disk",
            free >= LAB_DISK_GIB,
            f"{free:.0f} GiB free under {cache}"
            + ("" if free >= LAB_DISK_GIB else f"; the lab wants {LAB_DISK_GIB} GiB: free some space"),
        )
    )
    return found


def _pulumi_home() -> Path:
    return Path(os.environ.get("PULUMI_HOME") or Path.home() / ".pulumi")


def _pulumi_backend() -> str:
    if os.environ.get("PULUMI_BACKEND_URL"):
        return os.environ["PULUMI_BACKEND_URL"]
    try:
        credentials = json.loads((_pulumi_home() / "credentials.json").read_text())
    except (OSError, ValueError):
        return ""
    return str(credentials.get("current") or "") if isinstance(credentials, dict) else ""


def _azure_login() -> str:
    if os.environ.get("AZURE_ACCESS_TOKEN"):
        return "AZURE_ACCESS_TOKEN is set"
    profile = Path(os.environ.get("AZURE_CONFIG_DIR") or Path.home() / ".azure") / "azureProfile.json"
    try:
        data = json.loads(profile.read_text(encoding="utf-8-sig"))
    except (OSError, ValueError):
        return ""
    default = [s for s in data.get("subscriptions", []) if isinstance(s, dict) and s.get("isDefault")]
    return f"subscription {default[0].get('name', '?')}" if default else ""


def azure() -> list[Finding]:
    found = []
    pulumi = shutil.which("pulumi")
    if not pulumi:
        found.append(
            Finding(
                "azure",
                "pulumi",
                False,
                f"install the Pulumi CLI v{PULUMI_CLI} (docs/01-operating-on-azure.md, Before you start)",
            )
        )
    else:
        have = _version([pulumi, "version"])
        ok = _tuple(have)[:2] == _tuple(PULUMI_CLI)[:2]
        found.append(
            Finding(
                "azure",
                "pulumi",
                ok,
                have
                if ok
                else f"{have or 'unknown version'}; the program is meant for v{PULUMI_CLI}: install it",
            )
        )
    backend = _pulumi_backend()
    found.append(
        Finding("azure", "pulumi backend", True, backend)
        if backend
        else Finding(
            "azure",
            "pulumi backend",
            False,
            "pulumi login (Pulumi Cloud), or pulumi login azblob://<container> for state in your own storage",
        )
    )
    service = backend.startswith("https://")
    passphrase = any(os.environ.get(k) for k in ("PULUMI_CONFIG_PASSPHRASE", "PULUMI_CONFIG_PASSPHRASE_FILE"))
    found.append(
        Finding(
            "azure",
            "pulumi secrets",
            service or passphrase,
            "the backend's own secrets provider"
            if service
            else "a passphrase is set"
            if passphrase
            else "set PULUMI_CONFIG_PASSPHRASE(_FILE), or give pulumi stack init --secrets-provider azurekeyvault://...",
        )
    )
    az = shutil.which("az")
    found.append(
        Finding("azure", "az", True, az)
        if az
        else Finding(
            "azure", "az", False, "install the Azure CLI (docs/01-operating-on-azure.md, Before you start)"
        )
    )
    login = _azure_login()
    found.append(
        Finding("azure", "azure login", True, login)
        if login
        else Finding("azure", "azure login", False, "az login, then az account set --subscription <id>")
    )
    playbook = next(
        (
            str(p)
            for p in (
                Path(sys.executable).parent / "ansible-playbook",
                ROOT / ".venv" / "bin" / "ansible-playbook",
            )
            if p.exists()
        ),
        shutil.which("ansible-playbook"),
    )
    found.append(
        Finding("azure", "ansible-playbook", True, playbook)
        if playbook
        else Finding("azure", "ansible-playbook", False, "make install (installs Ansible into .venv)")
    )
    found.append(_command("ssh", "openssh-client", "azure"))
    return found


CHECKS = {"offline": offline, "lab": lab, "azure": azure}


def findings(paths: list[str]) -> list[Finding]:
    return [f for p in paths for f in CHECKS[p]()]


def main(argv: list[str]) -> int:
    wanted = argv or list(PATHS)
    unknown = [p for p in wanted if p not in PATHS]
    if unknown:
        print(
            f"error: {unknown[0]!r} is not a path; give offline, lab or azure (or none for all)",
            file=sys.stderr,
        )
        return 2
    found = findings(wanted)
    for f in found:
        print(f.line())
    missing = [f for f in found if not f.ok]
    print(f"{len(missing)} missing" + (f" ({', '.join(f.what for f in missing)})" if missing else ""))
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
