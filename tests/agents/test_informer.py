"""Watches and leases against the real API server: an informer lists once and then follows changes,
resumes a watch that ends from where it was (no second list), lists again only on 410 Gone; the
team reconciler and the health controller follow nodes that way; one of two candidates leads, and
the other takes over once the leader stops renewing."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from superkube.agents import team_taints
from superkube.agents.informer import Gone, Informer
from superkube.agents.kubeapi import Kube
from superkube.agents.leader import Lease
from superkube.harness.apiserver import LocalApi
from superkube.model import teams
from tests.agents.conftest import admin, make_node, unique


def wait_for(what: str, check: Any, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_a_watch_that_ends_resumes_from_where_it_was_without_listing_again(api: LocalApi) -> None:
    pool = unique("inf")
    for i in range(3):
        make_node(api, f"{pool}-{i}", {"superkube.io/pool": pool})
    kube = Kube(str(api.kubeconfig))
    watch = Informer(kube.core.list_node, label_selector=f"superkube.io/pool={pool}")
    watch.sync()
    assert sorted(watch.items()) == [f"{pool}-{i}" for i in range(3)]
    stop = threading.Event()

    def follow() -> None:  # watches that the server ends after a second each, resumed each time
        while not stop.is_set():
            watch.watch_once(timeout_s=1)

    thread = threading.Thread(target=follow, daemon=True)
    thread.start()
    try:
        time.sleep(2.5)  # at least two watches have ended and been resumed
        make_node(api, f"{pool}-3", {"superkube.io/pool": pool})
        admin(api).delete_node(f"{pool}-0")
        admin(api).patch_node(f"{pool}-1", {"metadata": {"labels": {"rack": "r9"}}})
        wait_for("the changes", lambda: f"{pool}-3" in watch.items() and f"{pool}-0" not in watch.items())
        wait_for(
            "the label", lambda: (watch.get(f"{pool}-1") or {})["metadata"]["labels"].get("rack") == "r9"
        )
    finally:
        stop.set()
        thread.join(10)
    assert watch.lists == 1 and watch.watches >= 3  # followed by watches alone


class Replay:
    """A lister whose watch says 410 Gone once (history compacted away), then behaves."""

    def __init__(self, real: Any) -> None:
        self.real, self.gone = real, True

    def __call__(self, **kw: Any) -> Any:
        if kw.get("watch") and self.gone:
            self.gone = False
            return _Raw(
                [json.dumps({"type": "ERROR", "object": {"code": 410, "message": "too old"}}).encode()]
            )
        return self.real(**kw)


class _Raw:
    def __init__(self, lines: list[bytes]) -> None:
        self.lines = lines

    def stream(self, *args: Any, **kw: Any) -> Any:
        yield b"\n".join(self.lines) + b"\n"

    def release_conn(self) -> None:
        pass

    def close(self) -> None:
        pass


def test_only_410_gone_makes_it_list_again(api: LocalApi) -> None:
    pool = unique("gone")
    make_node(api, f"{pool}-0", {"superkube.io/pool": pool})
    kube = Kube(str(api.kubeconfig))
    watch = Informer(Replay(kube.core.list_node), label_selector=f"superkube.io/pool={pool}")
    watch.sync()
    with pytest.raises(Gone):
        watch.watch_once(timeout_s=1)
    stop = threading.Event()
    thread = threading.Thread(target=watch.run, args=(stop,), daemon=True)
    watch.resource_version = ""  # as run() does on Gone
    thread.start()
    try:
        wait_for("the second list", lambda: watch.lists == 2)
        make_node(api, f"{pool}-1", {"superkube.io/pool": pool})
        wait_for("the new node", lambda: f"{pool}-1" in watch.items())
    finally:
        stop.set()  # the thread was started here, not by ensure(): close() alone does not know it
        watch.close()
        thread.join(5)
    assert watch.lists == 2 and not thread.is_alive()


def test_the_team_reconciler_follows_nodes_by_watch(api: LocalApi, tmp_path: Path) -> None:
    config = tmp_path / "teams.yaml"
    rack = unique("rack")
    config.write_text(yaml.safe_dump([{"selector": {"rack": rack}, "team": "research", "priority": 0}]))
    kube = Kube(str(api.kubeconfig))
    nodes = team_taints.WatchedNodes(kube, threading.Event())
    reconciler = team_taints.Reconciler(config, nodes)
    try:
        reconciler.round()
        name = unique("late")
        node = make_node(api, name, {"rack": rack})  # joins after the list: the watch brings it
        # as make_node left it: the watch's first sight of it still carries the server's not-ready
        # taint, and a round on that view is refused (its `test` op no longer holds) by design
        version = node["metadata"]["resourceVersion"]
        wait_for(
            "the watch",
            lambda: ((nodes.watch.get(name) or {}).get("metadata") or {}).get("resourceVersion") == version,
        )
        assert reconciler.round().get("add") == 1
        assert teams.taint("research") in kube.node(name)["spec"]["taints"]
        assert nodes.watch.lists == 1
        slim = nodes.watch.get(name) or {}
        assert set(slim) == {"metadata", "spec"} and "status" not in slim  # kept slim
    finally:
        nodes.watch.close()


def candidates(api: LocalApi, duration_s: int) -> tuple[Lease, Lease]:
    """Two replicas competing for one new Lease, as the admin."""
    from kubernetes import client, config

    coordination = client.CoordinationV1Api(config.new_client_from_config(config_file=str(api.kubeconfig)))
    name = unique("lease")
    return (Lease(coordination, "default", name, "replica-a", duration_s=duration_s),
            Lease(coordination, "default", name, "replica-b", duration_s=duration_s))  # fmt: skip


def test_one_of_two_candidates_leads_and_the_other_takes_over_when_it_stops(api: LocalApi) -> None:
    a, b = candidates(api, duration_s=2)
    assert a.try_lead() and not b.try_lead()
    assert a.try_lead() and not b.try_lead()  # a renews; b has seen a renew: not expired
    # a stops renewing (its pod is gone); b waits out the duration by its own clock, then takes over
    deadline = time.monotonic() + 10
    while not b.try_lead():
        assert time.monotonic() < deadline, "b never took over"
        time.sleep(0.3)
    held = b.coordination.read_namespaced_lease(b.name, b.namespace).spec
    assert held.holder_identity == "replica-b" and held.lease_transitions == 1
    assert not a.try_lead() and not a.leading  # a, back, finds b renewing


def test_a_refused_watch_is_said_every_round_not_served_stale(api: LocalApi) -> None:
    """An account that may list nodes but not watch them (a role missing `watch`): the list works,
    the watch is refused, and from then on each round fails with the server's answer instead of
    going on with a store that never changes again."""
    from kubernetes.client.exceptions import ApiException

    from tests.agents.conftest import apply, identity, namespace

    ns = namespace(api, unique("nowatch"))
    account = "lister"
    role = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {"name": f"{ns}-lister"},
        "rules": [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["list"]}],
    }
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": f"{ns}-lister"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": f"{ns}-lister"},
        "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": ns}],
    }
    node = unique("n")
    make_node(api, node)
    apply(api, role, binding)
    kubeconfig = identity(api, ns, account, node)
    kube = Kube(str(kubeconfig))
    watch = Informer(kube.core.list_node)
    stop = threading.Event()
    deadline = time.monotonic() + 15
    while True:  # the new role takes a moment to apply
        try:
            watch.ensure(stop)
            break
        except ApiException:
            assert time.monotonic() < deadline
            time.sleep(0.3)
    try:
        wait_for("the refused watch", lambda: watch._refused is not None)
        with pytest.raises(ApiException) as refused:
            watch.ensure(stop)
        assert refused.value.status == 403
    finally:
        watch.close()


def test_a_leader_that_stops_cleanly_hands_over_at_once(api: LocalApi) -> None:
    a, b = candidates(api, duration_s=60)
    assert a.try_lead() and not b.try_lead()
    a.release()  # its pod is stopping (a rolling update): no minute-long wait for b
    assert b.try_lead() and not a.leading
