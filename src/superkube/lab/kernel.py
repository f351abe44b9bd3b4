"""What the lab asks of this machine's kernel, set by `lab up` and put back by `lab down`: inotify
instances for many booted hosts, and the kernel tunables a kubelet requires.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

# Every booted host's systemd, journald, logind and friends hold inotify instances, all counted
# against root on this machine: at the kernel's default of 128, a lab of 16 hosts runs out, and a
# host booted again after a stop comes up degraded (a path unit fails to watch its directory).
INOTIFY_INSTANCES_PER_HOST = 32


INOTIFY_PROC = Path("/proc/sys/fs/inotify/max_user_instances")


def ensure_inotify_instances(hosts: int, proc: Path = INOTIFY_PROC) -> None:
    """Raise the machine's inotify instance limit to what `hosts` booted hosts need (never lower it)."""
    want = 256 + INOTIFY_INSTANCES_PER_HOST * hosts
    if int(proc.read_text()) < want:
        proc.write_text(f"{want}\n")


# What the kubelet requires of the kernel and sets when it differs (its ContainerManager's kernel
# tunables, v1.35). A lab node is a container on this machine's kernel, whose /proc/sys it may not
# write: `lab up` sets them for its kubelets and `lab down` puts back what this machine had.
KUBELET_KERNEL_TUNABLES = {
    "vm/overcommit_memory": 1,
    "vm/panic_on_oom": 0,
    "kernel/panic": 10,
    "kernel/panic_on_oops": 1,
    "kernel/keys/root_maxkeys": 1_000_000,
    "kernel/keys/root_maxbytes": 25_000_000,
}


KERNEL_SAVED = "kernel-tunables.json"  # in the lab's state directory: what lab down restores


def set_kernel_for_kubelets(state_dir: Path, sysctl: Path = Path("/proc/sys")) -> None:
    """Give the machine's kernel the kubelet's tunables, first saving the values they replace."""
    saved = state_dir / KERNEL_SAVED
    before = json.loads(saved.read_text()) if saved.exists() else {}
    for key, value in KUBELET_KERNEL_TUNABLES.items():
        current = int((sysctl / key).read_text())
        if current != value:
            before.setdefault(key, current)
            saved.write_text(json.dumps(before))  # saved before the change: down restores even a half-done up
            (sysctl / key).write_text(f"{value}\n")


def restore_kernel(state_dir: Path, removed: list[str], sysctl: Path = Path("/proc/sys")) -> None:
    saved = state_dir / KERNEL_SAVED
    if not saved.exists():
        return
    for key, value in json.loads(saved.read_text()).items():
        with contextlib.suppress(OSError):
            (sysctl / key).write_text(f"{value}\n")
            removed.append(f"kernel {key.replace('/', '.')}={value} restored")
    saved.unlink()
