"""Remediation: which nodes health cordoned leave the fleet, when, and how many; their instances
deleted through the loopback Resource Manager (tests/fleet/resource_manager.py, which keeps Azure's
documented rules: a bearer token, an api-version, a long-running delete of `instanceIds` that
removes the instances and lowers the set's capacity), the VM checked by its computer name first."""

from __future__ import annotations

import ast
import itertools
import json
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from superkube.agents import kubeapi
from superkube.agents import node_health as nh
from superkube.agents import remediation as rem
from superkube.agents import scale_governor as gov
from superkube.cluster import health, remediation
from superkube.cluster.cloudinit import POOL_LABEL
from superkube.harness.apiserver import LocalApi
from superkube.plan import engine as planning
from tests.agents.conftest import admin, apply, make_node, policy_loaded
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


SCOPE = "/subscriptions/00000000-0000-0000-0000-00000000abcd/resourceGroups/rg-test"
_tests = itertools.count()


def test_the_breaker_lets_one_node_of_any_pool_go_then_holds_the_share() -> None:
    """Pools of 1, 2, 16, 20 and 100 nodes past preflight at 5 %: the first failure of each may be
    cordoned (and its VM replaced); a second only where 5 % of the pool is two nodes or more."""
    for size, allowed in ((1, 1), (2, 1), (16, 1), (20, 1), (40, 2), (100, 5)):
        assert health.may_cordon(0, size, 0.05), size
        assert [health.may_cordon(k, size, 0.05) for k in range(allowed + 1)] == [True] * allowed + [False], (
            size
        )
        assert not health.breaker_open(allowed, size, 0.05) and health.breaker_open(allowed + 1, size, 0.05)
        assert rem.breaker_open(allowed, size, 0.05) == health.breaker_open(allowed, size, 0.05)
        assert rem.breaker_open(allowed + 1, size, 0.05) == health.breaker_open(allowed + 1, size, 0.05)
        one = fleet(node("gpu0-000000", cordoned_ago=600, drained=True), size=size)
        assert decided(one).delete == ["gpu0-000000"], size  # a one-node pool's broken node goes too


def test_a_maintenance_cordon_is_never_deleted_nor_counted_by_the_breaker() -> None:
    upkeep = node("gpu0-000001", cordoned_ago=8 * DAY, drained=True)  # past any deadline
    upkeep["metadata"]["annotations"][FACTS.kind] = FACTS.maintenance
    broken = node("gpu0-000002", cordoned_ago=600, drained=True)
    d = decided(fleet(upkeep, broken, size=16))
    assert d.delete == ["gpu0-000002"] and d.reasons == {"gpu0-000001": "maintenance"}


def test_a_drain_from_before_this_cordon_is_not_this_cordons_drain() -> None:
    again = node("gpu0-000001", cordoned_ago=600)
    again["metadata"]["annotations"][FACTS.drained_at] = stamp(NOW - 3600)  # left by an earlier cordon
    d = decided(fleet(again))
    assert d.delete == [] and d.reasons == {"gpu0-000001": "not-drained"}


# --- the service on the real API server, as its own user, and the loopback Resource Manager -------


@dataclass
class Bench:
    """One test's cluster: its own scale-set prefixes and pool on the session's API server, nodes
    made by the admin as kubelets and health would, remediation as its own fenced user."""

    api: LocalApi
    rm: ResourceManager
    sets: list[rem.ScaleSet]
    kube: rem.NodeWriter

    @property
    def pool(self) -> str:
        return self.sets[0].pool

    def name(self, s: int, i: int) -> str:
        return f"{self.sets[s].prefix}{i:06d}"

    def node(self, name: str, *, cordoned: bool = True, drained: bool = True, kind: str = "failure") -> None:
        make_node(self.api, name, {POOL_LABEL: self.pool})
        if cordoned:
            at = kubeapi.now() - timedelta(minutes=10)
            admin(self.api).patch_node(
                name, nh.cordon_patch("fatal: node: root filesystem remounted read-only", at, kind)
            )
            if drained:
                admin(self.api).patch_node(name, {"metadata": {"annotations": {nh.DRAINED_AT: kubeapi.stamp(at + timedelta(minutes=5))}}})  # fmt: skip

    def service(
        self, max_per_hour: int = 10, metrics: rem.Metrics | None = None, share: float = 0.05
    ) -> rem.Remediation:
        return rem.Remediation(self.kube, Instances(SCOPE, "client", self.rm.url), FACTS, self.sets,
                               {self.pool: 7.0}, max_per_hour, share, metrics=metrics)  # fmt: skip

    def nodes(self) -> dict[str, Any]:
        return {
            n.metadata.name: n
            for n in admin(self.api).list_node(label_selector=f"{POOL_LABEL}={self.pool}").items
        }

    def vmss(self, s: int) -> str:
        return f"{SCOPE}/providers/Microsoft.Compute/virtualMachineScaleSets/{self.sets[s].name}"


