"""In-cluster layer rules: the flagship's recorded plan passes; one changed field (in each way it can
be written) makes exactly the expected rule fire."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

from policies.rules import ALL_RULES
from policies.rules import platform as platform_rules
from superkube.model import policy
from superkube.plan import checks
from superkube.plan.engine import Plan
from tests.policies import mutations as m

Doc = dict[str, Any]
PLATFORM = {r.name for r in platform_rules.RULES}


def objects(doc: Doc, kind: str, component: str | None = None) -> list[dict[str, Any]]:
    return [
        r["inputs"]
        for r in doc["resources"]
        if r["type"].startswith("kubernetes:")
        and r["inputs"].get("kind") == kind
        and (
            component is None or r["inputs"]["metadata"]["labels"]["app.kubernetes.io/component"] == component
        )
    ]


def balloon_pod(doc: Doc, pool: str = "gpu") -> dict[str, Any]:
    (deployment,) = [
        d for d in objects(doc, "Deployment", "balloons") if d["metadata"]["name"] == f"balloon-{pool}"
    ]
    return deployment["spec"]["template"]["spec"]


def container(doc: Doc) -> dict[str, Any]:
    """A container of the layer's to change: the scheduler-plugins controller's."""
    (deployment,) = [
        d
        for d in objects(doc, "Deployment", "gang-scheduling")
        if d["metadata"]["name"] == "scheduler-plugins-controller"
    ]
    return deployment["spec"]["template"]["spec"]["containers"][0]


def priority(doc: Doc, name: str) -> dict[str, Any]:
    (pc,) = [p for p in objects(doc, "PriorityClass") if p["metadata"]["name"] == name]
    return pc


@dataclass(frozen=True)
class SetFlag:
    """A change to the autoscaler's command line, which the inventory hands its host service."""

    name: str
    value: str

    def __call__(self, config: dict[str, Any]) -> None:
        expressions = config["inventory"]["hostvar_expressions"]
        args = json.loads(expressions["superkube_autoscaler_flags"])
        args = [a for a in args if not a.startswith(f"--{self.name}=")] + [f"--{self.name}={self.value}"]
        expressions["superkube_autoscaler_flags"] = json.dumps(args)


@dataclass(frozen=True)
class SetGovernor:
    """A change to the scale-up governor's settings, which the inventory hands its host service:
    `drop` removes a scale set from its ceilings; `settings` replaces keys (None: no governor at all)."""

    settings: dict[str, Any] | None = None
    drop: bool = False

    def __call__(self, config: dict[str, Any]) -> None:
        expressions = config["inventory"]["hostvar_expressions"]
        governor = json.loads(expressions["superkube_scale_governor"])
        if self.settings is None and not self.drop:
            governor = {}
        else:
            governor.update(self.settings or {})
            if self.drop:
                governor["ceilings"].pop(sorted(governor["ceilings"])[0])
        expressions["superkube_scale_governor"] = json.dumps(governor)


def open_first_maxes(doc: Doc) -> None:
    """Pulumi writes every scale set's max tag as its capacity, as without the governor."""
    for vmss in m.of(doc, m.VMSS):
        tags = vmss["inputs"]["tags"]
        tags["max"] = tags["superkube-capacity"]


def tolerate(toleration: dict[str, str]) -> Callable[[Doc], None]:
    return lambda doc: balloon_pod(doc).setdefault("tolerations", []).append(toleration)


def set_in(getter: Callable[[Doc], dict[str, Any]], key: str, value: Any) -> Callable[[Doc], None]:
    return lambda doc: getter(doc).__setitem__(key, value)


def del_in(getter: Callable[[Doc], dict[str, Any]], key: str) -> Callable[[Doc], None]:
    return lambda doc: getter(doc).pop(key)


def untag_one_pool(doc: Doc) -> None:
    vmss = m.gpu_vmss(doc)
    vmss["inputs"]["tags"]["cluster-autoscaler-name"] = "another-cluster"


def resources(doc: Doc) -> dict[str, Any]:
    return container(doc)["resources"]


