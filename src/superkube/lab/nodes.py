"""Lab nodes joining the lab's control plane for real: the join unit cloud-init wrote starts the
kubelet, which authenticates with the bootstrap token, has its CSR approved and signed by the
controller-manager, and registers its Node.

`lab up` writes cloud-init's files on every node host but leaves its runcmd (enabling the join path
unit) undone: most lab shapes have no API server to join. `join` does what that runcmd does, after
converge has written the bootstrap kubeconfig, and waits for each Node to be Ready. Then it has each
node's first serving certificate approved (`approve_serving`), so the API servers can reach the
kubelets when join returns; the renewals are the layer's approver Deployment's, once its pod runs.
"""

from __future__ import annotations

import base64
import json
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from cryptography import x509

from superkube.agents import serving_certs
from superkube.cluster import cloudinit
from superkube.cluster.kube import SERVING_CERTS_MODULE
from superkube.lab import layer
from superkube.lab.errors import LabError
from superkube.lab.machines import run_on, ssh
from superkube.lab.state import Lab

JOIN_PATH = Path(cloudinit.JOIN_PATH_UNIT).name  # the unit cloud-init's runcmd enables


@dataclass(frozen=True)
class Joined:
    name: str
    kubelet_to_ready_s: float | None  # from the kubelet's start to its Node seen Ready; None: it was already


def node_hosts(lab: Lab, names: Iterable[str] = ()) -> list[str]:
    """The named hosts (all GPU and CPU nodes when none are named); each must be a node host."""
    nodes = [h.name for h in lab.hosts if h.is_node]
    wanted = list(names) or nodes
    wrong = [n for n in wanted if n not in nodes]
    if wrong:
        raise LabError(
            f"{', '.join(wrong)}: not a GPU or CPU node host of the lab (nodes: {', '.join(nodes)})"
        )
    return wanted


def ready_nodes(lab: Lab) -> set[str]:
    """Nodes whose Ready condition is True, as the lab's API server says."""
    try:
        proc = subprocess.run(
            [*layer.kubectl(lab), "get", "nodes", "-o", "json"], capture_output=True, text=True, timeout=60
        )
    except subprocess.TimeoutExpired:
        return set()
    if proc.returncode != 0:
        return set()  # an API server in a fault test, say: the caller's deadline decides
    ready = set()
    for node in json.loads(proc.stdout)["items"]:
        conditions = (node.get("status") or {}).get("conditions") or []
        if any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions):
            ready.add(node["metadata"]["name"])
    return ready


def join(
    lab: Lab,
    names: Iterable[str] = (),
    timeout_s: float = 180,
    progress: Callable[[str], None] = lambda what: None,
) -> list[Joined]:
    """Start the join on node hosts (cloud-init's runcmd) and wait until every Node is Ready."""
    wanted = node_hosts(lab, names)
    for name in wanted:
        if "yes" not in run_on(lab, name, f"test -s {cloudinit.BOOTSTRAP_KUBECONFIG} && echo yes || echo no"):
            raise LabError(
                f"{name} has no {cloudinit.BOOTSTRAP_KUBECONFIG}: run `superkube converge` on the lab first"
            )
    already = ready_nodes(lab) & set(wanted)
    for name in wanted:
        run_on(lab, name, f"systemctl enable --now {JOIN_PATH}")
        progress(f"{name}: already Ready" if name in already else f"{name}: join started")
    deadline = time.monotonic() + timeout_s
    seen: dict[str, float] = {name: 0.0 for name in already}
    while len(seen) < len(wanted):
        for name in ready_nodes(lab) & set(wanted) - set(seen):
            seen[name] = time.monotonic()
            progress(f"{name}: Ready")
        if len(seen) == len(wanted):
            break
        if time.monotonic() > deadline:
            late = [n for n in wanted if n not in seen]
            why = {n: _kubelet_tail(lab, n) for n in late}
            raise LabError(
                f"not Ready after {timeout_s:.0f} s: "
                + "; ".join(f"{n} (kubelet: {w})" for n, w in why.items())
            )
        time.sleep(0.5)
    joined = []
    for name in wanted:
        if name in already:
            joined.append(Joined(name, None))
            continue
        started = run_on(
            lab, name, "systemctl show kubelet -p ExecMainStartTimestampMonotonic --value"
        ).strip()
        if not started.isdigit() or int(started) == 0:
            raise LabError(f"{name}: Ready, but systemd has no start time for its kubelet ({started!r})")
        # the hosts share this machine's kernel, so their monotonic clock is this process's
        joined.append(Joined(name, round(seen[name] - int(started) / 1e6, 2)))
    approve_serving(lab, wanted, progress=progress)
    return joined


