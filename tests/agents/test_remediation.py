"""Remediation: which nodes health cordoned leave the fleet, when, and how many; their instances
deleted through the loopback Resource Manager (tests/fleet/resource_manager.py, which keeps Azure's
documented rules: a bearer token, an api-version, a long-running delete of `instanceIds` that
removes the instances and lowers the set's capacity), the VM checked by its computer name first."""

from __future__ import annotations

import ast
import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from superkube.agents import node_health as nh
from superkube.agents import remediation as rem
from superkube.agents import scale_governor as gov
from superkube.cluster import remediation
from superkube.cluster.cloudinit import POOL_LABEL
from superkube.harness.apiserver import LocalApi
from superkube.plan import engine as planning
from tests.fleet.resource_manager import TOKEN, ResourceManager

ROOT = Path(__file__).resolve().parents[2]
_, FLAGSHIP, ADDRESSES = planning.load(ROOT, "flagship")
SETTINGS = remediation.settings(FLAGSHIP, ADDRESSES)
FACTS = rem.NodeFacts(**SETTINGS["node_facts"])
SETS = [rem.ScaleSet("vmss-gpu-0", "gpu0-", "gpu"), rem.ScaleSet("vmss-gpu-1", "gpu1-", "gpu")]
NOW = 1_800_000_000.0  # 2027-01-15
DAY = 86400


def stamp(t: float) -> str:
    from datetime import UTC, datetime

    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def node(name: str, *, cordoned_ago: float | None = None, drained: bool = False, pool: str = "gpu",
         requested: bool = False) -> dict[str, Any]:  # fmt: skip
    notes: dict[str, str] = {}
    if cordoned_ago is not None:
        notes = {nh.ANNOTATION: "fatal: node: root filesystem remounted read-only",
                 nh.ANNOTATION_AT: stamp(NOW - cordoned_ago)}  # fmt: skip
    if drained:
        notes[nh.DRAINED_AT] = stamp(NOW - 10)
    if requested:
        notes[FACTS.requested_at] = stamp(NOW - 60)
    return {
        "metadata": {"name": name, "labels": {POOL_LABEL: pool}, "annotations": notes},
        "spec": {"unschedulable": cordoned_ago is not None},
    }


def fleet(*special: dict[str, Any], size: int = 40) -> list[dict[str, Any]]:
    named = {n["metadata"]["name"] for n in special}
    rest = [node(f"gpu0-{i:06d}") for i in range(size) if f"gpu0-{i:06d}" not in named]
    return [*special, *rest]


def decided(nodes: list[dict[str, Any]], left: int = 10, **kw: Any) -> rem.Decision:
    return rem.decide(nodes, FACTS, SETS, {"gpu": 7.0}, 0.05, left, NOW, **kw)


def test_the_settings_name_the_plans_scale_sets_and_health_s_own_annotations() -> None:
    assert FACTS.cordoned == nh.ANNOTATION and FACTS.drained_at == nh.DRAINED_AT
    planned = {s.name for pool in FLAGSHIP.node_pools for s in ADDRESSES.pool_scale_sets(pool.name)}
    assert {s["name"] for s in SETTINGS["scale_sets"]} == planned
    assert all(s["prefix"].startswith(s["pool"]) for s in SETTINGS["scale_sets"])


def test_a_node_name_is_its_scale_set_prefix_and_its_instance_id_in_base_36() -> None:
    assert rem.instance_of("gpu0-00000a", SETS) == (SETS[0], "10")
    assert rem.instance_of("gpu1-0000zz", SETS) == (SETS[1], str(35 * 36 + 35))
    assert rem.instance_of("gpu0-0000a", SETS) is None  # five digits: not an instance's name
    assert rem.instance_of("cpu0-000001", SETS) is None


def test_a_drained_node_goes_at_once_an_undrained_one_after_its_deadline() -> None:
    d = decided(fleet(node("gpu0-000001", cordoned_ago=600, drained=True),
                      node("gpu0-000002", cordoned_ago=DAY)))  # fmt: skip
    assert d.delete == ["gpu0-000001"] and "not drained" in d.held["gpu0-000002"]
    d = decided(fleet(node("gpu0-000002", cordoned_ago=7 * DAY + 1)))
    assert d.delete == ["gpu0-000002"]