CASES: list[tuple[str, Callable[[Doc], None] | SetFlag | SetGovernor, str]] = [
    # schema: an unknown field, a wrong type, a missing required field
    (
        "unknown field on a container",
        set_in(container, "bogus", 1),
        "platform-objects-schema-valid",
    ),
    (
        "replicas as text",
        lambda d: objects(d, "Deployment", "balloons")[0]["spec"].__setitem__("replicas", "many"),
        "platform-objects-schema-valid",
    ),
    ("container without a name", del_in(container, "name"), "platform-objects-schema-valid"),
    (
        "FlowSchema without a level",
        lambda d: objects(d, "FlowSchema")[0]["spec"].pop("priorityLevelConfiguration"),
        "platform-objects-schema-valid",
    ),
    # balloon priority: below the cutoff, not below the others, a class the layer lacks
    (
        "balloon priority -11",
        set_in(lambda d: priority(d, "superkube-balloon"), "value", -11),
        "platform-balloon-priority-window",
    ),
    (
        "balloon priority 0",
        set_in(lambda d: priority(d, "superkube-balloon"), "value", 0),
        "platform-balloon-priority-window",
    ),
    (
        "default priority -10",
        set_in(lambda d: priority(d, "superkube-default"), "value", -10),
        "platform-balloon-priority-window",
    ),
    (
        "balloon names a missing class",
        set_in(balloon_pod, "priorityClassName", "nope"),
        "platform-balloon-priority-window",
    ),
    (
        "cutoff raised above balloons",
        SetFlag("expendable-pods-priority-cutoff", "-5"),
        "platform-balloon-priority-window",
    ),
    # preflight toleration: by key (Equal and Exists), and by a key-less Exists
    (
        "balloon tolerates preflight (Equal)",
        tolerate(
            {"key": "superkube.io/preflight", "operator": "Equal", "value": "pending", "effect": "NoSchedule"}
        ),
        "platform-balloon-no-preflight-toleration",
    ),
    (
        "balloon tolerates preflight (Exists)",
        tolerate({"key": "superkube.io/preflight", "operator": "Exists"}),
        "platform-balloon-no-preflight-toleration",
    ),
    (
        "balloon tolerates everything",
        tolerate({"operator": "Exists"}),
        "platform-balloon-no-preflight-toleration",
    ),
    # resources: no cpu request, no memory limit, GPU limit unequal to its request
    ("no CPU request", lambda d: resources(d)["requests"].pop("cpu"), "platform-container-resources"),
    ("no memory limit", lambda d: resources(d)["limits"].pop("memory"), "platform-container-resources"),
    (
        "GPU limit below its request",
        lambda d: balloon_pod(d)["containers"][0]["resources"]["limits"].__setitem__("nvidia.com/gpu", "4"),
        "platform-container-resources",
    ),
    # privileged: the flag, and capabilities that amount to it
    (
        "privileged container",
        lambda d: container(d)["securityContext"].__setitem__("privileged", True),
        "platform-container-privileged",
    ),
    (
        "SYS_ADMIN added",
        lambda d: container(d)["securityContext"]["capabilities"].__setitem__("add", ["SYS_ADMIN"]),
        "platform-container-privileged",
    ),
    (
        "all capabilities added",
        lambda d: container(d)["securityContext"]["capabilities"].__setitem__("add", ["all"]),
        "platform-container-privileged",
    ),
    # images: untagged, latest, tag on a registry with a port but none on the image
    (
        "untagged image",
        set_in(container, "image", "registry.k8s.io/scheduler-plugins/controller"),
        "platform-image-pinned",
    ),
    (
        "latest image",
        set_in(container, "image", "registry.k8s.io/scheduler-plugins/controller:latest"),
        "platform-image-pinned",
    ),
    (
        "registry port, no tag",
        set_in(container, "image", "registry.example:5000/controller"),
        "platform-image-pinned",
    ),
    # discovery: another cluster's name, a filter that is not a label filter, a pool the filter misses, unknown flag
    (
        "discovery names another cluster",
        SetFlag(
            "node-group-auto-discovery", "label:cluster-autoscaler-enabled=true,cluster-autoscaler-name=other"
        ),
        "platform-autoscaler-discovery",
    ),
    (
        "discovery by ASG syntax",
        SetFlag("node-group-auto-discovery", "asg:tag=k8s.io/cluster-autoscaler/enabled"),
        "platform-autoscaler-discovery",
    ),
    ("one pool tagged for another cluster", untag_one_pool, "platform-autoscaler-discovery"),
    (
        "a flag the release lacks",
        SetFlag("scale-up-rate", "5"),
        "platform-autoscaler-discovery",
    ),
    # join rate: no governor (50-node batches back to back pass the safe rate), a governor above the
    # safe rate, a scale set it does not govern, first max tags that open every set's capacity
    ("no scale-up governor", SetGovernor(), "platform-autoscaler-join-rate"),
    (
        "a governor above the safe rate",
        SetGovernor({"safe_join_rate_per_minute": 600}),
        "platform-autoscaler-join-rate",
    ),
    ("a scale set not governed", SetGovernor(drop=True), "platform-autoscaler-join-rate"),
    ("first max tags at capacity", open_first_maxes, "platform-autoscaler-join-rate"),
]


@pytest.fixture(scope="module")
def flagship(flagship_plan: Plan) -> tuple[Doc, policy.RuleConfig]:
    return flagship_plan.to_dict(), checks.rule_config(flagship_plan.spec, flagship_plan.addresses)


def fired(doc: Doc, config: policy.RuleConfig) -> set[str]:
    report = checks.evaluate(checks.view_from_plan_document(doc), ALL_RULES, config)
    return {v.rule for v in report.violations}


def test_the_flagship_in_cluster_layer_passes(flagship: tuple[Doc, policy.RuleConfig]) -> None:
    doc, config = flagship
    assert json.loads(config.inventory["hostvar_expressions"]["superkube_autoscaler_flags"])
    assert objects(doc, "Deployment", "balloons")
    assert fired(doc, config) == set()


@pytest.mark.parametrize(("mutate", "rule"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_one_change_fires_its_rule(
    mutate: Callable[[Doc], None] | SetFlag | SetGovernor, rule: str, flagship: tuple[Doc, policy.RuleConfig]
) -> None:
    doc, config = flagship
    changed, settings = copy.deepcopy(doc), config.to_dict()
    if isinstance(mutate, SetFlag | SetGovernor):
        mutate(settings)
    else:
        mutate(changed)
    got = fired(changed, policy.RuleConfig.from_dict(settings))
    assert rule in got, f"expected {rule}, got {sorted(got)}"
    # schema problems may also trip a rule that reads the same field; otherwise only this rule fires
    assert got & PLATFORM <= {rule, "platform-objects-schema-valid"}, sorted(got)


def test_every_platform_rule_has_a_case() -> None:
    assert {c[2] for c in CASES} == PLATFORM


def test_a_lower_safe_join_rate_fails_the_unchanged_flagship(flagship: tuple[Doc, policy.RuleConfig]) -> None:
    doc, config = flagship
    stricter = policy.RuleConfig.from_dict({**config.to_dict(), "safe_join_rate_per_minute": 299})
    assert fired(doc, stricter) == {"platform-autoscaler-join-rate"}
