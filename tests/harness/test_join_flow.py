"""Joining nodes' requests on a real API server: how API Priority and Fairness classifies each step of
a kubelet's TLS bootstrap, before and after the layer's flow-control objects are applied.

The pinned kube-apiserver and etcd on loopback (`superkube.harness.apiserver`), the controller-manager's
csrapproving and csrsigning controllers from the same build, and the kube_apiserver role's own
bootstrap objects, rendered over the flagship's plan. Each join is a kubelet's sequence
(`superkube.harness.joins`): CSR create and watch as its bootstrap token, then its Node and Lease as the
node. The storm itself, timed, is `bench/join_flow.py`.
"""

from __future__ import annotations

import functools
import json
import ssl
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from modules.platform import flowcontrol
from superkube.harness import apiserver, joins
from superkube.plan import checks
from superkube.plan.engine import Plan

TOKENS = 3
BURST = 48


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[apiserver.LocalApi]:
    with apiserver.running(tmp_path_factory.mktemp("join-flow-apiserver")) as running:
        running.start_controller_manager(["csrapproving", "csrsigning"])
        yield running


@pytest.fixture(scope="module")
def role(flagship_plan: Plan) -> list[dict[str, Any]]:
    """The kube_apiserver role's bootstrap objects over the flagship's plan."""
    return joins.role_objects(checks.plan_wiring(flagship_plan))


@pytest.fixture(scope="module")
def tokens(api: apiserver.LocalApi, role: list[dict[str, Any]]) -> list[joins.Token]:
    made = joins.new_tokens(TOKENS)
    objects = joins.bootstrap_objects(role, made)
    apiserver.kubectl(
        api, "create", "-f", "-", stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": objects})
    )
    return made


def uids(api: apiserver.LocalApi, kind: str) -> dict[str, str]:
    items = json.loads(apiserver.kubectl(api, "get", kind, "-o", "json"))["items"]
    return {i["metadata"]["uid"]: i["metadata"]["name"] for i in items}


def limit_seats(api: apiserver.LocalApi) -> dict[tuple[str, str], float]:
    """APF's seat limits by (nominal | upper, priority level), from the server's own metrics."""
    names = [f"apiserver_flowcontrol_{kind}_limit_seats" for kind in ("nominal", "upper")]
    found = joins.apf_metrics(apiserver.kubectl(api, "get", "--raw", "/metrics"), names)
    return {(name.split("_")[2], level): value for (name, level), value in found.items()}


def classified(api: apiserver.LocalApi, result: joins.JoinResult) -> dict[str, tuple[str, str]]:
    """Each step's (flow schema, priority level) by name."""
    schemas, levels = uids(api, "flowschemas"), uids(api, "prioritylevelconfigurations")
    return {
        s.step: (schemas.get(s.flow_schema, "?"), levels.get(s.priority_level, "?")) for s in result.steps
    }


