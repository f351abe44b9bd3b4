"""Passive host checks on every node, beside the GPU probe: filesystems, the kubelet and the container
runtime, and the network. Each check gives findings with the GPU probe's levels (fatal: the node
should not run jobs; warning: a person should look).

- Filesystems (`--filesystem NAME=PATH`, each a directory the layer mounts read-only from the host,
  empty, on the filesystem to watch): full past `--full-warning`/`--full-fatal` (blocks or inodes),
  and remounted read-only (the filesystem's own options in the mount table, not those of the agent's
  read-only view of it). An unreadable path is a warning with its reason, never a cordon.
- The kernel log (`--kernel-log`, kernel messages only, which the node's rsyslog writes to a file
  of their own; read-only): block-device and filesystem I/O errors logged since the agent started
  (the file is followed from its end: errors from before a reboot or a replaced disk are history,
  never a cordon; a file that appears later is read from its start). Each is a fatal finding for
  an hour after it was seen. No file (no rsyslog) is no finding; one the agent may not read is a
  warning.
- The kubelet answering its health endpoint (`--kubelet-healthz`, on the node's loopback) and the
  container runtime answering its metrics endpoint (`--runtime-metrics`, containerd's, loopback).
- Network reachability: a TCP connection to the API servers' address (`--api-address HOST:PORT`,
  the load balancer's, as the kubelet uses it) and a default route in the node's table
  (/proc/net/route; the agent runs on the host network).

A check that talks to something (the kubelet, the runtime, the API servers, the route) is fatal
only after `--confirm-rounds` rounds in a row failed: one lost connection is a blip, not a verdict;
the rounds before that are warnings that say how many.
"""

from __future__ import annotations

import os
import re
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from superkube.agents.gpu_probe import Finding

FULL_WARNING = 0.90
FULL_FATAL = 0.97
IO_ERROR_HOLD_S = 3600.0
CONFIRM_ROUNDS = 3
ANSWER_TIMEOUT_S = 3.0
# what the kernel logs when a block device or a filesystem fails (SCSI/NVMe/virtio block layer,
# buffer cache, ext4, XFS, btrfs); one line is enough
IO_ERROR = re.compile(
    r"(?:blk_update_request|critical (?:medium|target) error|I/O error, dev (?P<dev>[\w.-]+)"
    r"|Buffer I/O error on dev(?:ice)? (?P<buf>[\w.-]+)|EXT4-fs error \(device (?P<ext4>[\w.-]+)\)"
    r"|XFS \((?P<xfs>[\w.-]+)\): .*(?:I/O error|metadata I/O)|BTRFS error \(device (?P<btrfs>[\w.-]+)\))"
)
MOUNT_ESCAPE = re.compile(r"\\([0-7]{3})")

# the checks by name, as metrics and findings call them
CHECKS = ("filesystem", "kernel-io", "kubelet", "runtime", "api-servers", "default-route")


def _unescape(field_: str) -> str:
    return MOUNT_ESCAPE.sub(lambda m: chr(int(m.group(1), 8)), field_)


def super_options(mountinfo: str, path: str) -> set[str] | None:
    """The filesystem's own options (mountinfo's last field) of the mount at `path`, the last one
    mounted there; None when nothing is mounted exactly there."""
    found = None
    for line in mountinfo.splitlines():
        fields = line.split(" ")
        if len(fields) < 10 or "-" not in fields[6:]:
            continue
        sep = fields.index("-", 6)
        if _unescape(fields[4]) == path and len(fields) > sep + 3:
            found = set(fields[sep + 3].split(","))
    return found


def filesystem(
    name: str,
    path: str,
    mountinfo: str | None,
    full_warning: float = FULL_WARNING,
    full_fatal: float = FULL_FATAL,
    statvfs: Callable[[str], os.statvfs_result] = os.statvfs,
) -> list[Finding]:
    """Findings for the filesystem under `path`: full (blocks or inodes) and read-only."""
    try:
        st = statvfs(path)
    except OSError as e:
        return [Finding("warning", None, f"{name} filesystem ({path}) unreadable: {e.strerror or e}")]
    out: list[Finding] = []
    options = super_options(mountinfo, path) if mountinfo is not None else None
    if options is not None and "ro" in options:
        out.append(Finding("fatal", None, f"{name} filesystem remounted read-only"))
    for what, total, free in (("space", st.f_blocks, st.f_bavail), ("inodes", st.f_files, st.f_favail)):
        if total <= 0:
            continue  # a filesystem without a fixed count (inodes on some)
        used = 1 - free / total
        level = "fatal" if used >= full_fatal else "warning" if used >= full_warning else None
        if level:
            out.append(Finding(level, None, f"{name} filesystem {used:.0%} full ({what})"))
    return out


@dataclass
class KernelLog:
    """The host's kernel log, followed from where it ended when the agent started (a rotated or
    truncated file is read again from its start)."""

    path: Path
    hold_s: float = IO_ERROR_HOLD_S
    clock: Callable[[], float] = time.monotonic
    inode: int | None = None
    offset: int = 0
    partial: bytes = b""
    seen: dict[str, float] = field(default_factory=dict)  # device -> when its last error was seen
    counted: dict[str, int] = field(default_factory=dict)  # device -> errors seen since start
    started: bool = False

    def read(self) -> list[Finding]:
        try:
            self._follow()
        except FileNotFoundError:  # not written yet (no kernel message since rotation; no rsyslog)
            self.started, self.inode, self.offset, self.partial = True, None, 0, b""
        except OSError as e:
            return [Finding("warning", None, f"kernel log ({self.path}) unreadable: {e.strerror or e}")]
        now = self.clock()
        return [
            Finding("fatal", None, f"I/O errors on {dev} in the kernel log")
            for dev, at in sorted(self.seen.items())
            if now - at < self.hold_s
        ]

    def _follow(self) -> None:
        with self.path.open("rb") as f:
            st = os.fstat(f.fileno())
            if not self.started:
                self.started, self.inode, self.offset = True, st.st_ino, st.st_size
                return
            if st.st_ino != self.inode or st.st_size < self.offset:  # rotated or truncated
                self.inode, self.offset, self.partial = st.st_ino, 0, b""
            f.seek(self.offset)
            data = f.read(4 << 20)  # at most 4 MiB a round: a flood of lines waits for the next
            self.offset += len(data)
        lines = (self.partial + data).split(b"\n")
        self.partial = lines.pop()[-4096:]
        now = self.clock()
        for raw in lines:
            m = IO_ERROR.search(raw.decode("utf-8", "replace"))
            if m:
                dev = next((v for v in m.groupdict().values() if v), "a block device")
                self.seen[dev] = now
                self.counted[dev] = self.counted.get(dev, 0) + 1