def test_the_hours_limit_and_the_breaker_hold_deletions() -> None:
    sick = [node(f"gpu0-{i:06d}", cordoned_ago=600 + i, drained=True) for i in range(2)]
    d = decided(fleet(*sick), left=1)
    assert d.delete == ["gpu0-000001"]  # the older cordon first
    assert "spent" in d.held["gpu0-000000"]
    many = [node(f"gpu0-{i:06d}", cordoned_ago=600, drained=True) for i in range(3)]  # 3 of 40 > 5 %
    d = decided(fleet(*many))
    assert d.delete == [] and all("breaker" in why for why in d.held.values())


def test_a_requested_node_is_forgotten_once_its_instance_is_gone() -> None:
    asked = node("gpu0-000003", cordoned_ago=600, drained=True, requested=True)
    assert decided(fleet(asked), gone=lambda name: False) == rem.Decision([], [], {})
    assert decided(fleet(asked), gone=lambda name: True).forget == ["gpu0-000003"]


class Kube:
    """The three calls the service makes, on canned nodes."""

    def __init__(self, nodes: list[dict[str, Any]]) -> None:
        self.nodes = {n["metadata"]["name"]: n for n in nodes}

    def get(self, path: str) -> Any:
        assert path == "/api/v1/nodes"
        return {"items": list(self.nodes.values())}

    def patch(self, path: str, body: Any) -> None:
        self.nodes[path.rsplit("/", 1)[1]]["metadata"]["annotations"].update(body["metadata"]["annotations"])

    def delete(self, path: str) -> None:
        self.nodes.pop(path.rsplit("/", 1)[1])


SCOPE = "/subscriptions/00000000-0000-0000-0000-00000000abcd/resourceGroups/rg-test"


@pytest.fixture
def rm() -> Iterator[ResourceManager]:
    with ResourceManager() as server:
        for s in SETS:
            path = f"{SCOPE}/providers/Microsoft.Compute/virtualMachineScaleSets/{s.name}"
            server.add(path, {"sku": {"name": "Standard_ND96isr_H100_v5", "capacity": 4}, "properties": {}})
            for i in range(3):
                server.add_instance(path, str(i), f"{s.prefix}{i:06d}", {"id": "image"})
            server.add_instance(path, "35", f"{s.prefix}00000Z", {"id": "image"})  # as Azure writes it
        yield server


class Instances(rem.AzureInstances):
    def token(self) -> str:  # the governor's token path (tested with it); the loopback's token here
        return TOKEN


def service(kube: Kube, rm: ResourceManager) -> rem.Remediation:
    return rem.Remediation(kube, Instances(SCOPE, "client", rm.url), FACTS, SETS, {"gpu": 7.0}, 10, 0.5,
                           clock=lambda: NOW)  # fmt: skip


def test_a_drained_node_is_deleted_from_its_scale_set_then_from_the_cluster(rm: ResourceManager) -> None:
    kube = Kube(fleet(node("gpu0-000002", cordoned_ago=600, drained=True), size=3))
    svc = service(kube, rm)
    assert svc.once().delete == ["gpu0-000002"]
    vmss = f"{SCOPE}/providers/Microsoft.Compute/virtualMachineScaleSets/vmss-gpu-0"
    assert ("POST", f"{vmss}/delete") in rm.writes()
    assert FACTS.requested_at in kube.nodes["gpu0-000002"]["metadata"]["annotations"]
    # the operation finishes as Azure's does (polled); then the instance is gone, and so is the Node
    for _ in range(5):
        svc.once()
        if "gpu0-000002" not in kube.nodes:
            break
    assert [i["instanceId"] for i in rm.instances(vmss)] == ["0", "1", "35"]
    assert rm.get(vmss)["sku"]["capacity"] == 3 and "gpu0-000002" not in kube.nodes
    assert len(svc.done) == 1, "one deletion counted in the hour"


def test_the_instance_named_in_upper_case_is_the_node_named_in_lower_case(rm: ResourceManager) -> None:
    kube = Kube(fleet(node("gpu0-00000z", cordoned_ago=600, drained=True), size=3))
    svc = service(kube, rm)
    assert svc.once().delete == ["gpu0-00000z"]
    vmss = f"{SCOPE}/providers/Microsoft.Compute/virtualMachineScaleSets/vmss-gpu-0"
    assert "35" not in [i["instanceId"] for i in rm.instances(vmss)]


