"""The API servers' internal load balancer, in the lab: HAProxy in the switch namespace.

In Azure the fabric answers the load balancer's frontend address and spreads TCP flows over the
backends whose health probe passes; in the lab the switch namespace plays the fabric, so the
frontend address is the switch's and HAProxy, in TCP mode, forwards to the API servers. The probe is
the plan's: HTTPS `GET /readyz` (certificate not verified, as Azure's probe does not) every
APISERVER_PROBE_INTERVAL_S, a backend out after APISERVER_PROBE_THRESHOLD failures and back after as
many successes. A probe's connection not made within CONNECT_TIMEOUT_S fails, so a backend that
vanishes is out within one interval and that; a probe connected but not answered fails after
CHECK_TIMEOUT_S, the interval, as Azure's HTTP probe waits for its answer up to the interval (so a
server slow for a moment on a loaded host is not taken out by one slow answer); idle flows are kept
APISERVER_LB_IDLE_TIMEOUT_MIN. As in Azure, a connection balanced to a backend that has just died fails; it is not sent to another
backend. When every backend fails the probe, new flows go to all of them (Azure's
noHealthyBackendsBehavior AllProbedUp): each server again, as an unchecked backup.

Differences: HAProxy ends each client's TCP connection and opens its own to the backend, so the API
server sees the switch's address as the client (Azure's load balancer keeps the client's); and a
connection to a vanished backend is closed after CONNECT_TIMEOUT_S per attempt, where in Azure the
client's own SYNs go unanswered until it gives up. Either way the request fails.
"""

from __future__ import annotations

import csv
import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

from superkube.cluster.kube import (
    APISERVER_LB_ALL_DOWN_SENDS_TO_ALL,
    APISERVER_LB_IDLE_TIMEOUT_MIN,
    APISERVER_PROBE_INTERVAL_S,
    APISERVER_PROBE_PATH,
    APISERVER_PROBE_THRESHOLD,
)
from superkube.lab.errors import LabError

CONFIG = "apiserver-lb.cfg"
SOCKET = "apiserver-lb.sock"
LOG = "apiserver-lb.log"
BACKEND = "apiservers"
# A probe's connection not made within this fails (HAProxy takes min(timeout connect, inter) to
# connect a check); a client's connection to a backend is given as long.
CONNECT_TIMEOUT_S = 1
# A probe connected but not answered within this fails: the interval, as in Azure. One slow /readyz
# while a new controller-manager leader lists everything must not take the last server out.
CHECK_TIMEOUT_S = APISERVER_PROBE_INTERVAL_S
ALL_DOWN_SUFFIX = "-all-down"  # the same servers again, used only while every checked one is down


def haproxy() -> str:
    """HAProxy from PATH, or the copy scripts/debian-deps.sh unpacks into the project's .tools/bin."""
    found = shutil.which("haproxy")
    if found:
        return found
    from superkube.plan import engine as planning

    tools = planning.find_project() / ".tools" / "bin" / "haproxy"
    if tools.is_file():
        return str(tools)
    raise LabError(
        "the lab's API load balancer needs haproxy: run `bash scripts/debian-deps.sh` (or apt-get install haproxy)"
    )


def config(frontend: str, port: int, backends: list[tuple[str, str]], stats_socket: Path) -> str:
    """HAProxy's configuration for the frontend `frontend:port` over (name, address) backends."""
    servers = "\n".join(f"    server {name} {address}:{port}" for name, address in backends)
    all_down = ""
    if APISERVER_LB_ALL_DOWN_SENDS_TO_ALL:  # Azure's AllProbedUp: unchecked backups, all used at once
        all_down = "    option allbackups\n"
        servers += "\n" + "\n".join(
            f"    server {name}{ALL_DOWN_SUFFIX} {address}:{port} backup no-check"
            for name, address in backends
        )
    return f"""# the API servers' internal load balancer (superkube lab), from the plan's probe and timeouts
global
    maxconn 4000
    stats socket {stats_socket} mode 600 level admin

defaults
    mode tcp
    timeout connect {CONNECT_TIMEOUT_S}s
    timeout check {CHECK_TIMEOUT_S}s
    timeout client {APISERVER_LB_IDLE_TIMEOUT_MIN}m
    timeout server {APISERVER_LB_IDLE_TIMEOUT_MIN}m

frontend apiserver
    bind {frontend}:{port}
    default_backend {BACKEND}

backend {BACKEND}
    balance roundrobin
    option httpchk GET {APISERVER_PROBE_PATH}
    http-check expect status 200
{all_down}    default-server check check-ssl verify none inter {APISERVER_PROBE_INTERVAL_S}s fall {APISERVER_PROBE_THRESHOLD} rise {APISERVER_PROBE_THRESHOLD}
{servers}
"""


def start(state: Path, switch: str, frontend: str, port: int, backends: list[tuple[str, str]]) -> None:
    """Give the switch the plan's frontend address and start HAProxy there over the (name, address)
    backends (ended with the namespace by `lab down`); nothing when there are none."""
    if not backends:
        return
    (state / CONFIG).write_text(config(frontend, port, backends, state / SOCKET))
    binary = haproxy()
    subprocess.run(["ip", "-n", switch, "addr", "add", f"{frontend}/32", "dev", "br0"], check=True)
    launcher = 'exec "$@" >>"$SUPERKUBE_LAB_LOG" 2>&1 </dev/null &\necho $!'
    command = ["ip", "netns", "exec", switch, binary, "-db", "-f", str(state / CONFIG)]
    subprocess.run(
        ["setsid", "sh", "-c", launcher, "sh", *command],
        capture_output=True,
        text=True,
        env={**os.environ, "SUPERKUBE_LAB_LOG": str(state / LOG)},
        check=True,
        timeout=30,
    )
    deadline = time.monotonic() + 10
    while not (state / SOCKET).exists():
        if time.monotonic() > deadline:
            raise LabError(f"the lab's API load balancer did not start; see {state / LOG}")
        time.sleep(0.1)


def _servers(state_dir: Path) -> list[dict[str, str]]:
    """The API servers' rows of HAProxy's statistics, the all-down copies included."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(5)
        s.connect(str(state_dir / SOCKET))
        s.sendall(b"show stat\n")
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    rows = csv.DictReader(data.decode().lstrip("# ").splitlines())
    return [r for r in rows if r["pxname"] == BACKEND and r["svname"] not in ("FRONTEND", "BACKEND")]


def backend_states(state_dir: Path) -> dict[str, str]:
    """Each API server's state as the load balancer sees it: UP, DOWN, or a transition (`UP 1/2`)."""
    return {
        r["svname"]: r["status"] for r in _servers(state_dir) if not r["svname"].endswith(ALL_DOWN_SUFFIX)
    }


def flows_sent(state_dir: Path) -> dict[str, int]:
    """How many client connections the load balancer has sent to each API server since it started,
    counting those it sent to the server's all-down copy. HAProxy counts every connection attempt
    (`stot`), a retry of a connection that failed to connect included; its retries (`wretr`) are
    taken off, so a flow is counted once, when it was sent, whether or not it connected."""
    sent: dict[str, int] = {}
    for r in _servers(state_dir):
        name = r["svname"].removesuffix(ALL_DOWN_SUFFIX)
        sent[name] = sent.get(name, 0) + int(r["stot"] or 0) - int(r["wretr"] or 0)
    return sent
