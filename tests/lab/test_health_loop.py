"""The health loop on the lab's real nodes: each fault `superkube lab fault` puts on a node (a full
disk, Azure's scheduled maintenance, the API servers cut off, a GPU off the bus) ends with that node
cordoned and drained, for that reason, by the layer's own agents and controller; a scheduled event
is approved after the drain and before its NotBefore, as the lab's instance metadata records.

Shares the control-plane lab and runs after test_training_job (tests/lab/conftest.py orders the
modules of a shape). Each test takes its fault away, uncordons the node and removes health's marks
on the way out, as an operator returns a repaired node.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from email.utils import parsedate_to_datetime
from pathlib import Path
from typing import Any

import pytest

from superkube.agents import node_health as health
from superkube.cluster.health import HEALTH_FS_DIR
from superkube.lab import faults, imds, nodes
from superkube.lab.state import Lab
from superkube.model import teams
from tests.lab.conftest import Labs, get, kubectl, ok
from tests.lab.test_running_the_agents import wait_for

NAMESPACE = "health-loop"
TEAM = "research"  # a team of the lab stack's team capacity: its pods borrow the GPU nodes (team `any`)
NODES = ("gpu-1", "cpu-1", "gpu-2")


@pytest.fixture(scope="module")
def loop(labs: Labs, control_plane: Lab) -> Iterator[Lab]:
    labs.apply(control_plane)
    nodes.join(control_plane, NODES)
    ok(control_plane, "apply", "-f", "-", stdin=json.dumps(
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE, "labels": {teams.TEAM_KEY: TEAM}}}
    ))  # fmt: skip
    yield control_plane
    kubectl(control_plane, "delete", "namespace", NAMESPACE, "--wait=false")


def workload(fleet: Lab, name: str, node: str) -> None:
    """A pod of the team's workload on `node`, borrowing it (the team webhook adds the tolerations
    it is owed), Running."""
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NAMESPACE, "labels": {teams.BORROW_LABEL: "true"}},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node},
            "terminationGracePeriodSeconds": 5,
            "containers": [
                {"name": "main", "image": fleet.images["pause"]["ref"], "imagePullPolicy": "Never"}
            ],
        },
    }
    ok(fleet, "apply", "-f", "-", stdin=json.dumps(pod))
    wait_for(f"{name} Running on {node}", lambda: get(fleet, "pod", "-n", NAMESPACE, name)["status"].get("phase")
             == "Running", timeout=120)  # fmt: skip


def notes(fleet: Lab, node: str) -> dict[str, str]:
    return dict(get(fleet, "node", node)["metadata"].get("annotations") or {})


def cordoned(fleet: Lab, node: str, timeout: float = 120) -> dict[str, Any]:
    return wait_for(
        f"{node}: cordoned by health",
        lambda: (lambda n: n if n["spec"].get("unschedulable") and health.ANNOTATION in
                 (n["metadata"].get("annotations") or {}) else None)(get(fleet, "node", node)),
        timeout=timeout,
    )  # fmt: skip


def gone(fleet: Lab, name: str, timeout: float = 120) -> None:
    wait_for(f"{name} evicted and gone",
             lambda: kubectl(fleet, "get", "pod", "-n", NAMESPACE, name).returncode != 0, timeout=timeout)  # fmt: skip


def reasons(fleet: Lab, node: str, since: datetime) -> set[str]:
    """The reasons of the node's Events from `since` on (a test's own start): an Event an earlier
    module left on the same node does not count."""
    events = get(fleet, "events", "-A", f"--field-selector=involvedObject.name={node}")["items"]
    earliest = since.replace(microsecond=0) - timedelta(seconds=1)  # lastTimestamp is in whole seconds
    return {
        e["reason"]
        for e in events
        if max(datetime.fromisoformat(t) for t in (e.get("lastTimestamp"), e.get("eventTime"),
                                                    e["metadata"]["creationTimestamp"]) if t) >= earliest
    }  # fmt: skip


@pytest.fixture
def returned(loop: Lab) -> Iterator[list[str]]:
    """The nodes a test faults, cleared, reported healthy again, uncordoned and unmarked after it."""
    faulted: list[str] = []
    yield faulted
    for node in faulted:
        faults.clear(loop, node)
        wait_for(f"{node}: reported healthy again",
                 lambda node=node: notes(loop, node).get(health.VERDICT_ANNOTATION) == "healthy", timeout=120)  # fmt: skip
        kubectl(loop, "uncordon", node)
        kubectl(loop, "annotate", "node", node, f"{health.ANNOTATION}-", f"{health.ANNOTATION_AT}-",
                f"{health.DRAINED_AT}-")  # fmt: skip
        wait_for(f"{node}: Ready", lambda node=node: any(
            c["type"] == "Ready" and c["status"] == "True" for c in get(loop, "node", node)["status"]["conditions"]
        ), timeout=120)  # fmt: skip


def test_a_full_disk_gets_a_cpu_node_cordoned_and_drained_for_that_reason(
    loop: Lab, returned: list[str], tmp_path: Path
) -> None:
    since = datetime.now(UTC)
    node = "cpu-1"
    workload(loop, "on-a-full-disk", node)
    returned.append(node)
    # the fault through the installed command, as an operator runs it: outside the checkout, no
    # PYTHONPATH, on this lab
    assert not tmp_path.resolve().is_relative_to(Path(__file__).resolve().parents[2])
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    env["SUPERKUBE_LAB_STATE"] = loop.state_dir
    command = [str(Path(sys.executable).with_name("superkube")), "lab", "fault", node]
    full = subprocess.run(
        [*command, "disk-full"], capture_output=True, text=True, cwd=tmp_path, env=env, timeout=180
    )
    assert full.returncode == 0, full.stderr
    assert " ".join(full.stdout.split()) == (
        f"{node}: {HEALTH_FS_DIR} is a {faults.DISK_MIB} MiB filesystem of its own, 99% full"
    )
    there = cordoned(loop, node)
    reason = there["metadata"]["annotations"][health.ANNOTATION]
    assert "root filesystem" in reason and "full (space)" in reason, reason
    gone(loop, "on-a-full-disk")
    wait_for(f"{node}: marked drained", lambda: health.DRAINED_AT in notes(loop, node))
    assert "NodeHealthCordon" in reasons(loop, node, since)
    # its own agent and the system stay on it: health drains workloads only
    agents = get(loop, "pods", "-n", "superkube-system", f"--field-selector=spec.nodeName={node}")["items"]
    assert any(p["metadata"]["name"].startswith("superkube-node-health-") for p in agents)
    # cleared by the command too (`returned` clears again: a no-op by then)
    cleared = subprocess.run(
        [*command, "clear"], capture_output=True, text=True, cwd=tmp_path, env=env, timeout=180
    )
    assert cleared.returncode == 0, cleared.stderr
    assert re.fullmatch(
        rf"{node}: faults cleared \(\d+ scheduled event\(s\) gone\); uncordon it when it reads healthy",
        " ".join(cleared.stdout.split()),
    ), cleared.stdout


def test_a_scheduled_reboot_is_drained_for_approved_before_its_time_and_back_in_service_after(
    loop: Lab, returned: list[str]
) -> None:
    since = datetime.now(UTC)
    node = "gpu-2"
    uid = get(loop, "node", node)["metadata"]["uid"]
    workload(loop, "under-maintenance", node)
    returned.append(node)
    said = faults.inject(loop, node, "scheduled-event", "Reboot", 300)
    assert "Reboot scheduled" in said
    there = cordoned(loop, node)
    assert "scheduled Platform Reboot" in there["metadata"]["annotations"][health.ANNOTATION]
    assert there["metadata"]["annotations"][health.CORDON_KIND] == "maintenance"
    gone(loop, "under-maintenance")
    vm = faults._vm_name(loop, node)
    events = Path(loop.state_dir) / imds.EVENTS
    (event,) = wait_for(
        "the event approved",
        lambda: [e for e in imds.events_of(events, vm) if e.get("approved_at")],
        timeout=120,
    )
    # approved after the drain, before its NotBefore, and Started as Azure reports it
    drained_at = datetime.fromisoformat(notes(loop, node)[health.DRAINED_AT].replace("Z", "+00:00"))
    approved = datetime.fromisoformat(event["approved_at"])
    added = json.loads(events.read_text())[vm]  # NotBefore is empty once Started: from the description
    assert event["EventStatus"] == "Started" and event["NotBefore"] == ""
    assert drained_at <= approved, (drained_at, approved)
    scheduled = parsedate_to_datetime(said.split("not before ", 1)[1].split(" (event")[0])
    assert approved < scheduled, (approved, scheduled)
    assert added["incarnation"] >= 2
    # Azure's part, done: the maintenance is over and the event leaves the document. The controller
    # returns the node by itself, the same Node (its VM never deleted), without health's marks
    assert imds.clear_events(events, vm) == 1
    back = wait_for(f"{node}: uncordoned by the controller",
                    lambda: (lambda n: n if not n["spec"].get("unschedulable") else None)(get(loop, "node", node)),
                    timeout=120)  # fmt: skip
    assert back["metadata"]["uid"] == uid
    left = back["metadata"].get("annotations") or {}
    assert not {health.ANNOTATION, health.CORDON_KIND, health.DRAINED_AT} & set(left), left
    assert left[health.VERDICT_ANNOTATION] == "healthy"
    assert {"MaintenanceCordon", "ScheduledEventApproved", "MaintenanceOver"} <= reasons(loop, node, since)


def test_a_node_cut_off_from_the_api_servers_is_cordoned_for_it(loop: Lab, returned: list[str]) -> None:
    since = datetime.now(UTC)
    node = "gpu-2"
    returned.append(node)
    faults.inject(loop, node, "api-unreachable")
    # three failed rounds in a row, then fatal: its agent reaches the API through the Service
    there = cordoned(loop, node, timeout=180)
    assert "API servers unreachable at" in there["metadata"]["annotations"][health.ANNOTATION]
    assert "NodeHealthCordon" in reasons(loop, node, since)


def test_a_gpu_off_the_bus_from_the_fault_command_cordons_the_node(loop: Lab, returned: list[str]) -> None:
    since = datetime.now(UTC)
    node = "gpu-1"
    workload(loop, "on-a-sick-gpu", node)
    returned.append(node)
    faults.inject(loop, node, "gpu-fatal")
    there = cordoned(loop, node)
    assert "79" in there["metadata"]["annotations"][health.ANNOTATION]
    gone(loop, "on-a-sick-gpu")
    assert "GPUHealthCordon" in reasons(loop, node, since)
