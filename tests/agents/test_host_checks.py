"""The health agent's host checks: a real small filesystem filled and remounted read-only, a data
disk's directory with and without a filesystem of its own, a kernel log followed as rsyslog writes
it, real loopback endpoints that answer or do not, the route table's text, and peers listening or
not on loopback addresses, learnt from a list of the pool (a fake list, and the real API server as
the agent's service account). Needs root (a tmpfs of its own, never the machine's disk)."""

from __future__ import annotations

import contextlib
import http.server
import logging
import socket
import ssl
import subprocess
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from superkube.agents import host_checks as hc
from superkube.harness.apiserver import LocalApi
from superkube.model.spec import POOL_LABEL
from tests.agents.conftest import admin, apply, identity, make_node, namespace, serving, unique

MOUNTINFO = """\
22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw,discard,errors=remount-ro
31 22 8:1 /var/lib/superkube/health /host/fs/root ro,relatime master:1 - ext4 /dev/sda1 rw,discard
32 22 8:1 /var/lib/my\\040data /host/fs/data ro,relatime - ext4 /dev/sdb1 ro,errors=remount-ro
"""


def test_the_filesystems_own_options_decide_read_only_not_the_agents_view() -> None:
    assert hc.super_options(MOUNTINFO, "/host/fs/root") == {"rw", "discard"}
    assert "ro" in (hc.super_options(MOUNTINFO, "/host/fs/data") or set())  # escaped space read back
    assert hc.super_options(MOUNTINFO, "/nowhere") is None


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    """A 1 MiB tmpfs of the test's own."""
    where = tmp_path / "fs"
    where.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m,nr_inodes=64", "tmpfs", str(where)], check=True)
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=True)


def test_a_filesystem_filling_up_warns_then_is_fatal_and_read_only_is_fatal(small_fs: Path) -> None:
    table = Path("/proc/self/mountinfo")
    checks = hc.HostChecks(filesystems=[("data", str(small_fs))], mountinfo=table)
    assert checks.read()["filesystem"] == []
    block = small_fs / "block"
    block.write_bytes(b"x" * int(0.92 * 1024 * 1024))
    (found,) = checks.read()["filesystem"]
    assert found.level == "warning" and "data filesystem" in found.reason and "(space)" in found.reason
    with block.open("ab") as f:
        f.write(b"x" * int(0.07 * 1024 * 1024))
    (found,) = checks.read()["filesystem"]
    assert found.level == "fatal" and "full (space)" in found.reason
    block.unlink()
    subprocess.run(["mount", "-o", "remount,ro", str(small_fs)], check=True)
    (found,) = checks.read()["filesystem"]
    assert (found.level, found.reason) == ("fatal", "data filesystem remounted read-only")


def test_running_out_of_inodes_counts_as_full(small_fs: Path) -> None:
    for i in range(63):
        (small_fs / f"f{i}").touch()
    found = hc.filesystem("data", str(small_fs), None)
    assert [(f.level, "inodes" in f.reason) for f in found] == [("fatal", True)]


def test_an_unreadable_filesystem_is_a_warning_never_fatal(tmp_path: Path) -> None:
    (found,) = hc.filesystem("root", str(tmp_path / "gone"), MOUNTINFO)
    assert found.level == "warning" and "unreadable" in found.reason


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_io_errors_logged_after_start_are_fatal_for_the_hold_and_older_ones_never(tmp_path: Path) -> None:
    log = tmp_path / "kernel.log"
    log.write_text("2026-11-28T10:00:00 node kernel: blk_update_request: I/O error, dev sdc, sector 8\n")
    clock = Clock()
    kernel = hc.KernelLog(log, hold_s=600, clock=clock)
    assert kernel.read() == []  # from before the agent: history, never a cordon
    with log.open("a") as f:
        f.write("2026-11-28T10:01:00 node kernel: EXT4-fs warning: mounting fs with errors\n")
        f.write("2026-11-28T10:01:01 node kernel: I/O error, dev nvme0n1, sector 123 op 0x1:(WRITE)\n")
        f.write("2026-11-28T10:01:02 node kernel: EXT4-fs error (device sdb1): ext4_find_entry:1455")
    (found,) = kernel.read()  # the unfinished line waits for its end
    assert (found.level, found.reason) == ("fatal", "I/O errors on nvme0n1 in the kernel log")
    with log.open("a") as f:
        f.write(": reading directory lblock 0\n")
    assert [f.reason for f in kernel.read()] == [
        "I/O errors on nvme0n1 in the kernel log",
        "I/O errors on sdb1 in the kernel log",
    ]
    clock.now += 601
    assert kernel.read() == []
    # rotated: the new file is read from its start
    log.rename(tmp_path / "kernel.log.1")
    log.write_text("x kernel: Buffer I/O error on dev sdd, logical block 0, async page read\n")
    assert [f.reason for f in kernel.read()] == ["I/O errors on sdd in the kernel log"]
    assert kernel.counted == {"nvme0n1": 1, "sdb1": 1, "sdd": 1}