def test_joins_queue_in_the_node_join_level_and_a_joined_nodes_own_requests_do_not(
    api: apiserver.LocalApi, tokens: list[joins.Token], tmp_path: Path
) -> None:
    ca = api.dir / "pki" / "ca.crt"
    # with the built-in objects only, a bootstrap token is just an authenticated user
    before = joins.join(api.url, ca, tokens[0], "node-before", tmp_path)
    assert before.ok, before.error
    assert classified(api, before) == {
        "create csr": ("global-default", "global-default"),
        "watch csr": ("global-default", "global-default"),
        "create node": ("system-node-high", "node-high"),
        "create lease": ("system-node-high", "node-high"),
    }
    # applied, and waited for until the server's APF controller has taken them
    manifests = flowcontrol.manifests(flowcontrol.NodeJoinFlowArgs())
    joins.use_flow_control(functools.partial(apiserver.kubectl, api), manifests)
    # the level's seats are a bound: it may not borrow other levels' idle seats (upper = nominal),
    # where a built-in level may (upper > nominal); unset, the borrowing limit is no limit
    seats = limit_seats(api)
    assert seats[("upper", flowcontrol.LEVEL)] == seats[("nominal", flowcontrol.LEVEL)] > 0, seats
    assert seats[("upper", "global-default")] > seats[("nominal", "global-default")], seats
    after = joins.join(api.url, ca, tokens[1], "node-after", tmp_path)
    assert after.ok, after.error
    assert classified(api, after) == {
        "create csr": ("superkube-node-bootstrap", flowcontrol.LEVEL),
        "watch csr": ("superkube-node-bootstrap", flowcontrol.LEVEL),
        "create node": ("superkube-node-registration", flowcontrol.LEVEL),
        # the Lease, like every later status update and renewal, stays in node-high: throttling it
        # would mark a healthy node NotReady
        "create lease": ("system-node-high", "node-high"),
    }
    # the joined node's own status update is node-high too, not the join level
    context = ssl.create_default_context(cafile=str(ca))
    context.load_cert_chain(str(tmp_path / "node-after.crt"), str(tmp_path / "node-after.key"))
    kubelet = joins.Client(api.url, context)
    kubelet.headers["Content-Type"] = "application/merge-patch+json"
    try:
        step, _ = kubelet.call(
            "update status",
            "PATCH",
            "/api/v1/nodes/node-after/status",
            {"status": {"capacity": {"pods": "110"}}},
        )
    finally:
        kubelet.close()
    assert step.status == 200
    assert classified(api, joins.JoinResult("node-after", 0, steps=[step]))["update status"] == (
        "system-node-high",
        "node-high",
    )


def test_every_join_of_a_burst_ends_as_its_own_node_signed_by_the_cluster_ca(
    api: apiserver.LocalApi, tokens: list[joins.Token]
) -> None:
    # every node of a burst with the one token, as a cluster's nodes join
    names = [f"burst-{i:03d}" for i in range(BURST)]
    results = joins.storm(api.url, api.dir / "pki" / "ca.crt", [tokens[2]] * BURST, names, concurrency=16)
    assert [r.error for r in results if not r.ok] == []
    assert sorted(r.node for r in results) == names
    nodes = json.loads(apiserver.kubectl(api, "get", "nodes", "-o", "json"))["items"]
    assert {n["metadata"]["name"] for n in nodes} >= set(names)
    # each Node was created by the node itself, as NodeRestriction allows only for its own name
    for name in names:
        created = [
            r
            for r in api.requests(f"system:node:{name}")
            if r["verb"] == "create" and r["uri"] == "/api/v1/nodes"
        ]
        assert [r["code"] for r in created] == [201], (name, created)
    # every CSR was approved by the controller-manager's auto-approval and signed
    csrs = json.loads(apiserver.kubectl(api, "get", "csr", "-o", "json"))["items"]
    ours = [c for c in csrs if c["spec"]["username"] == f"system:bootstrap:{tokens[2].id}"]
    assert len(ours) == BURST
    assert all(c["status"].get("certificate") for c in ours)
    assert all(
        any(
            cond["type"] == "Approved" and cond["reason"] == "AutoApproved"
            for cond in c["status"]["conditions"]
        )
        for c in ours
    )


def test_a_token_without_the_roles_bootstrap_group_cannot_join(
    api: apiserver.LocalApi, role: list[dict[str, Any]], tmp_path: Path
) -> None:
    # a valid bootstrap token, but without the role's extra group: it authenticates (as
    # system:bootstrappers) and may not even ask for a certificate
    (stray,) = joins.new_tokens(1)
    (secret,) = [d for d in joins.bootstrap_objects(role, [stray]) if d["kind"] == "Secret"]
    del secret["data"]["auth-extra-groups"]
    apiserver.kubectl(api, "create", "-f", "-", stdin=json.dumps(secret))
    result = joins.join(api.url, api.dir / "pki" / "ca.crt", stray, "stray", tmp_path)
    assert not result.ok and "403" in result.error, result
    assert [(s.step, s.status) for s in result.steps] == [("create csr", 403)]
