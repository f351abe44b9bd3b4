"""The health agent's host checks: a real small filesystem filled and remounted read-only, a kernel
log followed as rsyslog writes it, real loopback endpoints that answer or do not, and the route
table's text. Needs root (a tmpfs of its own, never the machine's disk)."""

from __future__ import annotations

import http.server
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from superkube.agents import host_checks as hc
from tests.agents.conftest import serving

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
