"""The agents against the real API server (etcd and kube-apiserver at the pinned versions, on
loopback), for what only the server can say: how it applies a patch to a node that has no taints,
that it refuses a second object of the same name, what a refusal looks like next to an outage, and
what the health agent's breaker finds on real Node objects."""

from __future__ import annotations

import contextlib
import json
import logging
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml

from superkube.agents import gpu_probe, kubeapi, team_taints
from superkube.agents import node_health as nh
from superkube.agents.kubeapi import Kube
from superkube.harness.apiserver import LocalApi
from superkube.model import teams
from tests.agents.conftest import (
    admin,
    apply,
    identity,
    make_node,
    make_pod,
    namespace,
    policy_loaded,
    unique,
)

READINGS = Path(__file__).parent / "readings"


def verdict(reading: str, node: str) -> gpu_probe.Verdict:
    doc = json.loads((READINGS / f"{reading}.json").read_text())
    return gpu_probe.verdict(gpu_probe.Reading.model_validate({**doc, "node": node}), gpu_probe.thresholds())


def events_about(api: LocalApi, node: str) -> list[Any]:
    items = admin(api).list_namespaced_event("default", field_selector=f"involvedObject.name={node}").items
    return list(items)


def test_every_event_of_one_round_is_kept(api: LocalApi) -> None:
    """Several Events about one node at one instant (a cordon and its evictions) all land: the
    server names each, where one name made from the time made it refuse the second (409)."""
    kube = Kube(str(api.kubeconfig))
    node = make_node(api, unique("events"))
    at = kubeapi.now()
    for reason in ("GPUHealthCordon", "GPUHealthEvict", "GPUHealthEvict"):
        kube.create_event(kubeapi.event(node, nh.COMPONENT, "Warning", reason, "why", at))
    got = events_about(api, node["metadata"]["name"])
    assert sorted(e.reason for e in got) == ["GPUHealthCordon", "GPUHealthEvict", "GPUHealthEvict"]
    assert len({e.metadata.name for e in got}) == 3


@pytest.fixture
def teams_file(tmp_path: Path) -> Path:
    path = tmp_path / "teams.yaml"
    path.write_text(yaml.safe_dump([{"selector": {"rack": "r7"}, "team": "research", "priority": 0}]))
    return path


def test_the_team_taint_reaches_a_node_that_has_no_taints(api: LocalApi, teams_file: Path) -> None:
    """A node with no taints has no taints field on the server: the patch must not `test` one."""
    name = unique("bare")
    make_node(api, name, {"rack": "r7"})
    kube = Kube(str(api.kubeconfig))
    assert "taints" not in kube.node(name)["spec"]
    changes = reconcile(teams_file, kube)
    assert changes.get("add", 0) >= 1
    assert kube.node(name)["spec"]["taints"] == [teams.taint("research")]
    assert reconcile(teams_file, kube) == {}  # right now: nothing more to write


@contextlib.contextmanager
def watched(kube: Kube) -> Iterator[team_taints.WatchedNodes]:
    """The client with the node list from a watch, as the reconciler's process has it."""
    stop = threading.Event()
    nodes = team_taints.WatchedNodes(kube, stop)
    try:
        yield nodes
    finally:
        stop.set()
        nodes.watch.close()
        nodes.namespaces.close()


def reconcile(teams_file: Path, kube: Kube) -> dict[str, int]:
    """One round of a reconciler that has just started (its first list, from its watch)."""
    with watched(kube) as nodes:
        return team_taints.Reconciler(teams_file, nodes).round()


class StaleReads:
    """The watched list, but one node changes after it was read and before the patches go."""

    def __init__(self, kube: team_taints.WatchedNodes, api: LocalApi, changed: str) -> None:
        self.kube, self.api, self.changed = kube, api, changed

    def all_nodes(self) -> list[dict[str, Any]]:
        nodes = self.kube.all_nodes()
        other = {"spec": {"taints": [{"key": "example.com/maintenance", "effect": "NoSchedule"}]}}
        admin(self.api).patch_node(self.changed, other)
        return nodes

    def __getattr__(self, name: str) -> Any:
        return getattr(self.kube, name)


