"""The lab's base image, a debootstrapped Debian 12 root every host boots over (cached), and what
`lab up` puts beside it: the pinned components' builds and the node images.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

from superkube.harness import build
from superkube.lab.errors import LabError
from superkube.lab.state import Progress

CACHE_DIR = Path(os.environ.get("SUPERKUBE_LAB_CACHE", "/var/cache/superkube/lab"))


SUITE = "bookworm"


# Baked into the image as production bakes them into the VM image: the lab's hosts have no route
# to a package mirror, so roles find these installed and their install tasks report ok.
BASE_PACKAGES = (
    "systemd",
    "systemd-sysv",
    "dbus",
    "openssh-server",
    "python3",
    "python3-apt",
    "python3-prometheus-client",
    "python3-yaml",  # the join-token publisher's (production's join_tokens role installs it)
    "iproute2",
    "iptables",
    "procps",
    "sudo",
    "ca-certificates",
    "curl",
    "chrony",
    "prometheus-node-exporter",
    "netcat-openbsd",
    # the standard CNI plugins (production installs the same release, pinned by checksum) and
    # iperf3 for the pod network's throughput tests
    "containernetworking-plugins",
    "iperf3",
    # the monitoring role's Prometheus and VictoriaMetrics (their own services stay off)
    "prometheus",
    "victoria-metrics",
)


IMAGE_RECIPE = 6  # bump when the image steps below change


def debian_mirror() -> str:
    """The Debian mirror this machine's apt uses (SUPERKUBE_LAB_MIRROR overrides it)."""
    if os.environ.get("SUPERKUBE_LAB_MIRROR"):
        return os.environ["SUPERKUBE_LAB_MIRROR"]
    candidates: list[str] = []
    for path in sorted(Path("/etc/apt/sources.list.d").glob("*.sources")):
        block: dict[str, str] = {}
        for line in [*path.read_text().splitlines(), ""]:
            if not line.strip():
                if "debian" in block.get("Suites", "") or SUITE in block.get("Suites", "").split():
                    candidates += block.get("URIs", "").split()
                block = {}
            elif ":" in line and not line.startswith("#"):
                k, _, v = line.partition(":")
                block[k.strip()] = v.strip()
    sources = Path("/etc/apt/sources.list")
    if sources.is_file():
        for line in sources.read_text().splitlines():
            parts = line.split()
            if len(parts) >= 3 and parts[0] == "deb" and parts[2] == SUITE:
                candidates.append(parts[1])
    for uri in candidates:
        if "security" not in uri:
            return uri
    raise LabError("no Debian mirror found in /etc/apt; set SUPERKUBE_LAB_MIRROR to one")


def image_key() -> str:
    digest = hashlib.sha256(json.dumps([SUITE, sorted(BASE_PACKAGES), IMAGE_RECIPE]).encode()).hexdigest()
    return f"{SUITE}-{digest[:12]}"


def build_base_image(progress: Progress, cache_dir: Path = CACHE_DIR) -> Path:
    """debootstrap the base image once; later labs reuse it from the cache."""
    return debootstrap(image_key(), BASE_PACKAGES, _finish_base, progress, cache_dir, "base image")