def test_an_instance_that_is_another_vm_is_never_deleted(rm: ResourceManager) -> None:
    vmss = f"{SCOPE}/providers/Microsoft.Compute/virtualMachineScaleSets/vmss-gpu-0"
    rm.get(f"{vmss}/virtualMachines/1")["properties"]["osProfile"]["computerName"] = "gpu0-reused"
    kube = Kube(fleet(node("gpu0-000001", cordoned_ago=600, drained=True), size=3))
    svc = service(kube, rm)
    svc.once()
    assert ("POST", f"{vmss}/delete") not in rm.writes() and not svc.done


def test_the_program_is_two_files_on_python3_beside_the_governor(tmp_path: Path, api: LocalApi) -> None:
    """The role copies this file and the governor's to the API-server hosts; nothing else of
    superkube. Run so, it loads its settings and its kubeconfig."""
    tree = ast.parse(Path(rem.__file__).read_text())
    names = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    names |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert names - set(sys.stdlib_module_names) == {"superkube", "scale_governor"}
    host = tmp_path / "lib"
    host.mkdir()
    shutil.copy(rem.__file__, host / "remediation.py")
    shutil.copy(gov.__file__, host / "scale_governor.py")
    settings = {"scope": SCOPE, "client_id": "c", **SETTINGS}  # as the role writes them
    config = tmp_path / "remediation.json"
    config.write_text(json.dumps(settings))
    kubeconfig = api.client_kubeconfig("remediation", "superkube-remediation")
    run = [
        sys.executable,
        "-I",
        str(host / "remediation.py"),
        "--config",
        str(config),
        "--kubeconfig",
        str(kubeconfig),
    ]
    proc = subprocess.run([*run, "--check"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    config.write_text(json.dumps({**settings, "max_per_hour": 0}))
    proc = subprocess.run([*run, "--check"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr


def reset_node(name: str, verdict_hint: bool, outcome: str = "", outcome_ago: float = 0) -> dict[str, Any]:
    """A node cordoned 2 h ago and drained 10 s ago, reported fatal (with the reset hint or not), its
    GPU reset's outcome (cleared, failed) `outcome_ago` seconds ago, if any."""
    n = node(name, cordoned_ago=7200, drained=True)
    value = "fatal: GPU 1: Xid 48: double-bit ECC error" + (FACTS.reset_hint if verdict_hint else "")
    n["metadata"]["annotations"][FACTS.verdict] = value
    if outcome:
        n["metadata"]["annotations"][FACTS.gpu_reset] = f"{outcome} {stamp(NOW - outcome_ago)}"
    return n


def test_a_node_a_gpu_reset_may_bring_back_is_not_deleted_while_the_reset_is_due_or_cleared_it() -> None:
    assert FACTS.reset_hint and FACTS.gpu_reset and FACTS.verdict  # the settings carry what it reads
    wait = SETTINGS["reset_wait_s"]
    due = reset_node("gpu0-000001", True)  # drained, reset not done yet
    cleared = reset_node("gpu0-000002", True, "cleared", 60)  # the controller is about to uncordon it
    failed = reset_node("gpu0-000003", True, "failed", 60)
    no_hint = reset_node("gpu0-000004", False)  # Xid 79 and the like: nothing to wait for
    stale = reset_node("gpu0-000005", True, "cleared", wait + 1)  # cleared long ago, never uncordoned
    old = reset_node("gpu0-000006", True, "failed", 3 * 3600)  # a previous cordon's outcome: history
    got = rem.decide(fleet(due, cleared, failed, no_hint, stale, old), FACTS, SETS, {"gpu": 7.0}, 0.5, 10,
                     NOW, reset_wait_s=wait)  # fmt: skip
    assert sorted(got.delete) == ["gpu0-000003", "gpu0-000004", "gpu0-000005"]
    assert set(got.held) == {"gpu0-000001", "gpu0-000002", "gpu0-000006"}
    assert "GPU reset" in got.held["gpu0-000001"]
    # a reset asked for but never ended holds the node only `reset_wait_s` from the drain
    later = rem.decide(fleet(due), FACTS, SETS, {"gpu": 7.0}, 0.5, 10, NOW + wait, reset_wait_s=wait)
    assert later.delete == ["gpu0-000001"]
