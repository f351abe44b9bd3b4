"""`superkube:layer_only`: the in-cluster layer alone against an existing cluster's kubeconfig, as
bench/pulumi_up.py runs it through the real engine, and the lab's adjustments taken from config
(balloons at no replicas, no await for a cluster without nodes), all under the mock engine."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from modules.platform.layer import SKIP_AWAIT
from superkube.model.spec import SpecError, from_config
from superkube.plan import engine as planning
from superkube.plan import layer
from superkube.plan.engine import Plan
from tests.conftest import ROOT, dev_config


def plan_of(write_stack: Callable[..., Path], name: str, **settings: Any) -> Plan:
    config = {**dev_config(), "cluster_name": "dev", **settings}
    return planning.run(ROOT, str(write_stack(config, name=name)))


def by_key(plan: Plan) -> dict[tuple[str, str, str], dict[str, Any]]:
    return {
        (o["kind"], o["metadata"].get("namespace", ""), o["metadata"]["name"]): o
        for objs in layer.objects(plan).values()
        for o in objs
    }


def test_layer_only_registers_the_layer_and_its_provider_and_nothing_of_azure(
    write_stack: Callable[..., Path],
) -> None:
    plan = plan_of(write_stack, "alone", layer_only=True)
    assert not [r for r in plan.resources if r.type.startswith("azure-native:")]
    assert not [r for r in plan.resources if r.type == "superkube:index:Cluster"]
    (provider,) = plan.of_type("pulumi:providers:kubernetes")
    objects = [r for r in plan.resources if layer.is_object(r)]
    assert objects and all((r.provider or "").startswith(provider.urn + "::") for r in objects)
    (component,) = plan.of_type("superkube:platform:InClusterLayer")
    assert component.parent is None or component.parent.endswith("::pulumi:pulumi:Stack::superkube-alone")
    assert "join-tokens" not in plan.outputs["in_cluster_components"]


def test_layer_only_objects_are_the_full_programs_but_the_join_token_publisher(
    write_stack: Callable[..., Path],
) -> None:
    full = by_key(plan_of(write_stack, "full"))
    alone = by_key(plan_of(write_stack, "alone", layer_only=True))
    join_tokens = {
        k
        for k, o in full.items()
        if o["metadata"]["labels"].get("app.kubernetes.io/component") == "join-tokens"
    }
    assert join_tokens, "the full program publishes the scale sets' join tokens"
    assert alone == {k: o for k, o in full.items() if k not in join_tokens}


def test_balloons_disabled_keeps_the_deployments_at_no_replicas_and_changes_nothing_else(
    write_stack: Callable[..., Path],
) -> None:
    held = by_key(plan_of(write_stack, "held", layer_only=True))
    empty = by_key(plan_of(write_stack, "empty", layer_only=True, balloons_enabled=False))
    changed = {k for k in held if held[k] != empty[k]}
    balloons = {
        k for k, o in held.items() if o["metadata"]["labels"].get("app.kubernetes.io/component") == "balloons"
    }
    assert balloons and changed == balloons
    assert all(held[k]["spec"]["replicas"] > 0 and empty[k]["spec"]["replicas"] == 0 for k in balloons)


def test_without_await_every_object_and_only_objects_carry_skip_await(
    write_stack: Callable[..., Path],
) -> None:
    waited = by_key(plan_of(write_stack, "waited", layer_only=True))
    plan = plan_of(write_stack, "unwaited", layer_only=True, kubernetes_await=False)
    unwaited = by_key(plan)
    assert set(waited) == set(unwaited)
    for key, obj in unwaited.items():
        annotations = dict(obj["metadata"].get("annotations") or {})
        assert annotations.pop(SKIP_AWAIT) == "true", key
        assert annotations == (waited[key]["metadata"].get("annotations") or {}), key
    assert all(SKIP_AWAIT not in str(r.inputs) for r in plan.of_type("pulumi:providers:kubernetes"))
    assert not any(SKIP_AWAIT in str(o) for o in waited.values()), "await is the default"


def test_layer_only_needs_the_layer() -> None:
    with pytest.raises(SpecError, match=r"layer_only.*in_cluster_layer is false"):
        config = {k.removeprefix("superkube:"): v for k, v in dev_config().items()}
        from_config({**config, "layer_only": "true", "in_cluster_layer": "false"})
