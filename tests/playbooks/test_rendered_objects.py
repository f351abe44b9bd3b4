"""What the roles render, rendered offline by the roles' own templates over the flagship's inventory:
flags against each component's flag list, in-cluster objects against the official API schema."""

from __future__ import annotations

import base64
import copy
from typing import Any

import kubernetes_validate
import pytest
import yaml

from superkube.cluster import gang, wiring
from superkube.harness import gang as gang_lab
from superkube.plan import layer
from superkube.plan.engine import Plan
from tests.playbooks.test_flag_filters import ALL_KNOWN, flags_module

VERSION = "1.35"


def first(engine: wiring.Wiring, group: str) -> wiring.PlanHost:
    return next(h for h in engine.hosts if h.group == group)


COMPONENT_FLAGS = [
    ("kube-apiserver", "kube_apiserver", "apiservers", "kube_apiserver_all_flags"),
    ("kube-controller-manager", "kube_controller_manager", "apiservers", "kube_controller_manager_all_flags"),
    ("kube-scheduler", "gang_scheduler", "apiservers", "gang_scheduler_flags"),
    ("kubelet", "kubelet", "gpu_nodes", "kubelet_flags"),
    ("kube-proxy", "kube_proxy", "nat_host", "kube_proxy_flags"),
]


@pytest.mark.parametrize(
    ("component", "role", "group", "var"), COMPONENT_FLAGS, ids=[c[0] for c in COMPONENT_FLAGS]
)
def test_each_components_flags_are_flags_of_its_release(
    component: str, role: str, group: str, var: str, engine: wiring.Wiring
) -> None:
    flags = engine.render(role, first(engine, group), [var])[var]
    assert flags and flags_module.flag_problems(flags, ALL_KNOWN[component]) == []
    # the same check refuses a flag the release does not have
    bad = {**flags, "no-such-flag": "1"}
    assert flags_module.flag_problems(bad, ALL_KNOWN[component]) == [
        "--no-such-flag: not a flag of this version"
    ]


def _validate(documents: list[dict[str, Any]]) -> None:
    for doc in documents:
        kubernetes_validate.validate(doc, VERSION, strict=True)


def test_bootstrap_objects_are_valid_kubernetes_objects(engine: wiring.Wiring) -> None:
    text = engine.template(
        "kube_apiserver",
        first(engine, "apiservers"),
        "bootstrap.yaml.j2",
        kube_apiserver_bootstrap_token="abcdef.0123456789abcdef",
        kube_apiserver_bootstrap_token_expires="2026-11-28T12:00:00Z",
    )
    documents = list(yaml.safe_load_all(text))
    _validate(documents)
    (secret,) = [d for d in documents if d["kind"] == "Secret"]
    assert secret["metadata"]["name"] == "bootstrap-token-abcdef"
    assert secret["type"] == "bootstrap.kubernetes.io/token"
    groups = {
        s["name"]
        for d in documents
        if d["kind"] == "ClusterRoleBinding"
        for s in d["subjects"]
        if s["kind"] == "Group"
    }
    data = {k: base64.b64decode(v).decode() for k, v in secret["data"].items()}
    assert (data["token-id"], data["token-secret"]) == ("abcdef", "0123456789abcdef")
    assert data["expiration"] == "2026-11-28T12:00:00Z"  # kube_pki's lifetime for it
    assert groups == {data["auth-extra-groups"], "system:nodes"}
    # `data`, never `stringData`: a server-side re-apply of stringData conflicts with itself
    assert "stringData" not in secret
    broken = copy.deepcopy(secret)
    broken["dat"] = broken.pop("data")
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, VERSION, strict=True)


def test_converge_applies_what_the_gang_scheduler_waits_for(
    engine: wiring.Wiring, flagship_plan: Plan
) -> None:
    """The PodGroup CRD (until it exists, Coscheduling schedules no pod at all) and the scheduler's
    read access come with converge's bootstrap objects, not with the in-cluster layer."""
    objects = gang_lab.prerequisites(engine)
    _validate([o for o in objects if o["kind"] != "CustomResourceDefinition"])
    crds = [o["metadata"]["name"] for o in objects if o["kind"] == "CustomResourceDefinition"]
    assert crds == list(gang.GANG_CRDS)
    for name in crds:  # the files the role copies
        assert (gang.CRDS / f"{name}.yaml").is_file()
    (role,) = [o for o in objects if o["kind"] == "ClusterRole"]
    readable = {r for rule in role["rules"] if "watch" in rule["verbs"] for r in rule["resources"]}
    assert readable == {"podgroups", "elasticquotas"}
    (binding,) = [o for o in objects if o["kind"] == "ClusterRoleBinding"]
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [
        {"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "system:kube-scheduler"}
    ]
    # the layer no longer carries them: one owner, and a `pulumi destroy` of the layer cannot take
    # away what every pod's scheduling needs
    layer_objects = [o for objs in layer.objects(flagship_plan).values() for o in objs]
    assert not set(crds) & {o["metadata"]["name"] for o in layer_objects}
    assert role["metadata"]["name"] not in {o["metadata"]["name"] for o in layer_objects}


def test_cloud_inits_registration_flags_are_kubelet_flags(flagship_plan: Plan) -> None:
    import shlex

    from superkube.cluster import cloudinit

    for vmss in flagship_plan.of_type("azure-native:compute:VirtualMachineScaleSet"):
        files = cloudinit.decode(vmss.inputs["virtualMachineProfile"]["osProfile"]["customData"])[
            "write_files"
        ]
        assert isinstance(files, list)
        (registration,) = [f["content"] for f in files if f["path"] == cloudinit.REGISTRATION_FILE]
        (args,) = shlex.split(registration.split("KUBELET_EXTRA_ARGS=", 1)[1])
        flags = dict(a[2:].split("=", 1) for a in args.split())
        assert "node-labels" in flags
        assert flags_module.flag_problems(flags, ALL_KNOWN["kubelet"]) == []