@pytest.fixture(scope="module")
def fenced(api: LocalApi) -> LocalApi:
    from modules.platform import node_health as component

    apply(api, *component.remediation_access())
    from kubernetes import client, config

    me = client.CoreV1Api(config.new_client_from_config(
        config_file=str(api.client_kubeconfig("remediation", remediation.USER))))  # fmt: skip
    policy_loaded(api, me.delete_node, "rem-fence")
    return api


@pytest.fixture
def bench(fenced: LocalApi) -> Iterator[Bench]:
    from kubernetes.client.exceptions import ApiException

    t = next(_tests)
    sets = [rem.ScaleSet(f"vmss-r{t}-{k}", f"r{t}g{k}-", f"rem{t}") for k in range(2)]
    try:  # each test starts its own hour: the ledger is the cluster's, shared by the session's tests
        admin(fenced).delete_namespaced_config_map(rem.LEDGER, "kube-system")
    except ApiException as e:
        assert e.status == 404
    with ResourceManager() as server:
        for s in sets:
            path = f"{SCOPE}/providers/Microsoft.Compute/virtualMachineScaleSets/{s.name}"
            server.add(path, {"sku": {"name": "Standard_ND96isr_H100_v5", "capacity": 4}, "properties": {}})
            for i in range(3):
                server.add_instance(path, str(i), f"{s.prefix}{i:06d}", {"id": "image"})
            server.add_instance(path, "35", f"{s.prefix}00000Z", {"id": "image"})  # as Azure writes it
        kube = rem.NodeWriter(fenced.client_kubeconfig("remediation", remediation.USER))
        yield Bench(fenced, server, sets, kube)


class Instances(rem.AzureInstances):
    def token(self) -> str:  # the governor's token path (tested with it); the loopback's token here
        return TOKEN


def test_a_drained_node_is_deleted_from_its_scale_set_then_from_the_cluster(bench: Bench) -> None:
    sick = bench.name(0, 2)
    bench.node(sick)
    for i in (0, 1):
        bench.node(bench.name(0, i), cordoned=False)
    metrics = rem.Metrics()
    svc = bench.service(metrics=metrics)
    assert svc.once().delete == [sick]
    assert ("POST", f"{bench.vmss(0)}/delete") in bench.rm.writes()
    assert FACTS.requested_at in bench.nodes()[sick].metadata.annotations
    # the operation finishes as Azure's does (polled); then the instance is gone, and so is the Node
    for _ in range(5):
        svc.once()
        if sick not in bench.nodes():
            break
    assert [i["instanceId"] for i in bench.rm.instances(bench.vmss(0))] == ["0", "1", "35"]
    assert bench.rm.get(bench.vmss(0))["sku"]["capacity"] == 3 and sick not in bench.nodes()
    assert len(svc.ledger.recent(time.time())) == 1, "one deletion counted in the hour"
    assert metrics.deletions.labels("deleted")._value.get() == 1 and metrics.budget._value.get() == 9


def test_the_hours_budget_holds_across_a_restart(bench: Bench) -> None:
    first, second = bench.name(0, 1), bench.name(1, 2)
    bench.node(first)
    bench.node(second)
    assert bench.service(max_per_hour=1, share=1.0).once().delete == [first]
    restarted = bench.service(max_per_hour=1, metrics=rem.Metrics(), share=1.0)  # a new process, or leader
    d = restarted.once()
    assert d.delete == [] and d.reasons[second] == "budget"
    assert ("POST", f"{bench.vmss(1)}/delete") not in bench.rm.writes()
    assert restarted.metrics is not None and restarted.metrics.held.labels("budget")._value.get() == 1
    ledger = admin(bench.api).read_namespaced_config_map(rem.LEDGER, "kube-system")
    assert [node for _, node in json.loads(ledger.data["deletions"])] == [first]


def test_a_ledger_it_cannot_read_deletes_nothing(bench: Bench) -> None:
    bench.node(bench.name(0, 1))
    admin(bench.api).create_namespaced_config_map(
        "kube-system", {"metadata": {"name": rem.LEDGER}, "data": {"deletions": "half a list ["}}
    )
    with pytest.raises(gov.ServiceError, match="not a list of"):
        bench.service().once()
    assert bench.rm.writes() == []


