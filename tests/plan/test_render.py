"""`superkube render`: one YAML file per component, every object schema-checked; a broken field fails
render and check with one line naming the object, the field and the reason, and writes nothing."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from modules.platform import balloons
from superkube.cli import app
from superkube.cluster import render
from superkube.plan import layer
from tests.conftest import dev_config


def test_render_writes_one_valid_file_per_component(tmp_path: Path) -> None:
    out = tmp_path / "rendered"
    result = CliRunner().invoke(app, ["render", "-s", "flagship", "--out", str(out)])
    assert result.exit_code == 0, result.stderr
    assert sorted(p.name for p in out.iterdir()) == [  # the foundation's namespace and classes first
        "00-foundation.yaml",
        "01-autoscaler.yaml",
        "02-balloons.yaml",
        "03-cluster-dns.yaml",
        "04-gang-scheduling.yaml",
        "05-gpu-devices.yaml",
        "06-join-tokens.yaml",
        "07-monitoring-access.yaml",
        "08-node-health.yaml",
        "09-node-join-flow.yaml",
        "10-serving-certs.yaml",
        "11-team-capacity.yaml",
    ]
    for path in out.iterdir():
        docs = list(yaml.safe_load_all(path.read_text()))
        assert docs and all(list(d)[:3] == ["apiVersion", "kind", "metadata"] for d in docs)
        for doc in docs:
            assert render.validate(doc, "1.35") == [], path.name
    assert "valid against Kubernetes 1.35.0 (strict)" in result.stdout


def test_render_to_stdout_names_each_component() -> None:
    result = CliRunner().invoke(app, ["render"])
    assert result.exit_code == 0, result.stderr
    assert result.stdout.count("# component: ") == 12
    kinds = {d["kind"] for d in yaml.safe_load_all(result.stdout) if d}
    assert {"Deployment", "DaemonSet", "PriorityClass", "FlowSchema", "ClusterRole"} <= kinds


@pytest.fixture
def bogus_balloon_field(monkeypatch: pytest.MonkeyPatch) -> None:
    real = balloons.deployment

    def broken(*args: Any, **kwargs: Any) -> dict[str, Any]:
        obj = real(*args, **kwargs)
        obj["spec"]["template"]["spec"]["containers"][0]["cpuLimit"] = "1"
        return obj

    monkeypatch.setattr(balloons, "deployment", broken)


def test_a_broken_field_fails_render_with_one_line_and_writes_nothing(
    bogus_balloon_field: None, tmp_path: Path
) -> None:
    out = tmp_path / "rendered"
    result = CliRunner().invoke(app, ["render", "-s", "dev", "--out", str(out)])
    assert result.exit_code == 1
    invalid = [line for line in result.stderr.splitlines() if line.startswith("invalid:")]
    assert invalid == [
        "invalid: balloons: Deployment/superkube-system/balloon-cpu: spec.template.spec.containers[0]: "
        "unknown field: Additional properties are not allowed ('cpuLimit' was unexpected)",
        "invalid: balloons: Deployment/superkube-system/balloon-gpu: spec.template.spec.containers[0]: "
        "unknown field: Additional properties are not allowed ('cpuLimit' was unexpected)",
    ]
    assert "nothing written" in result.stderr and not out.exists()


def test_a_broken_field_fails_check_too(bogus_balloon_field: None) -> None:
    result = CliRunner().invoke(app, ["check", "-s", "dev", "-o", "json"])
    assert result.exit_code == 1
    assert "platform-objects-schema-valid" in result.stdout and "'cpuLimit' was unexpected" in result.stdout


def test_render_without_the_layer_says_so(write_stack: Callable[..., Path]) -> None:
    config = dev_config()
    config["in_cluster_layer"] = False
    result = CliRunner().invoke(app, ["render", "-s", str(write_stack(config))])
    assert result.exit_code == 1
    assert "no in-cluster layer (superkube:in_cluster_layer is false)" in result.stderr


def test_render_refuses_an_out_dir_whose_parent_is_missing(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["render", "--out", str(tmp_path / "a" / "b")])
    assert result.exit_code == 2 and "does not exist; create it first" in result.stderr


def test_an_unknown_vm_size_is_one_line(write_stack: Callable[..., Path]) -> None:
    config = dev_config()
    config["superkube:node_pools"] = config["superkube:node_pools"].replace(
        "Standard_D8s_v5", "Standard_D8s_v9"
    )
    result = CliRunner().invoke(app, ["render", "-s", str(write_stack(config))])
    assert result.exit_code == 2
    assert result.stderr.strip().splitlines() == [
        "error: superkube:node_pools[1].vm_size: 'Standard_D8s_v9' is not in src/superkube/data/vm_sizes.yaml (the "
        "balloons size their pods from it); add it there with its vcpus, memory_gib and gpus from Azure's "
        "size documentation"
    ]


CRD = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": "widgets.example.com"},
    "spec": {
        "group": "example.com",
        "names": {"kind": "Widget", "plural": "widgets"},
        "scope": "Namespaced",
        "versions": [
            {
                "name": "v1",
                "served": True,
                "storage": True,
                "schema": {
                    "openAPIV3Schema": {
                        "type": "object",
                        "properties": {
                            "apiVersion": {"type": "string"},
                            "kind": {"type": "string"},
                            "metadata": {"type": "object"},
                            "spec": {
                                "type": "object",
                                "required": ["size"],
                                "properties": {
                                    "size": {"type": "integer", "minimum": 1},
                                    "extra": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
                                },
                            },
                        },
                    }
                },
            }
        ],
    },
}


def test_custom_resources_are_checked_against_their_crd(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "widget.yaml").write_text(yaml.safe_dump(CRD))
    monkeypatch.setattr(render, "CRDS", tmp_path)
    render.crd_schemas.cache_clear()
    try:
        widget = {
            "apiVersion": "example.com/v1",
            "kind": "Widget",
            "metadata": {"name": "w", "namespace": "n"},
        }
        assert render.validate({**widget, "spec": {"size": 2, "extra": {"anything": 1}}}, "1.35") == []
        (problem,) = render.validate({**widget, "spec": {"size": 0}}, "1.35", "gadgets")
        assert str(problem) == "gadgets: Widget/n/w: spec.size: 0 is less than the minimum of 1"
        (problem,) = render.validate({**widget, "spec": {"size": 1, "colour": "red"}}, "1.35")
        assert problem.field == "spec" and "'colour' was unexpected" in problem.reason
        (problem,) = render.validate({**widget, "apiVersion": "example.com/v2"}, "1.35")
        assert "no CRD for it under data/crds/" in problem.reason
    finally:
        render.crd_schemas.cache_clear()


def test_objects_come_in_an_order_they_can_be_applied_in(any_plan: Any) -> None:
    seen_namespaces: set[str] = {"kube-system", "default"}
    for objs in layer.objects(any_plan).values():
        for obj in objs:
            ns = obj["metadata"].get("namespace")
            assert ns is None or ns in seen_namespaces, f"{render.name_of(obj)} before its namespace"
            if obj["kind"] == "Namespace":
                seen_namespaces.add(obj["metadata"]["name"])


def test_a_kubernetes_version_without_schemas_is_one_problem_not_a_crash() -> None:
    obj = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "x"}}
    (problem,) = render.validate(obj, "1.99.0")
    assert "no official schemas for Kubernetes 1.99.0" in problem.reason


@pytest.mark.parametrize(
    ("labels", "problems"),
    [
        ({"app.kubernetes.io/name": "gang-scheduler", "tier": ""}, 0),
        ({"app.kubernetes.io/name": "superkube:gang-scheduler"}, 1),  # the colon the server refused
        ({"app": "x" * 64}, 1),
        ({"app": "-leading"}, 1),
        ({"Bad_Prefix.io/name": "ok"}, 1),
        ({"a/b/c": "ok"}, 1),
        ({"": "ok", "k": 3}, 2),
    ],
)
def test_label_problems_follow_the_api_servers_rules(labels: dict[str, Any], problems: int) -> None:
    assert len(render.label_problems(labels)) == problems


def test_a_label_the_server_would_refuse_is_one_problem_naming_where() -> None:
    pod_template = {"metadata": {"labels": {"app": "a:b"}}, "spec": {"containers": []}}
    obj = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "d", "namespace": "n", "labels": {"app": "d"}},
        "spec": {"selector": {"matchLabels": {"app": "d"}}, "template": pod_template},
    }
    [problem] = render.validate(obj, "1.35")
    assert str(problem) == (
        "objects: Deployment/n/d: spec.template.metadata.labels: "
        "label app='a:b': a value is at most 63 characters, alphanumerics with - _ . inside"
    )


def test_rbac_names_become_valid_label_values() -> None:
    from modules.platform.objects import label_value

    assert label_value("superkube:gang-scheduler") == "superkube-gang-scheduler"
    assert label_value("x" * 70 + ":") == "x" * 63
    assert render.label_problems({"app.kubernetes.io/name": label_value("system:node:-a")}) == []


SECRET_CASES = [
    # (type, data, stringData, annotations, the field a real API server names, or None: it accepts)
    ("kubernetes.io/tls", {}, None, None, "data[tls.crt]"),
    ("kubernetes.io/tls", {"tls.crt": "Yw=="}, None, None, "data[tls.key]"),
    ("kubernetes.io/tls", None, {"tls.crt": "c", "tls.key": "k"}, None, None),  # stringData counts
    ("kubernetes.io/dockerconfigjson", {}, None, None, "data[.dockerconfigjson]"),
    ("kubernetes.io/ssh-auth", {"id": "eA=="}, None, None, "data[ssh-privatekey]"),
    ("kubernetes.io/basic-auth", {}, None, None, "data[username]"),
    ("kubernetes.io/basic-auth", {"password": "cA=="}, None, None, None),
    (
        "kubernetes.io/service-account-token",
        None,
        None,
        {},
        "metadata.annotations[kubernetes.io/service-account.name]",
    ),
    ("kubernetes.io/service-account-token", None, None, {"kubernetes.io/service-account.name": "sa"}, None),
    ("Opaque", {}, None, None, None),
    ("kubernetes.io/tls", render.SECRET, None, None, None),  # the plan holds it: not known, so not missing
]


@pytest.mark.parametrize(("type_", "data", "string_data", "annotations", "field"), SECRET_CASES)
def test_a_secret_without_what_its_type_requires_is_invalid(
    type_: str, data: Any, string_data: Any, annotations: Any, field: str | None
) -> None:
    """What a real API server refuses beyond the schema (`data[tls.crt]: Required value`)."""
    meta: dict[str, Any] = {"name": "s", "namespace": "n"}
    if annotations is not None:
        meta["annotations"] = annotations
    obj: dict[str, Any] = {"apiVersion": "v1", "kind": "Secret", "type": type_, "metadata": meta}
    obj.update({k: v for k, v in (("data", data), ("stringData", string_data)) if v is not None})
    found = render.validate(obj, "1.35")
    assert [p.field for p in found] == ([field] if field else []), found
    assert all(p.reason.startswith("Required value: ") for p in found)


def test_render_leaves_out_the_secret_only_pulumi_holds_and_says_how_to_set_it(tmp_path: Path) -> None:
    """The team webhook's kubernetes.io/tls Secret has data only `pulumi up` has: written with its
    data empty a real API server refuses it, so render writes every other object and says so."""
    out = tmp_path / "rendered"
    result = CliRunner().invoke(app, ["render", "-s", "dev", "--out", str(out)])
    assert result.exit_code == 0, result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert line == (
        "left out: team-capacity: Secret/superkube-system/superkube-team-webhook-tls (kubernetes.io/tls): its "
        "data (tls.crt, tls.key) is a secret of the stack, which the plan does not hold and pulumi up sends; "
        "set it, once converge has written it: pulumi config set --secret superkube-secrets:team_webhook_tls "
        "-s dev < <inventory dir>/pki/team-webhook.pem"
    )
    docs = [d for path in sorted(out.iterdir()) for d in yaml.safe_load_all(path.read_text())]
    assert "Secret" not in {d["kind"] for d in docs if d["metadata"]["name"].endswith("-tls")}
    assert all(render.validate(d, "1.35") == [] for d in docs)
    assert result.stdout.strip().endswith(
        "valid against Kubernetes 1.35.0 (strict); 1 Secret left out (above)"
    )
    plan = CliRunner().invoke(app, ["plan", "-s", "dev"])
    assert (
        "Secret data: Secret/superkube-system/superkube-team-webhook-tls holds a secret of the stack"
        in " ".join(plan.stdout.split())
    )


def test_the_plan_keeps_the_secret_for_pulumi_up_and_the_lab(dev_plan: Any) -> None:
    """The plan, the rules and the lab see the Secret; the lab fills its data with its own key pair
    (what it applies is then valid), as `pulumi up` fills it with the stack's."""
    from superkube.lab.layer import _with_secret_data
    from superkube.model.teams import PLAN_WEBHOOK_TLS

    (secret,) = [o for o in layer.objects(dev_plan)["team-capacity"] if o["kind"] == "Secret"]
    assert secret["data"] == {} and render.validate(secret, "1.35")[0].field == "data[tls.crt]"
    assert layer.problems(dev_plan, "1.35") == []
    assert render.validate(_with_secret_data(secret, PLAN_WEBHOOK_TLS), "1.35") == []