def test_a_kernel_log_not_written_yet_is_read_from_its_start_once_it_is(tmp_path: Path) -> None:
    log = tmp_path / "kernel.log"
    kernel = hc.KernelLog(log)
    assert kernel.read() == []
    log.write_text("x kernel: I/O error, dev sdc, sector 8 op 0x0:(READ)\n")
    assert [f.reason for f in kernel.read()] == ["I/O errors on sdc in the kernel log"]


def test_a_kernel_log_the_agent_may_not_read_is_a_warning(tmp_path: Path) -> None:
    (found,) = hc.KernelLog(tmp_path).read()  # a directory: unreadable as a log
    assert found.level == "warning" and "unreadable" in found.reason


@pytest.fixture
def endpoint() -> Iterator[tuple[str, list[int]]]:
    """A loopback HTTP server answering with the status at the head of the list."""
    status = [200]

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(status[0])
            self.end_headers()
            self.wfile.write(b"ok")

        def log_message(self, *args: object) -> None:
            pass

    with serving(http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)) as url:
        yield f"{url}/healthz", status


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_service_that_stops_answering_is_fatal_only_after_the_confirming_rounds(
    endpoint: tuple[str, list[int]],
) -> None:
    url, status = endpoint
    check = hc.Reachability("kubelet", "kubelet not answering", lambda: hc.answers_http(url, 2), confirm=3)
    assert check.read() == []
    status[0] = 500
    levels = [check.read()[0].level for _ in range(3)]
    assert levels == ["warning", "warning", "fatal"]
    status[0] = 200
    assert check.read() == [] and check.failed == 0  # one good round starts the count again


def test_the_api_servers_address_reached_or_not(endpoint: tuple[str, list[int]]) -> None:
    url, _ = endpoint
    open_address = url.split("/")[2]
    assert hc.answers_tcp(open_address) is None
    why = hc.answers_tcp(f"127.0.0.1:{closed_port()}")
    assert why is not None and "refused" in why.lower()
    checks = hc.build(api_address=f"127.0.0.1:{closed_port()}", route_table=None, confirm=1)
    (found,) = checks.read()["api-servers"]
    assert found.level == "fatal" and found.reason.startswith("API servers unreachable at 127.0.0.1:")


ROUTES = """\
Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT
eth0\t00000000\t0100000A\t0003\t0\t0\t100\t00000000\t0\t0\t0
eth0\t0000000A\t00000000\t0001\t0\t0\t100\t0000FFFF\t0\t0\t0
"""


def test_the_default_route_is_read_from_the_route_table(tmp_path: Path) -> None:
    assert hc.default_route(ROUTES) is None
    without = "\n".join(line for line in ROUTES.splitlines() if "0100000A" not in line)
    assert hc.default_route(without) == "no default route"
    table = tmp_path / "route"
    table.write_text(without)
    (found,) = hc.build(route_table=table, confirm=1).read()["default-route"]
    assert (found.level, found.reason) == ("fatal", "network: no default route")


def test_bad_filesystem_flags_name_the_item() -> None:
    with pytest.raises(ValueError, match="'root:/x'"):
        hc.parse_filesystems(["root:/x"])
    assert hc.parse_filesystems(["root=/host/fs/root"]) == [("root", "/host/fs/root")]
    with pytest.raises(ValueError, match="'root=relative'"):
        hc.parse_filesystems(["root=relative"])