def test_a_node_changed_since_it_was_read_is_refused_and_the_round_goes_on(
    api: LocalApi, teams_file: Path
) -> None:
    changed, tainted, bare = unique("changed"), unique("tainted"), unique("bare")
    make_node(api, changed, {"rack": "r7"})  # no taints: guarded by its resourceVersion
    make_node(api, tainted, {"rack": "r7"}, [{"key": "x", "effect": "NoSchedule"}])
    make_node(api, bare, {"rack": "r7"})
    kube = Kube(str(api.kubeconfig))
    with watched(kube) as nodes:
        reconciler = team_taints.Reconciler(teams_file, StaleReads(nodes, api, changed))
        reconciler.round()
    # the change made after the read is kept, not overwritten; the nodes after it were still done
    assert kube.node(changed)["spec"]["taints"] == [
        {"key": "example.com/maintenance", "effect": "NoSchedule"}
    ]
    assert kube.node(tainted)["spec"]["taints"] == [
        {"key": "x", "effect": "NoSchedule"},
        teams.taint("research"),
    ]
    assert kube.node(bare)["spec"]["taints"] == [teams.taint("research")]
    refused = {k: v for k, v in _samples(reconciler.metrics.registry, "superkube_team_taint_refused_total")}
    assert sum(refused.values()) == 1 and set(refused) <= {"409", "422"}, refused
    reconcile(teams_file, kube)  # the next round sets it
    assert teams.taint("research") in kube.node(changed)["spec"]["taints"]


def test_each_namespace_labelled_with_a_team_is_a_series_of_its_team(api: LocalApi, teams_file: Path) -> None:
    """The join the store makes of per-namespace figures with teams: the reconciler follows the
    namespaces labelled with a team (a watch of their own) and exports one series each; a relabel
    moves it, a namespace whose label goes has none."""
    kube = Kube(str(api.kubeconfig))
    research, infer, plain = unique("research"), unique("infer"), unique("plain")
    namespace(api, research, {teams.TEAM_KEY: "research"})
    namespace(api, infer, {teams.TEAM_KEY: "inference"})
    namespace(api, plain)

    def series(reconciler: team_taints.Reconciler) -> dict[str, str]:
        found = [s.labels for m in reconciler.metrics.registry.collect() for s in m.samples
                 if s.name == "superkube_namespace_team" and s.value == 1]  # fmt: skip
        return {s["namespace"]: s["team"] for s in found if s["namespace"] in (research, infer, plain)}

    with watched(kube) as nodes:
        reconciler = team_taints.Reconciler(teams_file, nodes)
        reconciler.round()
        assert series(reconciler) == {research: "research", infer: "inference"}
        admin(api).patch_namespace(infer, {"metadata": {"labels": {teams.TEAM_KEY: "research"}}})
        admin(api).patch_namespace(research, {"metadata": {"labels": {teams.TEAM_KEY: None}}})
        deadline = time.monotonic() + 10
        while series(reconciler) != {infer: "research"} and time.monotonic() < deadline:
            time.sleep(0.2)
            reconciler.round()
        assert series(reconciler) == {infer: "research"}


def _samples(registry: Any, name: str) -> list[tuple[str, float]]:
    return [
        (s.labels.get("code", ""), s.value) for m in registry.collect() for s in m.samples if s.name == name
    ]


def test_a_refusal_is_said_as_the_servers_answer_not_as_an_outage(
    api: LocalApi, caplog: pytest.LogCaptureFixture
) -> None:
    kube = Kube(str(api.kubeconfig))
    up = nh.Metrics().api_up
    log = logging.getLogger("test-refusal")
    with caplog.at_level(logging.ERROR, logger="test-refusal"):
        kubeapi.serve(lambda: bool(kube.node("no-such-node")), up, log, 0.01, 1.0, rounds=2)
    assert up._value.get() == 1  # the server answered
    assert caplog.messages and all("404 Not Found" in m for m in caplog.messages), caplog.messages
    assert not any("unreachable" in m for m in caplog.messages)


def test_a_local_fault_is_raised_not_retried_as_an_outage() -> None:
    def round_() -> bool:
        raise FileNotFoundError(2, "No such file or directory", "/nowhere/vm_sizes.yaml")

    with pytest.raises(FileNotFoundError):
        kubeapi.serve(round_, nh.Metrics().api_up, logging.getLogger("t"), 0.01, 1.0, rounds=2)


