"""The lab's processes on this machine: every booted host and every client of the lab's files, found
whether or not a state file knows them, and ended.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from superkube.lab.state import PREFIX, STATE_DIR, run


def alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/cmdline").read_bytes().startswith(b"systemd-nspawn")


def terminate(pid: int | None, grace: float = 30) -> None:
    terminate_all([pid], grace)


def terminate_all(pids: Iterable[int | None], grace: float = 30) -> None:
    """Power hosts off together (a node's runtime takes a while to stop its pods): SIGTERM to each,
    which nspawn turns into a power-off of the container's systemd, then SIGKILL to what is left
    after `grace`."""
    left = [pid for pid in pids if pid is not None and alive(pid)]
    for pid in left:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    end = time.monotonic() + grace
    while time.monotonic() < end and any(alive(pid) for pid in left):
        time.sleep(0.2)
    stuck = [pid for pid in left if alive(pid)]
    for pid in stuck:
        # The container's init first: killing it ends every process of its PID namespace (a halt
        # stuck on an unmount included), and nspawn then exits and lets go of the host's root.
        for child in children(pid):
            with contextlib.suppress(ProcessLookupError):  # it may end between the check and the kill
                os.kill(child, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    end = time.monotonic() + 10
    while time.monotonic() < end and any(alive(pid) for pid in stuck):
        time.sleep(0.2)


def children(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def leftovers() -> list[str]:
    found = [f"netns {name}" for name in lab_namespaces()]
    for line in Path("/proc/mounts").read_text().splitlines():
        target = line.split()[1]
        if target.startswith(str(STATE_DIR)):
            found.append(f"mount {target}")
    found += [f"process {pid}" for pid in lab_processes() + lab_clients(STATE_DIR)]
    return found


def stat(pid: int) -> list[str]:
    """Fields of /proc/<pid>/stat after the command name: [state, ppid, ...]; [] once it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return []


def running(pid: int) -> bool:
    """Whether pid still runs (an exited child nobody has reaped yet does not)."""
    fields = stat(pid)
    return bool(fields) and fields[0] != "Z"


def wait_gone(pids: Iterable[int], timeout: float = 10) -> None:
    end = time.monotonic() + timeout
    pending = set(pids)
    while pending and time.monotonic() < end:
        pending = {pid for pid in pending if running(pid)}
        if pending:
            time.sleep(0.05)


def end(pids: list[int], sig: signal.Signals, label: str, removed: list[str]) -> None:
    """Signal every pid, note it in `removed`, and wait until they have exited."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)
        removed.append(f"process {pid} {label}".rstrip())
    wait_gone(pids)


def lab_namespaces() -> list[str]:
    lines = run(["ip", "netns", "list"], check=False).stdout.splitlines()
    return [line.split()[0] for line in lines if line.startswith(f"{PREFIX}-")]


def namespace_pids(name: str) -> list[int]:
    return [int(p) for p in run(["ip", "netns", "pids", name], check=False).stdout.split() if p.isdigit()]


def cmdlines() -> Iterator[tuple[int, bytes]]:
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                yield int(entry), Path(f"/proc/{entry}/cmdline").read_bytes()
            except OSError:
                continue


def lab_processes() -> list[int]:
    """PIDs of every systemd-nspawn running a lab host, whether or not a state file knows them."""
    machine = f"--machine={PREFIX}-".encode()
    return [pid for pid, cmd in cmdlines() if cmd.startswith(b"systemd-nspawn") and machine in cmd]


def lab_clients(state_dir: Path) -> list[int]:
    """PIDs of processes that use the lab's files: above all SSH masters whose control sockets
    live in the state dir and would outlive it (ControlPersist). Never this process or its parents."""
    ours = set()
    pid = os.getpid()
    while pid > 1 and pid not in ours:
        ours.add(pid)
        fields = stat(pid)
        pid = int(fields[1]) if len(fields) > 1 else 0
    needle = str(state_dir).encode() + b"/"
    return [
        pid
        for pid, cmd in cmdlines()
        if pid not in ours and needle in cmd and not cmd.startswith(b"systemd-nspawn")
    ]


def gone_already(function: Any, path: str, exc_info: Any) -> None:
    """rmtree's error hook: a file another `lab down` (an interrupted run's cleanup) removed first
    is what this one wanted; anything else is raised."""
    if not isinstance(exc_info[1], FileNotFoundError):
        raise exc_info[1]
