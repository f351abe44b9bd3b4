"""Passive host checks on every node, beside the GPU probe: filesystems, the kubelet and the container
runtime, and the network. Each check gives findings with the GPU probe's levels (fatal: the node
should not run jobs; warning: a person should look).

- Filesystems (`--filesystem NAME=PATH`, each a directory the layer mounts read-only from the host,
  empty, on the filesystem to watch): full past `--full-warning`/`--full-fatal` (blocks or inodes),
  and remounted read-only (the filesystem's own options in the mount table, not those of the agent's
  read-only view of it). An unreadable path is a warning with its reason, never a cordon. A path on
  the same filesystem (device) as one named before it is watched once, under the first name, and
  said in a log line: a node without a data disk has its data directory on the root filesystem,
  which is then judged as root, never a second time as a disk it does not have.
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
- Peers (`Peers`): a TCP connection to the kubelet port of a few nodes of the node's own pool. The
  agent learns them from the API server with one label-selected list of at most `limit` nodes, at
  start and about hourly after (jittered), never per round; of those it keeps the schedulable,
  Ready ones with an InternalIP, chosen by a hash of both names (stable: the same peers while they
  stay so). A peer not answering is the peer's problem: the pool is listed again in the same round
  (when the last list is `relist_s` old) and the peer replaced, so a node scaled in costs no
  finding; what still fails is a warning while other peers answer, and fatal only when none of at
  least two answered for `--confirm-rounds` rounds in a row. A pool with fewer than two other such
  nodes gives no finding (a log line).

A check that talks to something (the kubelet, the runtime, the API servers, the route) is fatal
only after `--confirm-rounds` rounds in a row failed: one lost connection is a blip, not a verdict;
the rounds before that are warnings that say how many.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import random
import re
import socket
import ssl
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from superkube.agents.gpu_probe import Finding
from superkube.model.spec import POOL_LABEL

FULL_WARNING = 0.90
FULL_FATAL = 0.97
IO_ERROR_HOLD_S = 3600.0
CONFIRM_ROUNDS = 3
ANSWER_TIMEOUT_S = 3.0
KUBELET_PORT = 10250  # the kubelet's API, which every node serves: what a peer is reached on
PEERS = 3
MIN_PEERS = 2  # fewer known peers than this: no finding (one peer down would look like a partition)
PEER_LIST_LIMIT = 100  # nodes of the pool one list returns at most (its cost at 7,500 nodes)
PEER_REFRESH_S = 3600.0  # the pool is listed again about this often (jittered by a quarter either way)
PEER_RELIST_S = 300.0  # after a peer failed: listed again, but never sooner than this after the last
# what the kernel logs when a block device or a filesystem fails (SCSI/NVMe/virtio block layer,
# buffer cache, ext4, XFS, btrfs); one line is enough
IO_ERROR = re.compile(
    r"(?:blk_update_request|critical (?:medium|target) error|I/O error, dev (?P<dev>[\w.-]+)"
    r"|Buffer I/O error on dev(?:ice)? (?P<buf>[\w.-]+)|EXT4-fs error \(device (?P<ext4>[\w.-]+)\)"
    r"|XFS \((?P<xfs>[\w.-]+)\): .*(?:I/O error|metadata I/O)|BTRFS error \(device (?P<btrfs>[\w.-]+)\))"
)
MOUNT_ESCAPE = re.compile(r"\\([0-7]{3})")

# the checks by name, as metrics and findings call them
CHECKS = ("filesystem", "kernel-io", "kubelet", "runtime", "api-servers", "default-route", "peers")

log = logging.getLogger(__name__)


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


def answers_tcp_then_tls(address: str, timeout: float = ANSWER_TIMEOUT_S) -> str | None:
    """None when a TCP connection to HOST:PORT opens; else why not. A TLS handshake follows, its
    outcome ignored (nothing is sent, so nothing is verified): a Go TLS server such as the kubelet
    logs every connection closed before a handshake, and a peer's certificate is not this node's
    network."""
    host, _, port = address.rpartition(":")
    try:
        sock = socket.create_connection((host.strip("[]"), int(port)), timeout=timeout)
    except OSError as e:
        return _why(e)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    with sock, contextlib.suppress(OSError), context.wrap_socket(sock):
        pass
    return None


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


def internal_ip(node: Mapping[str, Any]) -> str | None:
    """The node's first InternalIP, as its kubelet registered it."""
    for address in (node.get("status") or {}).get("addresses") or []:
        if address.get("type") == "InternalIP" and address.get("address"):
            return str(address["address"])
    return None