def test_the_instance_named_in_upper_case_is_the_node_named_in_lower_case(bench: Bench) -> None:
    lower = f"{bench.sets[0].prefix}00000z"  # instance 35, which Azure names ...00000Z
    bench.node(lower)
    assert bench.service().once().delete == [lower]
    assert "35" not in [i["instanceId"] for i in bench.rm.instances(bench.vmss(0))]


def test_an_instance_that_is_another_vm_is_never_deleted(bench: Bench) -> None:
    bench.rm.get(f"{bench.vmss(0)}/virtualMachines/1")["properties"]["osProfile"]["computerName"] = "reused"
    bench.node(bench.name(0, 1))
    metrics = rem.Metrics()
    bench.service(metrics=metrics).once()
    assert ("POST", f"{bench.vmss(0)}/delete") not in bench.rm.writes()
    assert metrics.deletions.labels("refused")._value.get() == 1
    assert bench.service().ledger.recent(time.time()) == []


def test_a_node_cordoned_for_maintenance_is_never_deleted_and_the_server_refuses_it_too(bench: Bench) -> None:
    upkeep = bench.name(0, 1)
    bench.node(upkeep, kind="maintenance")
    metrics = rem.Metrics()
    d = bench.service(metrics=metrics).once()
    assert d.delete == [] and d.reasons[upkeep] == "maintenance"  # (earlier tests' nodes: no set of this one)
    assert metrics.held.labels("maintenance")._value.get() >= 1 and bench.rm.writes() == []  # (others' too)
    mark = {"metadata": {"annotations": {FACTS.requested_at: kubeapi.stamp(kubeapi.now())}}}
    with pytest.raises(gov.ServiceError, match="cordoned for a failure"):
        bench.kube.patch(f"/api/v1/nodes/{upkeep}", mark)


def test_the_program_is_two_files_on_python3_beside_the_governor(tmp_path: Path, api: LocalApi) -> None:
    """The role copies this file and the governor's to the API-server hosts; nothing else of
    superkube. Run so, it loads its settings and its kubeconfig."""
    tree = ast.parse(Path(rem.__file__).read_text())
    names = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    names |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert names - set(sys.stdlib_module_names) == {"superkube", "scale_governor", "prometheus_client"}
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


def test_an_instance_gone_already_is_cleaned_up_not_counted_as_refused(bench: Bench) -> None:
    """Deleted by a person, or by a round whose mark did not land: the node is marked, and its Node
    deleted the round after; nothing is asked of Azure and nothing is counted against the hour."""
    sick = bench.name(0, 2)
    bench.node(sick)
    bench.rm.resources.pop(f"{bench.vmss(0)}/virtualMachines/2".lower())  # gone from Azure already
    metrics = rem.Metrics()
    svc = bench.service(metrics=metrics)
    svc.once()
    assert metrics.deletions.labels("gone")._value.get() == 1
    assert metrics.deletions.labels("refused")._value.get() == 0
    assert ("POST", f"{bench.vmss(0)}/delete") not in bench.rm.writes()
    svc.once()
    assert sick not in bench.nodes() and svc.ledger.recent(time.time()) == []


class Stale:
    """The fenced client, but its list of nodes is the one taken before: a round whose deletions took
    long enough for a node to change under it."""

    def __init__(self, kube: rem.NodeWriter) -> None:
        self.kube, self.listed = kube, kube.get("/api/v1/nodes")

    def get(self, path: str) -> Any:
        return self.listed if path == "/api/v1/nodes" else self.kube.get(path)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.kube, name)


def test_a_node_uncordoned_since_the_rounds_list_is_not_deleted(bench: Bench) -> None:
    back = bench.name(0, 1)
    bench.node(back)
    stale = Stale(bench.kube)
    admin(bench.api).patch_node(back, {"spec": {"unschedulable": False}})  # its GPU reset cleared it
    svc = bench.service()
    svc.kube = stale
    svc.ledger = rem.Ledger(stale)
    svc.once()
    assert ("POST", f"{bench.vmss(0)}/delete") not in bench.rm.writes()
    assert svc.ledger.recent(time.time()) == []


def test_two_leaders_cannot_both_spend_the_hour(bench: Bench) -> None:
    """The ledger's write is checked against what it was read at: a second writer that read before the
    first wrote is refused, and one that reads after sees the hour spent."""
    first, second = rem.Ledger(bench.kube), rem.Ledger(bench.kube)
    now = time.time()
    first.record("a", now, 1)
    with pytest.raises(gov.ServiceError, match="already"):
        second.record("b", now, 1)
    assert first.recent(now) == [float(int(now))]
