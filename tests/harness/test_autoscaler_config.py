"""What the lab's cluster-autoscaler runs with (`superkube.harness.autoscaler`), checked without running it:
the plan's scale sets as its node groups, the plan's command line with only the provider swapped,
and the settings `bench/autoscaler.py` compares. The binary is built in a session from a checkout
(scripts/build_autoscaler.py), not here: this keeps the benchmark's configuration honest."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime
from pathlib import Path

import pytest

from superkube.cluster import autoscaling, cloudinit
from superkube.harness import autoscaler as ca_lab
from superkube.harness.errors import HarnessError
from superkube.model import teams
from superkube.plan.engine import Plan


def test_each_gpu_scale_set_is_a_node_group_with_its_tags(flagship_plan: Plan) -> None:
    sets = ca_lab.scale_sets(flagship_plan, pool="gpu")
    assert len(sets) == 8 and sum(s.capacity for s in sets) == 7500 and {s.min for s in sets} == {0}
    for s in sets:
        # the node template decoded from the tags is what a joining node registers with
        assert s.labels == cloudinit.node_labels(flagship_plan.cluster, "gpu", "gpu", {})
        want = cloudinit.node_taints("gpu", [], "any")
        assert [f"{t['key']}={t['value']}:{t['effect']}" for t in s.taints] == want
        assert s.resources == {"nvidia.com/gpu": "8"}
    assert teams.TEAM_KEY in {t["key"] for t in sets[0].taints}


def test_a_plan_without_that_pool_says_so(flagship_plan: Plan) -> None:
    with pytest.raises(HarnessError, match="no autoscaled scale set in pool tpu"):
        ca_lab.scale_sets(flagship_plan, pool="tpu")


def test_the_kwok_provider_reads_one_template_per_set_grouped_by_its_name(flagship_plan: Plan) -> None:
    sets = ca_lab.scale_sets(flagship_plan, pool="gpu")
    objects = {(o["kind"], o["metadata"]["name"]): o for o in ca_lab.provider_objects(sets)}
    config = json.loads(objects[("ConfigMap", ca_lab.KWOK_CONFIG)]["data"]["config"])
    assert config["nodegroups"] == {"fromNodeAnnotationKey": ca_lab.SCALE_SET_ANNOTATION}
    assert config["configmap"]["name"] == ca_lab.KWOK_TEMPLATES
    templates = json.loads(objects[("ConfigMap", ca_lab.KWOK_TEMPLATES)]["data"]["templates"])["items"]
    assert [t["metadata"]["annotations"][ca_lab.SCALE_SET_ANNOTATION] for t in templates] == [
        s.name for s in sets
    ]
    first = templates[0]
    assert first["metadata"]["annotations"]["cluster-autoscaler.kwok.nodegroup/max-count"] == str(sets[0].max)
    assert first["status"]["allocatable"]["nvidia.com/gpu"] == "8"
    # the lab's RBAC is the provider's only: Nodes and its two ConfigMaps, for the autoscaler's user
    (role,) = [o for (kind, _), o in objects.items() if kind == "ClusterRole"]
    assert role["rules"] == [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["create", "delete"]}]
    binding = objects[("ClusterRoleBinding", ca_lab.LAB_RBAC)]
    assert binding["subjects"][0]["name"] == autoscaling.USER


def test_the_lab_runs_the_plans_command_line_with_only_the_provider_swapped(flagship_plan: Plan) -> None:
    flags = autoscaling.flags(flagship_plan.spec, flagship_plan.cluster)
    args = ca_lab.lab_args(flags, Path("/lab/ca.kubeconfig"), 18085)
    assert autoscaling.unknown_flags(args) == []  # every one a flag of the pinned release
    assert args[0] == "--cloud-provider=kwok"
    dropped = {a for a in flags if a.startswith(("--cloud-provider=", "--node-group-auto-discovery="))}
    assert set(args) - set(flags) == {"--cloud-provider=kwok", "--kubeconfig=/lab/ca.kubeconfig",
                                      "--address=127.0.0.1:18085"}  # fmt: skip
    assert set(flags) - set(args) == dropped and len(dropped) == 2


def test_upstream_defaults_leave_out_exactly_the_plans_scale_up_settings(flagship_plan: Plan) -> None:
    flags = autoscaling.flags(flagship_plan.spec, flagship_plan.cluster)
    defaults = ca_lab.upstream_defaults(flags)
    gone = [f.removeprefix("--").partition("=")[0] for f in flags if f not in defaults]
    assert set(gone) <= set(ca_lab.TUNED) and "max-nodes-per-scaleup" in gone and "scan-interval" in gone
    assert "--balance-similar-node-groups=true" in defaults and "--expander=least-waste" in defaults


def test_scale_ups_are_read_from_the_autoscalers_own_log_lines() -> None:
    log = (
        "I1126 18:02:03.123456   19827 executor.go:164] Scale-up: setting group flagship-pool-gpu-3 size to 7\n"
        "I1126 18:02:03.200000   19827 static_autoscaler.go:1] some other line\n"
        "W1126 18:02:04.000000   19827 executor.go:164] Scale-up: setting group flagship-pool-gpu-3 size to 9\n"
        "I1126 18:02:05.000000   19827 executor.go:164] Scale-up: setting group flagship-pool-gpu-3 size to 12\n"
    )
    first, second = ca_lab.scale_ups(log, 2026)
    assert first == ca_lab.ScaleUp(
        datetime(2026, 11, 26, 18, 2, 3, 123456, tzinfo=UTC), "flagship-pool-gpu-3", 0, 7
    )
    assert (second.old, second.new) == (7, 12)  # from the group's last size; the warning is no decision
    assert ca_lab.scale_ups(log, 2026, {"flagship-pool-gpu-3": 2})[0].old == 2


def test_without_the_built_binary_the_lab_says_how_to_build_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ca_lab, "CACHE", tmp_path)
    with pytest.raises(
        HarnessError,
        match=re.escape("run scripts/build_autoscaler.py with a checkout of kubernetes/autoscaler"),
    ):
        ca_lab.binary("1.35.2")
