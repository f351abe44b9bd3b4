"""Preflight: a passing node loses the preflight taint and label (and nothing else), a failing one keeps
them with the reason recorded; and the admission policy that fences the agent in, its CEL evaluated
over real before/after nodes by a CEL implementation (cel-python: the same language, not the API
server's own evaluator, which cannot run here)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import celpy
import jsonpatch
import pytest

from modules.platform import node_health as component
from superkube.agents import gpu_probe
from superkube.agents import preflight as pf
from superkube.cluster import render
from superkube.cluster.cloudinit import POOL_LABEL
from superkube.harness.apiserver import LocalApi
from superkube.model.spec import PREFLIGHT_TAINT_KEY
from tests.agents.conftest import admin, identity, make_node, namespace, unique
from tests.agents.conftest import apply as apply_objects
from tests.agents.test_node_health import READINGS, node, run_agent

VERSION = "1.35.0"
SA = "system:serviceaccount:superkube-system:superkube-preflight"


def joining(name: str = "gpu-1") -> dict[str, Any]:
    """A GPU node as it registers: the preflight taint and label, its pool's own taint beside them."""
    n = node(name, preflight=True)
    n["metadata"]["labels"][PREFLIGHT_TAINT_KEY] = "pending"
    n["spec"]["taints"].append({"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"})
    return n


def apply(doc: dict[str, Any], ops: list[dict[str, Any]]) -> dict[str, Any]:
    """RFC 6902 as the API server applies it (a `test` or `remove` of a member that is not there
    fails), not a lenient stand-in."""
    result: dict[str, Any] = jsonpatch.apply_patch(doc, ops)
    return result


def verdict(name: str) -> gpu_probe.Verdict:
    return gpu_probe.verdict(gpu_probe.load_reading(READINGS / f"{name}.json"))


def test_a_passing_node_loses_the_taint_and_label_and_nothing_else() -> None:
    before = joining()
    after = apply(before, pf.pass_patch(before, "passed 2026-11-23T08:00:00Z"))
    assert after["spec"]["taints"] == [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]
    assert PREFLIGHT_TAINT_KEY not in after["metadata"]["labels"]
    assert after["metadata"]["annotations"][pf.RESULT_ANNOTATION] == "passed 2026-11-23T08:00:00Z"
    assert {k: v for k, v in after["metadata"]["labels"].items()} == {
        k: v for k, v in before["metadata"]["labels"].items() if k != PREFLIGHT_TAINT_KEY
    }
    assert render.validate(after, VERSION) == []


def test_a_node_changed_since_it_was_read_is_not_overwritten() -> None:
    read = joining()
    now = copy.deepcopy(read)
    now["spec"]["taints"].append({"key": "maintenance", "effect": "NoSchedule"})  # someone else's change
    with pytest.raises(jsonpatch.JsonPatchTestFailed):
        apply(now, pf.pass_patch(read, "passed"))


@pytest.mark.parametrize(
    ("reading", "codes"),
    [
        # the GPU off the bus is not visible to NVML at all: what is counted is the missing GPU
        ("xid-79-off-the-bus", {"gpu-count"}),
        ("xid-48-dbe", {"xid-48", "ecc"}),
        ("nvlink-down", {"nvlink"}),
        ("xid-64-remap-failure", {"xid-64", "remapped-rows"}),
    ],
)
def test_each_failure_counts_under_a_bounded_reason(reading: str, codes: set[str]) -> None:
    fatal = [f for f in verdict(reading).findings if f.level == "fatal"]
    assert {pf.reason_code(f) for f in fatal} == codes and fatal


# --- the fence: the policy's CEL over before and after -------------------------------------------------


def policy(agent: component.Fenced = "preflight") -> dict[str, Any]:
    (vap,) = [m for m in component.fence(agent) if m["kind"] == "ValidatingAdmissionPolicy"]
    return vap


def admits(
    old: dict[str, Any],
    new: dict[str, Any],
    user: str = SA,
    node_name: str = "gpu-1",
    agent: component.Fenced = "preflight",
) -> list[str]:
    """The messages of the validations that reject this update (empty: admitted)."""
    env = celpy.Environment()
    activation = {
        "object": celpy.json_to_cel(new),
        "oldObject": celpy.json_to_cel(old),
        "request": celpy.json_to_cel(
            {"userInfo": {"username": user, "extra": {"authentication.kubernetes.io/node-name": [node_name]}}}
        ),
    }
    spec = policy(agent)["spec"]
    if not all(
        env.program(env.compile(c["expression"])).evaluate(activation) for c in spec["matchConditions"]
    ):
        return []  # the policy does not apply to this user
    return [
        v["message"]
        for v in spec["validations"]
        if not env.program(env.compile(v["expression"])).evaluate(activation)
    ]


def test_the_policy_and_its_binding_are_valid_objects() -> None:
    for obj in component.fence():
        assert render.validate(obj, VERSION) == [], obj["kind"]


def test_the_fence_admits_the_agents_own_pass_and_fail() -> None:
    before = joining()
    assert admits(before, apply(before, pf.pass_patch(before, "passed"))) == []
    assert admits(before, apply(before, pf.fail_patch(before, "failed: Xid 79"))) == []


def changed(change: Any) -> dict[str, Any]:
    after = copy.deepcopy(joining())
    change(after)
    return after