def test_an_agent_without_rights_says_forbidden(api: LocalApi, tmp_path: Path) -> None:
    """The preflight agent as a service account no role binds: the log says what the server said."""
    ns = namespace(api, unique("norights"))
    node = unique("gpu")
    make_node(api, node)
    kubeconfig = identity(api, ns, "preflight", node)
    reading = tmp_path / "reading.json"
    reading.write_text(json.dumps({**json.loads((READINGS / "healthy.json").read_text()), "node": node}))
    command = [sys.executable, "-m", "superkube.agents.preflight", "--node", node, "--reading", str(reading),
               "--kubeconfig", str(kubeconfig), "--metrics-port", "0", "--metrics-address", "127.0.0.1",
               "--interval", "0.1", "--rounds", "2"]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stderr.count("403 Forbidden") == 2 and "unreachable" not in done.stderr, done.stderr
    assert f'nodes \\"{node}\\" is forbidden' in done.stderr or f'nodes "{node}" is forbidden' in done.stderr


def report(api: LocalApi, node: str, reading: str) -> None:
    """What the node's agent writes when it reads `reading` (as the admin: the agent's own write is
    tested as the agent)."""
    value = nh.note(verdict(reading, node))
    admin(api).patch_node(node, nh.report_patch(value, kubeapi.now()))


def controller(api: LocalApi, pool: str, share: float = 0.05) -> Any:
    """The health controller with the real client, following the pool's nodes with a real watch."""
    from superkube.agents import health_controller as hc
    from superkube.agents.informer import Informer

    kube = Kube(str(api.kubeconfig))
    watch = Informer(kube.core.list_node, slim=hc.slim, label_selector=f"superkube.io/pool={pool}")
    return hc.Controller(kube, lambda: (watch.sync(), watch.items())[1], frozenset({pool}), share)


def test_a_repaired_node_neither_holds_the_breaker_nor_escapes_a_second_cordon(api: LocalApi) -> None:
    """Twenty nodes past preflight, a 5 % share: one cordon is allowed. A node health cordoned once,
    then repaired and uncordoned by hand (its annotation left, as the recovery leaves it), is
    history: the breaker does not count it, and when it fails again it is cordoned again."""
    pool = unique("pool")
    names = [f"{pool}-{i}" for i in range(20)]
    for name in names:
        make_node(api, name, {"superkube.io/pool": pool})
    kube = Kube(str(api.kubeconfig))
    repaired = names[0]
    kube.patch_node(repaired, nh.cordon_patch("Xid 79 on GPU 3", kubeapi.now()))
    kube.patch_node(repaired, {"spec": {"unschedulable": False}})  # repaired and uncordoned by hand
    ctl = controller(api, pool)
    failing = names[1]  # a different node fails: one cordon in twenty is within the share
    report(api, failing, "xid-79-off-the-bus")
    decision = ctl.round()[failing]
    assert decision.cordon and not decision.breaker_open
    assert kube.node(failing)["spec"]["unschedulable"] is True
    kube.patch_node(failing, {"spec": {"unschedulable": False}})  # repaired too
    report(api, failing, "healthy")
    report(api, repaired, "xid-48-dbe")  # the repaired node fails again: cordoned again
    assert ctl.round()[repaired].cordon and kube.node(repaired)["spec"]["unschedulable"] is True


def test_the_breaker_holds_past_the_share_on_real_nodes_and_says_so_once(api: LocalApi) -> None:
    pool = unique("pool")
    names = [f"{pool}-{i:02d}" for i in range(40)]
    for name in names:
        make_node(api, name, {"superkube.io/pool": pool})
    for name in names[:3]:
        report(api, name, "xid-79-off-the-bus")
    ctl = controller(api, pool)
    first = ctl.round()
    assert [n for n, d in first.items() if d.cordon] == names[:2]  # 2 of 40 within 5 %
    assert first[names[2]].breaker_open
    assert ctl.metrics.breaker.labels(pool)._value.get() == 1
    assert ctl.metrics.cordoned.labels(pool)._value.get() == 2
    assert names[2] not in ctl.round()  # held, and not warned about again
    held = [e for e in events_about(api, names[2]) if e.reason == "HealthBreakerOpen"]
    assert len(held) == 1 and "3 of 40" in held[0].message
    assert admin(api).read_node(names[2]).spec.unschedulable is not True