def answers_http(url: str, timeout: float = ANSWER_TIMEOUT_S) -> str | None:
    """None when `url` answers 200; else why not."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return None if r.status == 200 else f"answered HTTP {r.status}"
    except OSError as e:
        return _why(e)


def answers_tcp(address: str, timeout: float = ANSWER_TIMEOUT_S) -> str | None:
    """None when a TCP connection to HOST:PORT opens; else why not."""
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout):
            return None
    except OSError as e:
        return _why(e)


def _why(e: OSError) -> str:
    reason = getattr(e, "reason", None)
    if isinstance(reason, (OSError, str)):
        e = reason if isinstance(reason, OSError) else OSError(reason)
    if isinstance(e, TimeoutError | socket.timeout):
        return "no answer (timed out)"
    return str(e.strerror or e.args[0] if e.args else e)


def default_route(table: str) -> str | None:
    """None when /proc/net/route's text has a default route that is up; else why not."""
    for line in table.splitlines()[1:]:
        fields = line.split()
        # Iface Destination Gateway Flags RefCnt Use Metric Mask ...: 0.0.0.0/0, up (RTF_UP)
        if len(fields) >= 8 and fields[1] == fields[7] == "00000000" and int(fields[3], 16) & 0x1:
            return None
    return "no default route"


@dataclass
class Reachability:
    """A check that talks to something, fatal only after `confirm` failed rounds in a row."""

    name: str
    what: str
    probe: Callable[[], str | None]
    confirm: int = CONFIRM_ROUNDS
    failed: int = 0

    def read(self) -> list[Finding]:
        why = self.probe()
        if why is None:
            self.failed = 0
            return []
        self.failed += 1
        if self.failed >= self.confirm:
            return [Finding("fatal", None, f"{self.what}: {why}")]
        return [Finding("warning", None, f"{self.what}: {why} ({self.failed} of {self.confirm} rounds)")]


@dataclass
class HostChecks:
    """Every host check of one node; `read()` gives this round's findings, by check."""

    filesystems: Sequence[tuple[str, str]] = ()
    kernel_log: KernelLog | None = None
    reachability: Sequence[Reachability] = ()
    mountinfo: Path = Path("/proc/self/mountinfo")
    full_warning: float = FULL_WARNING
    full_fatal: float = FULL_FATAL

    def read(self) -> dict[str, list[Finding]]:
        try:
            table: str | None = self.mountinfo.read_text()
        except OSError:
            table = None  # without the mount table only fullness is judged
        out: dict[str, list[Finding]] = {"filesystem": []}
        for name, path in self.filesystems:
            out["filesystem"] += filesystem(name, path, table, self.full_warning, self.full_fatal)
        if self.kernel_log is not None:
            out["kernel-io"] = self.kernel_log.read()
        for check in self.reachability:
            out[check.name] = check.read()
        return out


def parse_filesystems(items: Iterable[str]) -> list[tuple[str, str]]:
    """NAME=PATH items; ValueError names the bad one."""
    out = []
    for item in items:
        name, sep, path = item.partition("=")
        if not sep or not name or not path.startswith("/"):
            raise ValueError(f"--filesystem {item!r}: give NAME=/absolute/path, e.g. root=/host/root")
        out.append((name, path))
    return out


def build(
    filesystems: Iterable[str] = (),
    kernel_log: Path | None = None,
    kubelet_healthz: str = "",
    runtime_metrics: str = "",
    api_address: str = "",
    route_table: Path | None = Path("/proc/net/route"),
    confirm: int = CONFIRM_ROUNDS,
    full_warning: float = FULL_WARNING,
    full_fatal: float = FULL_FATAL,
) -> HostChecks:
    """The checks the flags ask for (an empty flag leaves its check out)."""
    checks = []
    if kubelet_healthz:
        checks.append(
            Reachability("kubelet", "kubelet not answering", lambda: answers_http(kubelet_healthz), confirm)
        )
    if runtime_metrics:
        checks.append(
            Reachability(
                "runtime", "container runtime not answering", lambda: answers_http(runtime_metrics), confirm
            )
        )
    if api_address:
        checks.append(
            Reachability(
                "api-servers",
                f"API servers unreachable at {api_address}",
                lambda: answers_tcp(api_address),
                confirm,
            )
        )
    if route_table is not None:
        table = route_table

        def route() -> str | None:
            try:
                return default_route(table.read_text())
            except OSError as e:
                return f"route table unreadable: {e.strerror or e}"

        checks.append(Reachability("default-route", "network", route, confirm))
    return HostChecks(
        filesystems=parse_filesystems(filesystems),
        kernel_log=KernelLog(kernel_log) if kernel_log else None,
        reachability=checks,
        full_warning=full_warning,
        full_fatal=full_fatal,
    )