# --- every filesystem the node keeps state on, each judged once -----------------------------------


def test_a_data_directory_without_a_disk_of_its_own_is_judged_once_as_root(
    small_fs: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A node without a data disk: its data directory is on the root filesystem, so a full root is
    one finding, root's, never a second one for a disk the node does not have. Once a disk is
    mounted there it is judged on its own, full or read-only, under its name."""
    caplog.set_level(logging.INFO, logger=hc.__name__)
    root, data = small_fs / "root", small_fs / "data"
    root.mkdir()
    data.mkdir()
    checks = hc.HostChecks(filesystems=[("root", str(root)), ("data", str(data))])
    (small_fs / "block").write_bytes(b"x" * int(0.99 * 1024 * 1024))
    assert [(f.level, f.reason.split(" filesystem")[0]) for f in checks.read()["filesystem"]] == [
        ("fatal", "root")
    ]
    assert "filesystem data (" in caplog.text and "watched once, as root" in caplog.text
    (small_fs / "block").unlink()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(data)], check=True)
    try:
        assert checks.read()["filesystem"] == []
        assert "filesystem data (" in caplog.text and "a filesystem of its own: watched" in caplog.text
        (data / "block").write_bytes(b"x" * int(0.99 * 1024 * 1024))
        (found,) = checks.read()["filesystem"]
        assert found.level == "fatal" and found.reason.startswith("data filesystem 9")
        subprocess.run(["mount", "-o", "remount,ro", str(data)], check=True)
        assert "data filesystem remounted read-only" in [f.reason for f in checks.read()["filesystem"]]
    finally:
        subprocess.run(["umount", "-l", str(data)], check=True)
    caplog.clear()
    assert checks.read()["filesystem"] == [] and "watched once, as root" in caplog.text


def test_the_log_line_of_a_shared_filesystem_is_said_once_not_every_round(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=hc.__name__)
    names = ("root", "kubelet", "containerd", "data")
    checks = hc.HostChecks(filesystems=[(n, str(tmp_path)) for n in names], mountinfo=tmp_path / "none")
    for _ in range(3):
        checks.read()
    assert caplog.text.count("watched once, as root") == 3  # kubelet, containerd, data: once each
    assert checks.shared == {"kubelet": "root", "containerd": "root", "data": "root"}


def test_a_path_that_cannot_be_read_is_still_judged_and_said() -> None:
    checks = hc.HostChecks(filesystems=[("root", "/"), ("data", "/nowhere/at/all")])
    (found,) = checks.read()["filesystem"]
    assert found.level == "warning" and found.reason.startswith(
        "data filesystem (/nowhere/at/all) unreadable"
    )


# --- peers of the node's own pool ---------------------------------------------------------------


def node(name: str, address: str | None = None, ready: bool = True, cordoned: bool = False) -> dict[str, Any]:
    """A Node as the list returns it: Ready or not, cordoned or not, with an InternalIP or none."""
    status: dict[str, Any] = {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}
    if address:
        status["addresses"] = [
            {"type": "Hostname", "address": name},
            {"type": "InternalIP", "address": address},
        ]
    return {"metadata": {"name": name}, "spec": {"unschedulable": cordoned}, "status": status}


class Pool:
    """A fake list of the pool's Nodes, counting the calls and what they asked."""

    def __init__(self, nodes: list[dict[str, Any]]) -> None:
        self.nodes = nodes
        self.calls: list[tuple[str, str, int]] = []
        self.fail: Exception | None = None

    def __call__(self, labels: str, fields: str, limit: int) -> Sequence[Mapping[str, Any]]:
        self.calls.append((labels, fields, limit))
        if self.fail is not None:
            raise self.fail
        return self.nodes[:limit]


@pytest.fixture
def listeners() -> Iterator[tuple[int, dict[str, socket.socket]]]:
    """One port, listened on at 127.0.0.2 to 127.0.0.5 (what is not listened on refuses)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.2", 0))
        port = int(probe.getsockname()[1])
    open_ = {}
    try:
        for last in (2, 3, 4, 5):
            s = socket.socket()
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind((f"127.0.0.{last}", port))
            s.listen(16)
            open_[f"127.0.0.{last}"] = s
        yield port, open_
    finally:
        for s in open_.values():
            s.close()


def peers(pool: Pool, port: int, clock: Any = None, **kw: Any) -> hc.Peers:
    # a listener that never accepts leaves the TLS handshake waiting: a short timeout keeps it quick
    return hc.Peers(
        "me", "gpu", pool, port=port, timeout=0.3, clock=clock or Clock(), jitter=lambda: 0.5, **kw
    )


def test_peers_are_ready_schedulable_nodes_with_an_address_never_itself_and_stable() -> None:
    nodes = [node(f"gpu-{i}", f"10.0.0.{i}") for i in range(10)]
    nodes += [node("me", "10.0.1.1"), node("down", "10.0.1.2", ready=False), node("cordoned", "10.0.1.3", cordoned=True),
              node("no-address")]  # fmt: skip
    chosen = hc.choose_peers("me", nodes, 3)
    assert len(chosen) == 3 and {n for n, _ in chosen} <= {f"gpu-{i}" for i in range(10)}
    assert all(address == f"10.0.0.{name.split('-')[1]}" for name, address in chosen)
    # the same peers from the same nodes in any order, and from a pool with one node more or less
    assert hc.choose_peers("me", list(reversed(nodes)), 3) == chosen
    more = hc.choose_peers("me", [*nodes, node("gpu-new", "10.0.2.1")], 3)
    assert len({n for n, _ in more} & {n for n, _ in chosen}) >= 2
    fewer = [n for n in nodes if n["metadata"]["name"] != chosen[0][0]]
    assert hc.choose_peers("me", fewer, 3)[:2] == chosen[1:]
    # another node picks its own (the hash is of both names): spread over the pool
    picks = {n for other in range(40) for n, _ in hc.choose_peers(f"node-{other}", nodes, 3)}
    assert {f"gpu-{i}" for i in range(10)} <= picks
    # those that failed come last
    assert chosen[0] not in hc.choose_peers("me", nodes, 3, avoid={chosen[0][0]})


def test_peers_answering_give_no_finding_and_the_pool_is_listed_once_not_every_round(
    listeners: tuple[int, dict[str, socket.socket]],
) -> None:
    port, _ = listeners
    pool = Pool([node(f"gpu-{i}", f"127.0.0.{i}") for i in (2, 3, 4)])
    clock = Clock()
    check = peers(pool, port, clock)
    for _ in range(5):
        assert check.read() == []
        clock.now += 60
    assert pool.calls == [
        (f"{POOL_LABEL}=gpu", "spec.unschedulable=false,metadata.name!=me", hc.PEER_LIST_LIMIT)
    ]
    assert sorted(a for _, a in check.known) == ["127.0.0.2", "127.0.0.3", "127.0.0.4"]
    clock.now = 1000.0 + hc.PEER_REFRESH_S  # jitter 0.5: due after exactly the refresh
    check.read()
    assert len(pool.calls) == 2


def test_the_lists_are_jittered_within_a_quarter_either_way() -> None:
    for jitter, due in ((0.0, 0.75), (1.0, 1.25)):
        check = hc.Peers("me", "gpu", Pool([]), clock=Clock(), jitter=lambda j=jitter: j)
        check.read()
        assert check.due_at - 1000.0 == pytest.approx(due * hc.PEER_REFRESH_S)


def test_one_peer_down_is_a_warning_never_fatal_and_is_replaced_at_the_next_list(
    listeners: tuple[int, dict[str, socket.socket]],
) -> None:
    port, _ = listeners
    pool = Pool([node(f"gpu-{i}", f"127.0.0.{i}") for i in (2, 3, 9)])  # nothing on 127.0.0.9
    clock = Clock()
    check = peers(pool, port, clock, count=3)
    for _ in range(4):
        (found,) = check.read()
        assert found.level == "warning" and found.reason.startswith(
            "1 of 3 peers in the pool not answering: gpu-9 ("
        )
        assert "refused" in found.reason.lower()
        clock.now += 60
    pool.nodes.append(node("gpu-4", "127.0.0.4"))
    # listed again once `relist_s` has passed since the last list, without the one that failed
    clock.now = 1000.0 + hc.PEER_RELIST_S
    assert check.read() == [] and check.failed == 0
    assert len(pool.calls) == 2 and sorted(dict(check.known)) == ["gpu-2", "gpu-3", "gpu-4"]


def test_a_peer_gone_is_replaced_in_the_same_round_without_a_finding(
    listeners: tuple[int, dict[str, socket.socket]],
) -> None:
    """Scaled in: its kubelet is gone before its Node (still listed Ready for a while). The round that
    finds it gone lists the pool again and reaches another in its place."""
    port, open_ = listeners
    pool = Pool([node(f"gpu-{i}", f"127.0.0.{i}") for i in (2, 3, 4)])
    clock = Clock()
    check = peers(pool, port, clock)
    assert check.read() == []
    gone = check.known[0][0]
    open_[dict(check.known)[gone]].close()
    pool.nodes.append(node("gpu-5", "127.0.0.5"))
    clock.now += hc.PEER_RELIST_S
    assert check.read() == []
    assert len(pool.calls) == 2 and sorted(dict(check.known)) == sorted(
        {"gpu-2", "gpu-3", "gpu-4", "gpu-5"} - {gone}
    )


def test_no_peer_answering_is_fatal_only_after_the_confirming_rounds(
    listeners: tuple[int, dict[str, socket.socket]],
) -> None:
    port, open_ = listeners
    pool = Pool([node(f"gpu-{i}", f"127.0.0.{i}") for i in (2, 3, 4)])
    check = peers(pool, port, confirm=3)
    assert check.read() == []
    for s in open_.values():
        s.close()
    found = [check.read()[0] for _ in range(3)]
    assert [f.level for f in found] == ["warning", "warning", "fatal"]
    assert found[0].reason.startswith("none of 3 peers in the pool answering: ")
    assert found[0].reason.endswith("(1 of 3 rounds)") and "(2 of 3 rounds)" in found[1].reason
    assert found[2].reason.count("refused") == 3


def test_peers_listed_before_they_all_went_quiet_are_listed_again_before_a_fatal(
    listeners: tuple[int, dict[str, socket.socket]],
) -> None:
    """Peers picked minutes ago may all have rebooted together (an update domain's maintenance): the
    node is not at fault until a list made since the first silent round fails too."""
    port, open_ = listeners
    pool = Pool([node(f"gpu-{i}", f"127.0.0.{i}") for i in (2, 3, 4)])
    clock = Clock()
    check = peers(pool, port, clock, confirm=3)
    assert check.read() == []
    clock.now += 120  # within PEER_RELIST_S of the list
    for s in open_.values():
        s.close()
    levels = []
    for _ in range(3):
        levels.append(check.read()[0])
        clock.now += 60
    assert [f.level for f in levels] == ["warning"] * 3 and len(pool.calls) == 1
    assert levels[2].reason.endswith("(fatal once a fresh list of peers fails too)")
    clock.now = 1000.0 + hc.PEER_RELIST_S  # the list is due again: the same three, still silent
    (found,) = check.read()
    assert found.level == "fatal" and len(pool.calls) == 2


def test_a_relisted_pool_does_not_restart_the_count_of_rounds_without_a_peer(
    listeners: tuple[int, dict[str, socket.socket]],
) -> None:
    """The node cut off: new peers answer no better, and the count goes on to fatal."""
    port, open_ = listeners
    for s in open_.values():
        s.close()
    pool = Pool([node(f"gpu-{i}", f"127.0.0.{i}") for i in range(2, 9)])
    clock = Clock()
    check = peers(pool, port, clock, confirm=3)
    levels = []
    for _ in range(3):
        levels.append(check.read()[0].level)
        clock.now += hc.PEER_RELIST_S  # each round a list again, without the last round's peers
    assert levels == ["warning", "warning", "fatal"] and len(pool.calls) == 3


def test_a_pool_of_fewer_than_two_other_nodes_gives_no_finding_and_a_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger=hc.__name__)
    pool = Pool(
        [node("me", "127.0.0.9"), node("gpu-1", "127.0.0.9"), node("gpu-2", "127.0.0.9", ready=False)]
    )
    check = peers(pool, hc.KUBELET_PORT)
    for _ in range(3):
        assert check.read() == []
    assert caplog.text.count("no peer check until there are 2") == 1


def test_a_list_that_fails_keeps_the_peers_known_and_is_tried_again(
    listeners: tuple[int, dict[str, socket.socket]], caplog: pytest.LogCaptureFixture
) -> None:
    port, _ = listeners
    pool = Pool([node(f"gpu-{i}", f"127.0.0.{i}") for i in (2, 3, 4)])
    clock = Clock()
    check = peers(pool, port, clock)
    check.read()
    pool.fail = ConnectionError("API server unreachable")
    clock.now += hc.PEER_REFRESH_S * 2
    assert check.read() == [] and len(check.known) == 3
    assert "listing the pool's nodes failed" in caplog.text
    clock.now += 60
    check.read()
    assert len(pool.calls) == 2  # not again before `relist_s`
    clock.now += hc.PEER_RELIST_S
    check.read()
    assert len(pool.calls) == 3


def test_the_peer_check_is_a_host_check_of_its_own_name() -> None:
    assert "peers" in hc.CHECKS
    checks = hc.HostChecks(peers=hc.Peers("me", "gpu", Pool([]), clock=Clock()))
    assert checks.read()["peers"] == []


@pytest.fixture
def tls_peer(tmp_path: Path) -> Iterator[tuple[str, list[str]]]:
    """A TLS server on loopback (a self-signed certificate, as a kubelet's may be to this node),
    recording how each connection's handshake ended."""
    key, cert = tmp_path / "peer.key", tmp_path / "peer.crt"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                    "-nodes", "-keyout", str(key), "-out", str(cert), "-days", "1", "-subj", "/CN=peer"],
                   check=True, capture_output=True)  # fmt: skip
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    server = socket.create_server(("127.0.0.1", 0))
    ended: list[str] = []

    def serve() -> None:
        with contextlib.suppress(OSError):
            conn, _ = server.accept()
            with conn:
                try:
                    with context.wrap_socket(conn, server_side=True):
                        ended.append("handshake")
                except OSError as e:
                    ended.append(f"error: {e}")

    thread = threading.Thread(target=serve)
    thread.start()
    try:
        yield f"127.0.0.1:{server.getsockname()[1]}", ended
    finally:
        server.close()
        thread.join(10)


def test_a_peer_is_reached_with_a_finished_tls_handshake_not_a_bare_connection(
    tls_peer: tuple[str, list[str]],
) -> None:
    """A bare connection closed before a handshake is a line in a Go server's log (the kubelet's)
    each time: the probe finishes the handshake, whose outcome it does not judge."""
    address, ended = tls_peer
    assert hc.answers_tcp_then_tls(address, 2) is None
    deadline = time.monotonic() + 5
    while not ended and time.monotonic() < deadline:
        time.sleep(0.05)
    assert ended == ["handshake"]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = f"127.0.0.1:{s.getsockname()[1]}"
    why = hc.answers_tcp_then_tls(closed, 2)
    assert why is not None and "refused" in why.lower()


def test_a_peer_that_answers_tcp_but_not_tls_is_reachable(
    listeners: tuple[int, dict[str, socket.socket]],
) -> None:
    port, _ = listeners
    assert hc.answers_tcp_then_tls(f"127.0.0.2:{port}", 0.3) is None


def test_the_agent_may_list_its_pool_as_the_peer_check_asks_on_the_real_api_server(api: LocalApi) -> None:
    """As the health agent's service account (the layer's role): the label and field selectors and
    the limit the check sends are what the server serves: the pool's schedulable nodes but this one,
    at most `limit` of them."""
    from modules.platform import node_health as component
    from modules.platform.foundation import NAMESPACE
    from superkube.agents.kubeapi import Kube

    if NAMESPACE not in {n.metadata.name for n in admin(api).list_namespace().items}:
        namespace(api, NAMESPACE)
    apply(api, *component.agent_access("health"))
    pool = unique("peers")
    names = [f"{pool}-{i}" for i in range(6)]
    for i, name in enumerate(names):
        make_node(api, name, {POOL_LABEL: pool})
        status = {
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}],
            "addresses": [{"type": "InternalIP", "address": f"127.0.0.{10 + i}"}],
        }
        admin(api).patch_node_status(name, {"status": status})
    admin(api).patch_node(names[1], {"spec": {"unschedulable": True}})
    make_node(api, unique("other-pool"), {POOL_LABEL: f"{pool}-x"})
    kube = Kube(str(identity(api, NAMESPACE, component.HEALTH, names[0])))

    def pool_nodes(labels: str, fields: str, limit: int) -> list[dict[str, Any]]:
        found = kube.core.list_node(
            label_selector=labels, field_selector=fields, limit=limit, _request_timeout=10
        )
        return [kube.api.sanitize_for_serialization(n) for n in found.items]

    check = hc.Peers(names[0], pool, pool_nodes, limit=3, clock=Clock())
    check._list(0.0)
    listed = pool_nodes(f"{POOL_LABEL}={pool}", f"spec.unschedulable=false,metadata.name!={names[0]}", 10)
    assert sorted(n["metadata"]["name"] for n in listed) == sorted(names[2:])
    assert len(check.known) == 3 and {n for n, _ in check.known} <= set(names[2:])
    assert all(address.startswith("127.0.0.") for _, address in check.known)