def served(lab: Lab, min_left_s: float = 60) -> dict[str, str]:
    """Each node's newest kubelet-serving request: 'issued', 'expiring' (signed, with less than
    `min_left_s` left: the kubelet's renewal comes before that), 'denied: <why>' or 'pending'."""
    proc = subprocess.run([*layer.kubectl(lab), "get", "csr", "-o", "json"], capture_output=True, text=True,
                          timeout=60)  # fmt: skip
    if proc.returncode != 0:
        return {}
    newest: dict[str, tuple[str, str]] = {}
    for csr in json.loads(proc.stdout)["items"]:
        node = serving_certs.node_of(csr)
        if not node or csr["spec"].get("signerName") != serving_certs.SIGNER:
            continue
        status = csr.get("status") or {}
        denied = [c for c in status.get("conditions") or [] if c.get("type") == "Denied"]
        state = f"denied: {denied[0].get('message')}" if denied else "pending"
        if status.get("certificate"):
            certificate = x509.load_pem_x509_certificate(base64.b64decode(status["certificate"]))
            left = (certificate.not_valid_after_utc - datetime.now(UTC)).total_seconds()
            state = "issued" if left >= min_left_s else "expiring"
        made = csr["metadata"]["creationTimestamp"]
        if node not in newest or made >= newest[node][0]:
            newest[node] = (made, state)
    return {node: state for node, (_, state) in newest.items()}


def approve_serving(
    lab: Lab,
    names: Iterable[str] = (),
    timeout_s: float = 90,
    progress: Callable[[str], None] = lambda what: None,
) -> dict[str, str]:
    """Run the serving-certificate approver (superkube.agents.serving_certs, the program the in-cluster
    layer's Deployment runs) from this machine, as the lab's admin, until each named node's newest
    kubelet-serving certificate is signed with a minute or more left. `join` runs it for a node's
    first certificate: the Deployment's one pod goes to the lab's CPU node, so before that node has
    joined (or before `lab apply`) nothing else would approve. After, the Deployment approves the
    renewals (the lab's certificates last minutes, `cluster-signing-duration`); a test that must
    reach a kubelet at once, whatever the Deployment is doing, may call this too."""
    wanted = node_hosts(lab, names)
    log = Path(lab.state_dir) / "serving-certs.log"
    with log.open("ab") as out:
        approver = subprocess.Popen(
            ["ip", "netns", "exec", layer.SWITCH, sys.executable, "-m", SERVING_CERTS_MODULE,
             "--kubeconfig", str(layer.admin_kubeconfig(lab)), "--interval", "1", "--metrics-port", "0",
             "--metrics-address", "127.0.0.1"], stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            states = served(lab)
            if all(states.get(n) == "issued" for n in wanted):
                break
            denied = {n: s for n, s in states.items() if n in wanted and s.startswith("denied")}
            if denied or time.monotonic() > deadline or approver.poll() is not None:
                why = {n: states.get(n, "no request yet") for n in wanted if states.get(n) != "issued"}
                tail = log.read_text(errors="replace").strip().splitlines()[-1:] or ["no output"]
                raise LabError(
                    "no serving certificate for "
                    + "; ".join(f"{n} ({w})" for n, w in why.items())
                    + f" (approver: {tail[0][:200]}; its log: {log})"
                )
            time.sleep(0.5)
    finally:
        approver.terminate()
        approver.wait(30)
    for name in wanted:
        progress(f"{name}: serving certificate signed")
    return states


def _kubelet_tail(lab: Lab, name: str) -> str:
    try:
        proc = ssh(
            lab, lab.host(name), "systemctl is-active kubelet; journalctl -u kubelet -n 3 --no-pager -o cat"
        )
    except subprocess.TimeoutExpired:
        return "no answer over SSH"
    return " / ".join(line.strip()[:200] for line in proc.stdout.splitlines() if line.strip()) or "no output"