def ready(node: Mapping[str, Any]) -> bool:
    conditions = (node.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def choose_peers(
    me: str, nodes: Iterable[Mapping[str, Any]], count: int, avoid: Iterable[str] = ()
) -> list[tuple[str, str]]:
    """Up to `count` peers of node `me` as (name, InternalIP): schedulable, Ready, with an address,
    never itself. Ranked by a hash of both names, so each node picks its own and keeps them while
    they stay eligible; those in `avoid` (failed in the last round) only when too few others are."""
    eligible = {}
    for node in nodes:
        name = str((node.get("metadata") or {}).get("name", ""))
        address = internal_ip(node)
        cordoned = bool((node.get("spec") or {}).get("unschedulable"))
        if name and name != me and address and ready(node) and not cordoned:
            eligible[name] = address
    shunned = set(avoid)
    ranked = sorted(eligible, key=lambda n: (n in shunned, hashlib.sha256(f"{me}\0{n}".encode()).digest()))
    return [(name, eligible[name]) for name in ranked[:count]]


def _host_port(address: str, port: int) -> str:
    return f"[{address}]:{port}" if ":" in address else f"{address}:{port}"


@dataclass
class Peers:
    """A few nodes of this node's pool, learnt from the API server now and then, reached each round.

    `list_nodes(label_selector, field_selector, limit)` is one list call (the Nodes, as plain
    mappings); the round calls it only when the list is due."""

    node: str
    pool: str
    list_nodes: Callable[[str, str, int], Sequence[Mapping[str, Any]]]
    count: int = PEERS
    port: int = KUBELET_PORT
    limit: int = PEER_LIST_LIMIT
    refresh_s: float = PEER_REFRESH_S
    relist_s: float = PEER_RELIST_S
    confirm: int = CONFIRM_ROUNDS
    timeout: float = ANSWER_TIMEOUT_S
    clock: Callable[[], float] = time.monotonic
    jitter: Callable[[], float] = random.random
    connect: Callable[[str, float], str | None] = answers_tcp_then_tls
    known: list[tuple[str, str]] = field(default_factory=list)
    listed_at: float | None = None
    due_at: float = 0.0
    avoid: set[str] = field(default_factory=set)
    failed: int = 0
    failing_since: float | None = None  # the first round of this run in which no peer answered
    said: str = ""

    def read(self) -> list[Finding]:
        now = self.clock()
        if self.listed_at is None or now >= self.due_at:
            self._list(now)
        if not self._enough():
            return []
        down = self._reach()
        if down and self.listed_at is not None and now - self.listed_at >= self.relist_s:
            # a peer gone (scaled in, failed) is replaced at once, without a finding here
            self.avoid = {name for name, _ in down}
            self._list(now)
            if not self._enough():
                return []
            down = self._reach()
        if not down:
            self.failed, self.failing_since = 0, None
            return []
        # those that failed are replaced at the next list, which comes `relist_s` after the last
        self.avoid = {name for name, _ in down}
        if self.listed_at is not None:
            self.due_at = min(self.due_at, self.listed_at + self.relist_s)
        said = ", ".join(f"{name} ({why})" for name, why in down)
        if len(down) < len(self.known):
            self.failed, self.failing_since = 0, None
            return [
                Finding(
                    "warning",
                    None,
                    f"{len(down)} of {len(self.known)} peers in the pool not answering: {said}",
                )
            ]
        self.failed += 1
        if self.failing_since is None:
            self.failing_since = now
        what = f"none of {len(self.known)} peers in the pool answering: {said}"
        # fatal only on peers listed since the first such round: peers picked before may all have gone
        # (rebooted, scaled in) without this node being at fault
        fresh = self.listed_at is not None and self.listed_at >= self.failing_since
        if self.failed >= self.confirm and fresh:
            return [Finding("fatal", None, what)]
        if self.failed >= self.confirm:
            return [Finding("warning", None, f"{what} (fatal once a fresh list of peers fails too)")]
        return [Finding("warning", None, f"{what} ({self.failed} of {self.confirm} rounds)")]

    def _enough(self) -> bool:
        """At least MIN_PEERS known; else no finding (said once)."""
        if len(self.known) >= MIN_PEERS:
            return True
        self.failed, self.failing_since = 0, None
        if self.listed_at is not None:  # never listed: its error is said
            self._say(
                f"peers: {len(self.known)} other node(s) of the pool ready and schedulable "
                f"({self.pool}); no peer check until there are {MIN_PEERS}"
            )
        return False

    def _reach(self) -> list[tuple[str, str]]:
        """(name, why) of the known peers that did not answer, all tried at once."""
        addresses = [_host_port(address, self.port) for _, address in self.known]
        with ThreadPoolExecutor(max_workers=len(addresses)) as pool:
            whys = list(pool.map(lambda a: self.connect(a, self.timeout), addresses))
        return [(name, why) for (name, _), why in zip(self.known, whys, strict=True) if why is not None]

    def _list(self, now: float) -> None:
        try:
            nodes = self.list_nodes(
                f"{POOL_LABEL}={self.pool}",
                f"spec.unschedulable=false,metadata.name!={self.node}",
                self.limit,
            )
        except Exception as e:  # the API server away or refusing: the peers known stay
            self.due_at = now + min(self.relist_s, self.refresh_s)
            log.error("peers: listing the pool's nodes failed, again in %.0f s: %s", self.due_at - now, e)
            return
        self.listed_at = now
        self.due_at = now + self.refresh_s * (0.75 + 0.5 * self.jitter())
        peers = choose_peers(self.node, nodes, self.count, self.avoid)
        self.avoid = set()
        if peers != self.known:
            log.info("peers: %s", ", ".join(f"{n} ({a})" for n, a in peers) or "none")
            self.said = ""
        self.known = peers

    def _say(self, line: str) -> None:
        if line != self.said:
            log.info(line)
            self.said = line


@dataclass
class HostChecks:
    """Every host check of one node; `read()` gives this round's findings, by check."""

    filesystems: Sequence[tuple[str, str]] = ()
    kernel_log: KernelLog | None = None
    reachability: Sequence[Reachability] = ()
    peers: Peers | None = None
    mountinfo: Path = Path("/proc/self/mountinfo")
    full_warning: float = FULL_WARNING
    full_fatal: float = FULL_FATAL
    device: Callable[[str], int] = lambda path: os.stat(path).st_dev
    shared: dict[str, str] = field(default_factory=dict)
    """{name: the name it is watched under} for the paths on a filesystem named before them"""

    def read(self) -> dict[str, list[Finding]]:
        try:
            table: str | None = self.mountinfo.read_text()
        except OSError:
            table = None  # without the mount table only fullness is judged
        out: dict[str, list[Finding]] = {"filesystem": []}
        for name, path in self._distinct():
            out["filesystem"] += filesystem(name, path, table, self.full_warning, self.full_fatal)
        if self.kernel_log is not None:
            out["kernel-io"] = self.kernel_log.read()
        for check in self.reachability:
            out[check.name] = check.read()
        if self.peers is not None:
            out["peers"] = self.peers.read()
        return out

    def _distinct(self) -> list[tuple[str, str]]:
        """The filesystems to judge this round: one name per device (an unreadable path is judged,
        and so said)."""
        first: dict[int, str] = {}
        out, shared = [], {}
        for name, path in self.filesystems:
            try:
                dev = self.device(path)
            except OSError:
                out.append((name, path))
                continue
            if dev in first:
                shared[name] = first[dev]
                continue
            first[dev] = name
            out.append((name, path))
        for name, path in self.filesystems:
            if shared.get(name) != self.shared.get(name):
                if name in shared:
                    log.info("filesystem %s (%s) is on %s's filesystem: watched once, as %s (no filesystem "
                             "of its own mounted there)", name, path, shared[name], shared[name])  # fmt: skip
                else:
                    log.info("filesystem %s (%s) is a filesystem of its own: watched", name, path)
        self.shared = shared
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