def debootstrap(
    key: str,
    packages: tuple[str, ...],
    finish: Callable[[Path], None],
    progress: Progress,
    cache_dir: Path = CACHE_DIR,
    what: str = "image",
) -> Path:
    """A minimal Debian root with `packages` (their dependencies too), `finish`ed, cached as `key`:
    built in a sibling folder and renamed into place, so an interrupted build never looks done."""
    final = cache_dir / key
    if (final / ".superkube-complete").is_file():
        progress(f"{what} cached", 1.0)
        return final / "rootfs"
    cache_dir.mkdir(parents=True, exist_ok=True)
    tmp = cache_dir / f".{key}.building"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    progress("debootstrap: fetching Debian packages", 0.05)
    cmd = [
        "debootstrap",
        "--variant=minbase",
        f"--include={','.join(packages)}",
        SUITE,
        str(tmp / "rootfs"),
        debian_mirror(),
    ]
    # `with` closes the pipe: an open one left to the garbage collector is a ResourceWarning, which
    # the tests treat as an error (seen only when the image is built, i.e. on a fresh machine)
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as proc:
        assert proc.stdout is not None
        for seen, line in enumerate(proc.stdout, 1):
            if line.startswith("I: "):
                progress(f"debootstrap: {line[3:].strip()[:60]}", min(0.9, 0.05 + seen / 1500))
    if proc.returncode != 0:
        shutil.rmtree(tmp, ignore_errors=True)
        raise LabError("debootstrap failed; check the mirror (SUPERKUBE_LAB_MIRROR) and free disk space")
    finish(tmp / "rootfs")
    (tmp / ".superkube-complete").write_text(json.dumps({"packages": sorted(packages), "key": key}))
    os.replace(tmp, final)
    progress(f"{what} built", 1.0)
    return final / "rootfs"


def _finish_base(root: Path) -> None:
    for key in (root / "etc" / "ssh").glob("ssh_host_*"):
        key.unlink()  # every host gets its own host keys
    (root / "etc" / "machine-id").write_text("")
    (root / "etc" / "ssh" / "sshd_config.d").mkdir(parents=True, exist_ok=True)
    (root / "etc" / "ssh" / "sshd_config.d" / "superkube-lab.conf").write_text(
        "PermitRootLogin prohibit-password\nPasswordAuthentication no\nUseDNS no\n"
    )
    # The hosts have no route to a mirror; keep apt from trying at boot.
    for unit in ("apt-daily.timer", "apt-daily-upgrade.timer"):
        link = root / "etc" / "systemd" / "system" / "timers.target.wants" / unit
        link.unlink(missing_ok=True)
    # Baked in, not running: the packaged Prometheus and VictoriaMetrics; the monitoring role runs
    # its own units.
    for unit in ("prometheus.service", "victoria-metrics.service"):
        (root / "etc" / "systemd" / "system" / "multi-user.target.wants" / unit).unlink(missing_ok=True)


def lab_images(
    base_root: Path, progress: Callable[[str], None] = lambda what: None
) -> dict[str, dict[str, str]]:
    """The images the lab's nodes import, built here and cached beside the components' builds.
    From the project's own sources: the sandbox, netload, the lab's device plugin, the agents' image
    (on the lab's base image `base_root`); the trainer image the lab's example MPI jobs run (on a
    Debian root of its own) is superkube.lab.trainer_image's. From the pinned components' builds (built first where missing): cluster
    DNS and the gang controllers. The agents', cluster DNS's and the controllers' are imported under
    the names the layer pins, so the layer's pods start on the lab's nodes as from a registry."""
    from superkube.lab import agents_image, images

    pinned = images.pinned_images()
    try:
        built = [images.pause(), images.netload(), images.lab_device_plugin(), agents_image.agents(base_root)]
        results = build.build_all(
            [c for c in build.components() if c.name in build.IMAGE_COMPONENTS],
            lambda component, what: progress(f"{component}: {what}"),
        )
        binaries = {b.component.name: b for b in results}
        for p in pinned:
            progress(f"image {p.ref}")
            built.append(images.component_image(p, binaries[p.component].binary(p.binary)))
        return {image.name: image.as_fact() for image in built}
    except build.BuildError as exc:
        raise LabError(f"lab up needs its node images: {exc}") from None


def built_binaries(progress: Callable[[str], None]) -> dict[str, dict[str, str]]:
    """The pinned components from the build cache (built first where missing: minutes, once)."""
    try:
        results = build.build_all(
            [c for c in build.components() if c.name in build.HOST_COMPONENTS],
            lambda component, what: progress(f"{component}: {what}"),
        )
    except build.BuildError as exc:
        raise LabError(f"lab up needs the pinned components: {exc}") from None
    return {
        name: {"path": str(b.binary(name)), "sha256": info["sha256"], "version": b.component.version}
        for b in results
        for name, info in sorted(b.manifest["binaries"].items())
    }