BREACHES = [
    ("another node", None, "gpu-2", "the preflight agent may change only the node its pod runs on"),
    (
        "remove the pool's own taint",
        lambda n: n["spec"].update(taints=[]),
        "gpu-1",
        f"the preflight agent may only remove the {PREFLIGHT_TAINT_KEY} taint",
    ),
    (
        "add a taint",
        lambda n: n["spec"]["taints"].append({"key": "x", "effect": "NoExecute"}),
        "gpu-1",
        f"the preflight agent may only remove the {PREFLIGHT_TAINT_KEY} taint",
    ),
    (
        "relabel the pool",
        lambda n: n["metadata"]["labels"].update({"superkube.io/pool": "cpu"}),
        "gpu-1",
        f"the preflight agent may only remove the {PREFLIGHT_TAINT_KEY} label",
    ),
    (
        "drop the hostname label",
        lambda n: n["metadata"]["labels"].pop("kubernetes.io/hostname"),
        "gpu-1",
        f"the preflight agent may only remove the {PREFLIGHT_TAINT_KEY} label",
    ),
    (
        "write the health agent's annotation",
        lambda n: n["metadata"]["annotations"].update({"superkube.io/health-cordoned": "x"}),
        "gpu-1",
        f"the preflight agent may only set the {pf.RESULT_ANNOTATION} annotation",
    ),
    (
        "cordon",
        lambda n: n["spec"].update(unschedulable=True),
        "gpu-1",
        "the preflight agent may not cordon or uncordon",
    ),
]


@pytest.mark.parametrize(("change", "on", "message"), [b[1:] for b in BREACHES], ids=[b[0] for b in BREACHES])
def test_the_fence_rejects_anything_else(change: Any, on: str, message: str) -> None:
    before = joining()
    after = changed(change) if change else apply(before, pf.pass_patch(before, "passed"))
    assert message in admits(before, after, node_name=on)


def test_the_fence_leaves_other_users_alone() -> None:
    before = joining()
    assert admits(before, changed(lambda n: n["spec"].update(taints=[])), user="system:node:gpu-1") == []


# --- the agent as a process, as its service account, against the real API server ----------------


@pytest.fixture(scope="module")
def preflight_api(api: LocalApi) -> LocalApi:
    """The real API server with the preflight agent's account, role and admission policy."""
    from modules.platform.foundation import NAMESPACE

    if NAMESPACE not in {n.metadata.name for n in admin(api).list_namespace().items}:
        namespace(api, NAMESPACE)
    apply_objects(api, *component.agent_access("preflight"), *component.fence())
    return api


def joined(api: LocalApi) -> tuple[str, Path]:
    """A node that has just joined (as joining() shows it), and the agent's identity on it."""
    from modules.platform.foundation import NAMESPACE

    name = unique("gpu")
    shape = joining(name)
    make_node(api, name, shape["metadata"]["labels"], shape["spec"]["taints"])
    return name, identity(api, NAMESPACE, pf.COMPONENT, name)


def test_the_agent_passes_a_healthy_node_through_the_api(preflight_api: LocalApi, tmp_path: Path) -> None:
    name, kubeconfig = joined(preflight_api)
    proc, _ = run_agent(kubeconfig, "healthy", module="superkube.agents.preflight", node_name=name)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    after = admin(preflight_api).read_node(name)
    assert [t.key for t in after.spec.taints] == ["nvidia.com/gpu"]  # only the pool's own taint is left
    assert PREFLIGHT_TAINT_KEY not in after.metadata.labels
    assert after.metadata.annotations[pf.RESULT_ANNOTATION].startswith("passed")
    reasons = [e.reason for e in admin(preflight_api).list_namespaced_event(
        "default", field_selector=f"involvedObject.name={name}").items]  # fmt: skip
    assert reasons == ["PreflightPassed"]


def test_the_agent_keeps_a_failing_node_out_with_the_reason(preflight_api: LocalApi, tmp_path: Path) -> None:
    name, kubeconfig = joined(preflight_api)
    proc, _ = run_agent(kubeconfig, "xid-95-uncontained", module="superkube.agents.preflight", node_name=name)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    after = admin(preflight_api).read_node(name)
    assert PREFLIGHT_TAINT_KEY in [t.key for t in after.spec.taints]
    assert after.metadata.labels[PREFLIGHT_TAINT_KEY] == "pending"
    assert "Xid 95" in after.metadata.annotations[pf.RESULT_ANNOTATION]
    (ev,) = (
        admin(preflight_api)
        .list_namespaced_event("default", field_selector=f"involvedObject.name={name}")
        .items
    )
    assert ev.type == "Warning" and ev.reason == "PreflightFailed" and ev.message.count("Xid 95") == 1


def test_a_node_past_preflight_ends_the_agent_without_a_write(
    preflight_api: LocalApi, tmp_path: Path
) -> None:
    from modules.platform.foundation import NAMESPACE

    name = unique("gpu")
    make_node(preflight_api, name, {POOL_LABEL: "gpu"})
    kubeconfig = identity(preflight_api, NAMESPACE, pf.COMPONENT, name)
    proc, _ = run_agent(kubeconfig, "healthy", module="superkube.agents.preflight", rounds=5, node_name=name)
    _, err = proc.communicate(timeout=60)
    writes = [r for r in preflight_api.requests(f"system:serviceaccount:{NAMESPACE}:{pf.COMPONENT}")
              if r["verb"] in ("patch", "create") and name in r["uri"]]  # fmt: skip
    assert proc.returncode == 0 and writes == [] and "past preflight" in err