def test_the_agents_process_reaches_its_peers_and_lists_its_pool_once(
    api: LocalApi, listeners: tuple[int, dict[str, socket.socket]]
) -> None:
    """The agent's process as its service account with `--peers`: one list of its pool (its label,
    its limit) for all its rounds, its peers reached, and fatal once none answers for the rounds."""
    from modules.platform import node_health as component
    from modules.platform.foundation import NAMESPACE
    from superkube.agents import node_health as nh
    from tests.agents.test_node_health import run_agent

    port, open_ = listeners
    if NAMESPACE not in {n.metadata.name for n in admin(api).list_namespace().items}:
        namespace(api, NAMESPACE)
    apply(api, *component.agent_access("health"), *component.fence("health"))
    pool = unique("agent-peers")
    me = f"{pool}-me"
    make_node(api, me, {POOL_LABEL: pool})
    for last in (2, 3, 4):
        name = f"{pool}-{last}"
        make_node(api, name, {POOL_LABEL: pool})
        status = {
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}],
            "addresses": [{"type": "InternalIP", "address": f"127.0.0.{last}"}],
        }
        admin(api).patch_node_status(name, {"status": status})
    kubeconfig = identity(api, NAMESPACE, component.HEALTH, me)
    user = f"system:serviceaccount:{NAMESPACE}:{component.HEALTH}"
    before = len(api.requests(user))  # other tests use the same account on this server
    flags = (
        "--pool",
        pool,
        "--peers=3",
        f"--peer-port={port}",
        "--confirm-rounds=2",
        "--route-table=/proc/net/route",
    )
    proc, _ = run_agent(kubeconfig, "healthy", *flags, rounds=3, node_name=me)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    notes = admin(api).read_node(me).metadata.annotations or {}
    assert notes.get(nh.VERDICT_ANNOTATION) == "healthy", err
    lists = [r for r in api.requests(user)[before:] if "labelSelector" in r["uri"]]
    assert len(lists) == 1 and f"limit={hc.PEER_LIST_LIMIT}" in lists[0]["uri"], lists
    assert lists[0]["code"] == 200
    for s in open_.values():
        s.close()
    proc, _ = run_agent(kubeconfig, "healthy", *flags, rounds=3, node_name=me)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    verdict = (admin(api).read_node(me).metadata.annotations or {}).get(nh.VERDICT_ANNOTATION, "")
    assert verdict.startswith("fatal: node: none of 3 peers in the pool answering: "), (verdict, err)
    assert verdict.count("(Connection refused)") == 3