def test_the_controller_evicts_through_the_real_eviction_api(api: LocalApi) -> None:
    """Evictions, with a PodDisruptionBudget that allows none (no controller-manager computes it
    here, so it allows nothing: the server answers 429 for its running pod): that pod stays and is
    tried again next round."""
    pool = unique("pool")
    for i in range(40):
        make_node(api, f"{pool}-{i}", {"superkube.io/pool": pool})
    node = f"{pool}-0"
    ns = namespace(api, unique("team"))
    make_pod(api, ns, "trainer-0", node)
    make_pod(api, ns, "held-0", node)
    admin(api).patch_namespaced_pod("held-0", ns, {"metadata": {"labels": {"app": "held"}}})
    # running (as a kubelet would report it): a pending pod may be evicted whatever its budget says
    running = {"status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}}
    admin(api).patch_namespaced_pod_status("held-0", ns, running)
    from kubernetes import client

    client.PolicyV1Api(admin(api).api_client).create_namespaced_pod_disruption_budget(
        ns,
        {
            "metadata": {"name": "held"},
            "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "held"}}},
        },
    )
    report(api, node, "xid-79-off-the-bus")
    ctl = controller(api, pool)
    decision = ctl.round()[node]
    assert sorted(p.name for p in decision.evict) == ["held-0", "trainer-0"]
    core = admin(api)
    assert core.read_namespaced_pod("trainer-0", ns).metadata.deletion_timestamp is not None
    assert core.read_namespaced_pod("held-0", ns).metadata.deletion_timestamp is None  # the budget held it
    assert ctl.draining == {node}
    again = ctl.round()[node]  # the next round tries what is left, and cordons nothing new
    assert not again.cordon and "held-0" in [p.name for p in again.evict]
    reasons = sorted(e.reason for e in events_about(api, node))
    assert reasons.count("GPUHealthCordon") == 1 and "GPUHealthEvict" in reasons


# --- the health agent and controller fenced in, on the real server ------------------------------


@pytest.fixture(scope="module")
def fenced(api: LocalApi) -> LocalApi:
    """The health agent's and controller's service accounts, roles and admission policies, as the
    layer renders them."""
    from modules.platform import node_health as component
    from modules.platform.foundation import NAMESPACE

    core = admin(api)
    if NAMESPACE not in {n.metadata.name for n in core.list_namespace().items}:
        namespace(api, NAMESPACE)
    apply(api, *component.agent_access("health"), *component.fence("health"))
    controller_objects = [m for m in component.controller(_args()) if m["kind"] != "Deployment"]
    apply(api, *controller_objects, *component.fence("health-controller"))
    return api


def _args() -> Any:
    from modules.platform import node_health as component
    from superkube.model import vmsizes
    from superkube.model.spec import NodePool

    pool = NodePool.model_validate(
        {
            "name": "gpu",
            "role": "gpu",
            "vm_size": "Standard_ND96isr_H100_v5",
            "nodes": 4,
            "gpus_per_node": 8,
            "pod_ips_per_node": 15,
        }
    )
    return component.NodeHealthArgs(pools=[(pool, vmsizes.size(pool.vm_size, "test"))])


def as_account(api: LocalApi, account: str, node: str) -> Any:
    from kubernetes import client, config

    from modules.platform.foundation import NAMESPACE

    kubeconfig = identity(api, NAMESPACE, account, node)
    return client.CoreV1Api(config.new_client_from_config(config_file=str(kubeconfig)))


# --- Azure's scheduled maintenance through the fenced controller, on the real server -------------


def maintenance(api: LocalApi, node: str, in_s: float) -> None:
    """What the node's agent writes while a Reboot is due for its VM in `in_s` seconds."""
    starts = kubeapi.now() + timedelta(seconds=in_s)
    value = (
        f"maintenance: node: scheduled Platform Reboot not before {starts:%Y-%m-%d %H:%M:%S} UTC (event E1)"
    )
    admin(api).patch_node(node, nh.report_patch(value, kubeapi.now(), kubeapi.stamp(starts)))


def fenced_controller(api: LocalApi, pool: str, as_node: str) -> Any:
    """The controller's code acting as its own service account (its role and admission policies)."""
    from modules.platform.foundation import NAMESPACE
    from superkube.agents import health_controller as hc
    from superkube.agents.informer import Informer

    kube = Kube(str(identity(api, NAMESPACE, hc.COMPONENT, as_node)))
    watch = Informer(kube.core.list_node, slim=hc.slim, label_selector=f"superkube.io/pool={pool}")
    return hc.Controller(kube, lambda: (watch.sync(), watch.items())[1], frozenset({pool}), 0.05)


def test_maintenance_is_cordoned_past_the_breaker_drained_and_uncordoned_once_over(fenced: LocalApi) -> None:
    """A pool of three: one node fails (the one cordon the breaker lets in), two more get a scheduled
    Reboot. Both are cordoned as maintenance all the same, marked drained once empty, and uncordoned
    by the controller once their agents report them healthy again. One that fails meanwhile would be
    a second failure in the pool: the breaker holds its cordon maintenance's, and says so."""
    pool = unique("upkeep")
    broken, rebooted, failing = (f"{pool}-{i}" for i in range(3))
    for name in (broken, rebooted, failing):
        make_node(fenced, name, {"superkube.io/pool": pool})
    report(fenced, broken, "xid-79-off-the-bus")
    maintenance(fenced, rebooted, 600)
    maintenance(fenced, failing, 600)
    ctl = fenced_controller(fenced, pool, broken)
    first = ctl.round()
    assert first[broken].cordon and first[broken].kind == "failure"
    assert first[rebooted].kind == first[failing].kind == "maintenance" and not first[rebooted].breaker_open
    notes = admin(fenced).read_node(rebooted).metadata.annotations
    assert notes[nh.CORDON_KIND] == "maintenance" and admin(fenced).read_node(rebooted).spec.unschedulable
    assert ctl.metrics.cordoned.labels(pool)._value.get() == 1  # the breaker counts the failure only
    ctl.round()
    assert nh.DRAINED_AT in admin(fenced).read_node(rebooted).metadata.annotations  # nothing on it: drained
    # the VM is back and its checks are clean; the other node's GPU failed while it waited
    time.sleep(1.1)  # the report is later than the cordon, to the second
    report(fenced, rebooted, "healthy")
    report(fenced, failing, "xid-79-off-the-bus")
    ctl.round()
    back = admin(fenced).read_node(rebooted)
    assert not back.spec.unschedulable and nh.ANNOTATION not in (back.metadata.annotations or {})
    assert nh.CORDON_KIND not in (back.metadata.annotations or {})
    assert [e.reason for e in events_about(fenced, rebooted)].count("MaintenanceOver") == 1
    still = admin(fenced).read_node(failing)
    assert still.spec.unschedulable and still.metadata.annotations[nh.CORDON_KIND] == "maintenance"
    assert ctl.metrics.breaker.labels(pool)._value.get() == 1
    assert "HealthBreakerOpen" in [e.reason for e in events_about(fenced, failing)]
    # a failure's cordon: the server refuses the controller's uncordon of it
    assert "uncordon only a node whose GPU reset cleared it" in refusal(
        lambda: ctl.kube.patch_node(broken, {"spec": {"unschedulable": False}})
    )


def test_pods_still_on_a_node_as_its_maintenance_starts_are_named_and_it_is_not_approved(
    fenced: LocalApi,
) -> None:
    """A pod a budget holds keeps the node from being drained: within PODS_LEFT_S of NotBefore the
    controller names it in one Warning Event and in the pool's gauge; the node is never marked
    drained, so its agent never approves the event (Azure starts it at NotBefore)."""
    from kubernetes import client

    pool = unique("late")
    node = f"{pool}-0"
    make_node(fenced, node, {"superkube.io/pool": pool})
    ns = namespace(fenced, unique("team"))
    make_pod(fenced, ns, "held-0", node)
    admin(fenced).patch_namespaced_pod("held-0", ns, {"metadata": {"labels": {"app": "held"}}})
    running = {"status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}}
    admin(fenced).patch_namespaced_pod_status("held-0", ns, running)
    client.PolicyV1Api(admin(fenced).api_client).create_namespaced_pod_disruption_budget(
        ns,
        {
            "metadata": {"name": "held"},
            "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "held"}}},
        },
    )
    maintenance(fenced, node, 120)  # within PODS_LEFT_S
    ctl = fenced_controller(fenced, pool, node)
    for _ in range(3):
        ctl.round()
    late = [e for e in events_about(fenced, node) if e.reason == "MaintenanceStartsWithPods"]
    assert len(late) == 1 and f"{ns}/held-0" in late[0].message and "not approved" in late[0].message
    assert ctl.metrics.pods_left.labels(pool)._value.get() == 1
    assert nh.DRAINED_AT not in admin(fenced).read_node(node).metadata.annotations


def refusal(call: Any) -> str:
    """The server's message for a call it refuses with 403 (retried while the new policy loads)."""
    from kubernetes.client.exceptions import ApiException

    deadline = time.monotonic() + 15
    while True:
        try:
            call()
        except ApiException as e:
            assert e.status == 403, (e.status, e.body)
            return str(json.loads(e.body)["message"])
        assert time.monotonic() < deadline, "admitted: the policy never refused it"
        time.sleep(0.5)


def test_a_refused_change_to_one_node_does_not_stop_the_round_for_the_others(fenced: LocalApi) -> None:
    """A person cordoned a node before its maintenance came: the controller's cordon of it is refused
    (the cordon's time is set only by the request that cordons); the next node is cordoned all the
    same."""
    pool = unique("refused")
    mine, next_ = f"{pool}-a", f"{pool}-b"
    for name in (mine, next_):
        make_node(fenced, name, {"superkube.io/pool": pool})
    admin(fenced).patch_node(mine, {"spec": {"unschedulable": True}})  # a person's cordon
    maintenance(fenced, mine, 600)
    maintenance(fenced, next_, 600)
    ctl = fenced_controller(fenced, pool, next_)
    ctl.round()
    assert admin(fenced).read_node(next_).metadata.annotations[nh.CORDON_KIND] == "maintenance"
    assert ctl.metrics.actions.labels("refused", "false")._value.get() >= 1


def test_a_node_that_fails_while_cordoned_for_maintenance_is_a_failures_not_a_reset(fenced: LocalApi) -> None:
    """Maintenance-cordoned and drained, then reported fatal with a fault a GPU reset may clear: the
    cordon becomes a failure's first (its time kept); no reset is asked for a maintenance cordon."""
    from superkube.cluster import health as facts

    pool = unique("fails")
    names = [f"{pool}-{i:02d}" for i in range(20)]
    for name in names:
        make_node(fenced, name, {"superkube.io/pool": pool})
    sick = names[0]
    maintenance(fenced, sick, 600)
    ctl = fenced_controller(fenced, pool, names[1])
    ctl.round()
    ctl.round()
    before = admin(fenced).read_node(sick).metadata.annotations
    assert nh.DRAINED_AT in before and before[nh.CORDON_KIND] == "maintenance"
    value = "fatal: GPU 1: Xid 48: double-bit ECC error" + facts.RESET_HINT
    admin(fenced).patch_node(sick, nh.report_patch(value, kubeapi.now()))
    ctl.round()
    after = admin(fenced).read_node(sick)
    assert after.metadata.annotations[nh.CORDON_KIND] == "failure"
    assert after.metadata.annotations[nh.ANNOTATION_AT] == before[nh.ANNOTATION_AT]
    assert facts.GPU_RESET_LABEL not in (after.metadata.labels or {})


def test_the_health_agent_may_only_report_on_its_own_node(fenced: LocalApi) -> None:
    pool = unique("fence")
    mine, other = f"{pool}-a", f"{pool}-b"
    for name in (mine, other):
        make_node(fenced, name, {"superkube.io/pool": pool})
    agent = as_account(fenced, nh.COMPONENT, mine)
    body = nh.report_patch("fatal: GPU 3: Xid 79", kubeapi.now())
    assert "may change only the node its pod runs on" in refusal(lambda: agent.patch_node(other, body))
    agent.patch_node(mine, body)  # its own report: admitted
    cordon = nh.cordon_patch("Xid 79 on GPU 3", kubeapi.now())
    assert "the health agent may not cordon" in refusal(
        lambda: agent.patch_node(mine, {"spec": cordon["spec"]})
    )
    relabel = {"metadata": {"labels": {"superkube.io/team": "mine"}}}
    assert "the health agent may not change labels" in refusal(lambda: agent.patch_node(mine, relabel))
    note = {"metadata": {"annotations": {nh.ANNOTATION: "me"}}}
    assert "may only set the superkube.io/health-verdict" in refusal(lambda: agent.patch_node(mine, note))
    # a maintenance verdict with its start, then healthy again: the agent takes its start away
    agent.patch_node(mine, nh.report_patch("maintenance: node: scheduled Platform Reboot", kubeapi.now(),
                                           kubeapi.stamp(kubeapi.now())))  # fmt: skip
    assert nh.MAINTENANCE_AT in admin(fenced).read_node(mine).metadata.annotations
    agent.patch_node(mine, nh.report_patch("healthy", kubeapi.now()))
    notes = admin(fenced).read_node(mine).metadata.annotations
    assert nh.MAINTENANCE_AT not in notes and notes[nh.VERDICT_ANNOTATION] == "healthy"
    admin(fenced).patch_node(mine, {"metadata": {"annotations": {"example.com/owner": "ops"}}})
    dropped = {"metadata": {"annotations": {"example.com/owner": None}}}
    assert "may only set the superkube.io/health-verdict" in refusal(lambda: agent.patch_node(mine, dropped))


def test_the_controller_may_only_cordon_nodes_reported_fatal(fenced: LocalApi) -> None:
    from superkube.agents import health_controller as hc

    pool = unique("fence")
    fatal, fine = f"{pool}-a", f"{pool}-b"
    for name in (fatal, fine):
        make_node(fenced, name, {"superkube.io/pool": pool})
    report(fenced, fatal, "xid-79-off-the-bus")
    report(fenced, fine, "healthy")
    ctl = as_account(fenced, hc.COMPONENT, fine)
    cordon = nh.cordon_patch("Xid 79 on GPU 3", kubeapi.now())
    assert "a node its health agent reported fatal" in refusal(lambda: ctl.patch_node(fine, cordon))
    ctl.patch_node(fatal, cordon)
    ctl.patch_node(fatal, {"metadata": {"annotations": {nh.DRAINED_AT: kubeapi.stamp(kubeapi.now())}}})
    assert nh.DRAINED_AT in admin(fenced).read_node(fatal).metadata.annotations  # its drained mark: admitted
    uncordon = {"spec": {"unschedulable": False}}
    assert "uncordon only a node whose GPU reset cleared it" in refusal(
        lambda: ctl.patch_node(fatal, uncordon)
    )
    taint = {"spec": {"taints": [{"key": "x", "effect": "NoSchedule"}]}}
    assert "the health controller may not change taints" in refusal(lambda: ctl.patch_node(fatal, taint))


def test_the_controller_may_evict_workloads_but_not_the_system(fenced: LocalApi) -> None:
    from superkube.agents import health_controller as hc

    node = unique("evict")
    make_node(fenced, node)
    ctl = as_account(fenced, hc.COMPONENT, node)
    work = namespace(fenced, unique("team"))
    make_pod(fenced, work, "trainer", node)
    system_pod = unique("coredns")
    make_pod(fenced, "kube-system", system_pod, node, service_account="superkube-test-system")

    def evict(ns: str, name: str, grace: int | None = None) -> Any:
        body: dict[str, Any] = kubeapi.eviction(kubeapi.PodRef(ns, name))
        if grace is not None:
            body["deleteOptions"] = {"gracePeriodSeconds": grace}
        return ctl.create_namespaced_pod_eviction(name, ns, body)

    assert "may not evict pods of kube-system" in refusal(lambda: evict("kube-system", system_pod))
    assert "grace period to 0" in refusal(lambda: evict(work, "trainer", 0))
    evict(work, "trainer")
    assert admin(fenced).read_namespaced_pod("trainer", work).metadata.deletion_timestamp is not None
    # but a balloon on a cordoned node goes, or the autoscaler would keep the node it fills
    from modules.platform.foundation import NAMESPACE

    agent, held = unique("superkube-node-health-x"), f"balloon-{unique('gpu')}"
    for name in (agent, held):
        make_pod(fenced, NAMESPACE, name, node, service_account="superkube-test-system")
    assert "may not evict pods of" in refusal(lambda: evict(NAMESPACE, agent))
    evict(NAMESPACE, held)
    assert admin(fenced).read_namespaced_pod(held, NAMESPACE).metadata.deletion_timestamp is not None


def test_the_controller_as_its_service_account_leads_follows_and_cordons(
    fenced: LocalApi, tmp_path: Path
) -> None:
    """The controller's process, as the layer deploys it (its account, role, lease role, policies):
    it takes the lease, follows the pool with one list and a watch, cordons the node reported
    fatal, and lists pods only on that node."""
    from modules.platform.foundation import NAMESPACE
    from superkube.agents import health_controller as hc

    pool = unique("ctl")
    names = [f"{pool}-{i:02d}" for i in range(30)]
    for name in names:
        make_node(fenced, name, {"superkube.io/pool": pool})
    report(fenced, names[7], "xid-95-uncontained")
    kubeconfig = identity(fenced, NAMESPACE, hc.COMPONENT, names[0])
    user = f"system:serviceaccount:{NAMESPACE}:{hc.COMPONENT}"
    before = len(fenced.requests(user))  # other tests act as the controller's account on this server too
    command = [sys.executable, "-m", "superkube.agents.health_controller", "--pools", pool,
               "--kubeconfig", str(kubeconfig), "--metrics-port", "0", "--metrics-address", "127.0.0.1",
               "--interval", "0.5", "--rounds", "4", "--namespace", NAMESPACE, "--identity", "replica-a"]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "replica-a leads" in done.stderr and "Traceback" not in done.stderr
    assert admin(fenced).read_node(names[7]).spec.unschedulable is True
    assert not any(admin(fenced).read_node(n).spec.unschedulable for n in names if n != names[7])
    requests = fenced.requests(user)[before:]
    lists = [r for r in requests if r["verb"] == "list" and "/nodes" in r["uri"]]
    pods = [r for r in requests if "/pods" in r["uri"] and r["verb"] == "list"]
    assert len(lists) == 1, lists  # one list, then the watch
    assert any(r["verb"] == "watch" and "/nodes" in r["uri"] for r in requests)
    assert pods and all(f"spec.nodeName%3D{names[7]}" in r["uri"] for r in pods), pods


def test_no_fenced_agent_may_give_a_node_an_owner(fenced: LocalApi) -> None:
    """An ownerReference to an object that is not there gets the node deleted by the garbage
    collector: the policies refuse owners and finalizers as they refuse any other change."""
    node = unique("owned")
    make_node(fenced, node)
    agent = as_account(fenced, nh.COMPONENT, node)
    owner = {"metadata": {"ownerReferences": [{"apiVersion": "v1", "kind": "ConfigMap", "name": "gone",
                                               "uid": "00000000-0000-0000-0000-000000000000"}]}}  # fmt: skip
    assert "may not change the node's owners or finalizers" in refusal(lambda: agent.patch_node(node, owner))
    finalizer = {"metadata": {"finalizers": ["example.com/hold"]}}
    assert "may not change the node's owners or finalizers" in refusal(
        lambda: agent.patch_node(node, finalizer)
    )


def test_remediation_may_only_mark_and_delete_nodes_health_cordoned(api: LocalApi) -> None:
    """Remediation's user, with the layer's RBAC and admission policies, on the real server: it
    marks a node health cordoned and deletes it once marked; a node health did not cordon, a second
    annotation or a Node not yet marked is refused."""
    from kubernetes import client, config

    from modules.platform import node_health as component
    from superkube.cluster import health, remediation

    apply(api, *component.remediation_access())
    me = client.CoreV1Api(config.new_client_from_config(
        config_file=str(api.client_kubeconfig("remediation", remediation.USER))))  # fmt: skip
    pool = unique("rem")
    sick, well = f"{pool}-a", f"{pool}-b"
    policy_loaded(api, lambda name: me.delete_node(name), pool)
    for name in (sick, well):
        make_node(api, name, {"superkube.io/pool": pool})
    admin(api).patch_node(
        sick, nh.cordon_patch("fatal: node: root filesystem remounted read-only", kubeapi.now())
    )
    mark = {"metadata": {"annotations": {health.REMEDIATION_REQUESTED_AT: kubeapi.stamp(kubeapi.now())}}}
    assert "may change only a node health cordoned" in refusal(lambda: me.patch_node(well, mark))
    assert "may delete only a node health cordoned" in refusal(lambda: me.delete_node(sick))
    other = {"metadata": {"annotations": {health.DRAINED_AT: "x"}}}
    assert "remediation may only set" in refusal(lambda: me.patch_node(sick, other))
    me.patch_node(sick, mark)
    me.delete_node(sick)
    assert sick not in {n.metadata.name for n in admin(api).list_node().items}
    assert "may delete only" in refusal(lambda: me.delete_node(well))
