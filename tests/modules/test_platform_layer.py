"""The in-cluster layer as the real program records it: every object schema-valid, the autoscaler
bound to exactly the scale sets' tags and its release's flags, balloons sized from the VM facts, APF
objects that catch joins only, and each spec key reaching the object it sets."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from superkube.cluster import autoscaling
from superkube.cluster.inventory import cluster_facts
from superkube.cluster.kube import APF_NODE_HIGH_PRECEDENCE
from superkube.model import vmsizes
from superkube.model.spec import PREFLIGHT_TAINT_KEY
from superkube.model.teams import TEAM_KEY
from superkube.plan import engine as planning
from superkube.plan import layer
from superkube.plan.engine import Plan
from tests.conftest import ROOT, dev_config

VMSS = "azure-native:compute:VirtualMachineScaleSet"


def of_kind(plan: Plan, kind: str, component: str | None = None) -> list[dict[str, Any]]:
    return [
        o
        for name, objs in layer.objects(plan).items()
        if component is None or name == component
        for o in objs
        if o["kind"] == kind
    ]


def named(plan: Plan, kind: str, name: str) -> dict[str, Any]:
    (obj,) = [o for o in of_kind(plan, kind) if o["metadata"]["name"] == name]
    return obj


def autoscaler_args(plan: Plan) -> list[str]:
    """The command line the inventory hands cluster-autoscaler's host service on the API servers."""
    return list(cluster_facts(plan.spec, plan.addresses)["autoscaler_flags"])


def autoscaler_flags(plan: Plan) -> dict[str, str]:
    return dict(a.removeprefix("--").partition("=")[::2] for a in autoscaler_args(plan))


def test_every_shipped_stack_renders_valid_objects(any_plan: Plan) -> None:
    by_component = layer.objects(any_plan)
    assert set(by_component) == {
        "foundation",
        "node-join-flow",
        "autoscaler",
        "balloons",
        "cluster-dns",
        "gpu-devices",
        "node-health",
        "monitoring-access",
        "serving-certs",
        "gang-scheduling",
        "join-tokens",
        "team-capacity",
    }
    assert layer.problems(any_plan, any_plan.spec.kubernetes_version) == []


def test_the_plan_json_carries_each_objects_full_manifest(any_plan: Plan) -> None:
    doc = any_plan.to_dict()
    deployments = [r for r in doc["resources"] if r["type"] == "kubernetes:apps/v1:Deployment"]
    assert {d["inputs"]["metadata"]["name"] for d in deployments} >= {"scheduler-plugins-controller"}
    for d in deployments:
        assert d["inputs"]["spec"]["template"]["spec"]["containers"][0]["image"]
    (provider,) = [r for r in doc["resources"] if r["type"] == "pulumi:providers:kubernetes"]
    assert provider["inputs"]["kubeconfig"] == "[secret]", "the kubeconfig never lands in a plan file"


def test_autoscaler_discovery_is_the_scale_sets_tags(any_plan: Plan) -> None:
    wanted = autoscaling.parse_auto_discovery(autoscaler_flags(any_plan)["node-group-auto-discovery"])
    assert wanted == autoscaling.discovery_tags(any_plan.cluster)
    sets = any_plan.of_type(VMSS)
    assert sets and all(all(s.inputs["tags"].get(k) == v for k, v in wanted.items()) for s in sets)


def test_every_autoscaler_flag_is_one_of_its_release(any_plan: Plan) -> None:
    assert autoscaling.unknown_flags(autoscaler_args(any_plan)) == []
    # the host service installs the same release the flags are checked against
    release = yaml.safe_load((ROOT / "playbooks/roles/kube_component/vars/release-1.35.yml").read_text())
    assert release["kube_component_release"]["images"]["cluster-autoscaler"]["ref"].endswith(
        f":v{autoscaling.VERSION}"
    )
    defaults = yaml.safe_load((ROOT / "playbooks/roles/cluster_autoscaler/defaults/main.yml").read_text())
    assert defaults["cluster_autoscaler_version"] == autoscaling.VERSION
    # the reference is the release's list: a flag from another autoscaler's docs is not in it
    assert autoscaling.unknown_flags(["--scale-up-rate=5", "--max-nodes-per-scaleup=1"]) == [
        "--scale-up-rate=5"
    ]


def test_the_autoscaler_runs_on_the_api_servers_not_as_a_pod(any_plan: Plan) -> None:
    """Its objects in the cluster are permissions for its user and the governor's; no pod, no
    service account."""
    objs = layer.objects(any_plan)["autoscaler"]
    kinds = ["ClusterRole", "ClusterRoleBinding", "Role", "Role", "RoleBinding", "RoleBinding"]
    assert sorted(o["kind"] for o in objs) == kinds
    users = {autoscaling.USER: 0, autoscaling.GOVERNOR_USER: 0}
    for binding in (o for o in objs if o["kind"].endswith("Binding")):
        (subject,) = binding["subjects"]
        assert subject["kind"] == "User" and subject["name"] in users
        users[subject["name"]] += 1
    assert users == {autoscaling.USER: 2, autoscaling.GOVERNOR_USER: 1}
    for vm in (r for r in any_plan.of_type("azure-native:compute:VirtualMachine") if "apiservers" in r.name):
        assert vm.inputs["identity"]["userAssignedIdentities"], vm.name
        assert vm.inputs["tags"][autoscaling.IDENTITY_TAG] and vm.inputs["tags"][autoscaling.SCOPE_TAG]


def test_a_gpu_pool_grows_for_a_job_though_its_nodes_register_behind_preflight(any_plan: Plan) -> None:
    """Each taint of an autoscaled scale set's node template is one a rendered job's worker tolerates,
    or a startup taint the autoscaler leaves out of the node it simulates. The preflight taint was
    neither, and the real autoscaler answered every pending GPU pod with "didn't trigger scale-up:
    8 node(s) had untolerated taint(s)" (bench/autoscaler.py, first run)."""
    from superkube.cluster import jobs
    from superkube.harness import autoscaler as ca_lab

    startup = {v for k, v in (a.removeprefix("--").partition("=")[::2] for a in autoscaler_args(any_plan))
               if k == "startup-taint"}  # fmt: skip
    assert startup == {PREFLIGHT_TAINT_KEY}
    for pool in (p for p in any_plan.spec.node_pools if p.gpus_per_node):
        owner = any_plan.spec.pool_team(pool, any_plan.cluster)
        teams_ = sorted({t.team for t in any_plan.spec.teams if t.team != "any"})
        team = owner if owner not in (None, "any") else (teams_[0] if teams_ else None)
        job = jobs.JobSpec(name="j", namespace="research", image="trainer:1", command=["c"], workers=2,
                           team=team, borrow=owner == "any")  # fmt: skip
        worker = jobs.render(job, any_plan.spec)["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"]
        tolerated = {(t["key"], t.get("value")) for t in worker["tolerations"]}
        for s in ca_lab.scale_sets(any_plan, pool=pool.name):
            for taint in s.taints:
                assert taint["key"] in startup or (taint["key"], taint["value"]) in tolerated, (s.name, taint)


def test_the_autoscaler_may_read_what_it_waits_for_before_its_first_loop(any_plan: Plan) -> None:
    """cluster-autoscaler 1.35 waits for its resource.k8s.io informers before its first loop,
    whether dynamic resource allocation is on or not. Without this rule it took its lease and never
    scaled (bench/autoscaler.py: "Initializing resource informers, blocking until caches are synced")."""
    (role,) = [o for o in layer.objects(any_plan)["autoscaler"] if o["kind"] == "ClusterRole"]
    dra = [r for r in role["rules"] if r["apiGroups"] == ["resource.k8s.io"]]
    assert dra and set(dra[0]["resources"]) == {"resourceslices", "deviceclasses", "resourceclaims"}
    assert set(dra[0]["verbs"]) == {"get", "list", "watch"}


def test_each_spec_key_reaches_its_autoscaler_flag(write_stack: Callable[..., Path]) -> None:
    config = dev_config()
    config.update(
        {
            "autoscaler_max_nodes_per_scaleup": 7,
            "autoscaler_scan_interval_seconds": 20,
            "autoscaler_max_total_unready_percentage": 33,
            "autoscaler_ok_total_unready_count": 11,
            "autoscaler_new_pod_scale_up_delay_seconds": 45,
            "autoscaler_max_node_provision_minutes": 40,
            "autoscaler_max_nodes_total": 99,
        }
    )
    plan = planning.run(ROOT, str(write_stack(config)))
    flags = autoscaler_flags(plan)
    assert {k: flags[k] for k in flags if k in EXPECTED} == EXPECTED


EXPECTED = {
    "max-nodes-per-scaleup": "7",
    "scan-interval": "20s",
    "max-total-unready-percentage": "33",
    "ok-total-unready-count": "11",
    "new-pod-scale-up-delay": "45s",
    "max-node-provision-time": "40m",
    "max-nodes-total": "99",
}


def test_the_node_ceiling_defaults_to_the_pools_capacity(any_plan: Plan) -> None:
    assert autoscaler_flags(any_plan)["max-nodes-total"] == str(
        sum(p.nodes for p in any_plan.spec.node_pools)
    )


def test_balloons_fill_each_pool_one_node_per_pod(any_plan: Plan) -> None:
    for pool in any_plan.spec.node_pools:
        deployment = named(any_plan, "Deployment", f"balloon-{pool.name}")
        spec = deployment["spec"]
        pod = spec["template"]["spec"]
        assert spec["replicas"] == pool.nodes
        vm = vmsizes.size(pool.vm_size, "test")
        requests = pod["containers"][0]["resources"]["requests"]
        # the rest of the node after the agents' share: a second balloon cannot fit beside it
        assert int(requests["cpu"].removesuffix("m")) > vm.vcpus * 1000 / 2
        assert int(requests["memory"].removesuffix("Mi")) > vm.memory_gib * 1024 / 2
        assert requests.get("nvidia.com/gpu", "0") == str(vm.gpus)
        (term,) = pod["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        assert term["topologyKey"] == "kubernetes.io/hostname"
        assert term["labelSelector"]["matchLabels"].items() <= spec["template"]["metadata"]["labels"].items()
        assert pod["nodeSelector"] == {"superkube.io/pool": pool.name}
        assert all(t["key"] != PREFLIGHT_TAINT_KEY for t in pod.get("tolerations", []))
        # the pool's own taints and any team's (whoever comes may preempt the balloon)
        assert len(pod.get("tolerations", [])) == len(pool.taints) + 1
        assert {"key": TEAM_KEY, "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
        balloon = named(any_plan, "PriorityClass", pod["priorityClassName"])
        assert balloon["value"] == autoscaling.EXPENDABLE_CUTOFF and balloon["preemptionPolicy"] == "Never"


def test_balloons_tolerate_a_pools_own_taints(write_stack: Callable[..., Path]) -> None:
    config = dev_config()
    pools = yaml.safe_load(config["superkube:node_pools"])
    pools[0]["taints"] = ["team=vision:NoSchedule"]
    config["superkube:node_pools"] = yaml.safe_dump(pools)
    plan = planning.run(ROOT, str(write_stack(config)))
    pod = named(plan, "Deployment", f"balloon-{pools[0]['name']}")["spec"]["template"]["spec"]
    assert pod["tolerations"] == [
        {"key": TEAM_KEY, "operator": "Exists", "effect": "NoSchedule"},
        {"key": "team", "operator": "Equal", "value": "vision", "effect": "NoSchedule"},
    ]


def test_join_flow_catches_bootstrap_and_registration_only(any_plan: Plan) -> None:
    (level,) = of_kind(any_plan, "PriorityLevelConfiguration")
    assert level["spec"]["limited"]["nominalConcurrencyShares"] == any_plan.spec.apf_node_join_shares
    schemas = of_kind(any_plan, "FlowSchema")
    assert {s["spec"]["priorityLevelConfiguration"]["name"] for s in schemas} == {level["metadata"]["name"]}
    groups = set()
    for s in schemas:
        assert 1 < s["spec"]["matchingPrecedence"] < APF_NODE_HIGH_PRECEDENCE
        for rule in s["spec"]["rules"]:
            groups |= {subject["group"]["name"] for subject in rule["subjects"]}
            # never a joined node's status or lease traffic: only creates, and only of nodes and CSRs
            for r in rule["resourceRules"]:
                assert set(r["resources"]) <= {"nodes", "certificatesigningrequests"}
                if "system:nodes" in groups and r["resources"] == ["nodes"]:
                    assert r["verbs"] == ["create"]
    assert groups == {"system:bootstrappers", "system:nodes"}


def test_without_the_in_cluster_layer_there_are_no_kubernetes_objects(
    write_stack: Callable[..., Path],
) -> None:
    config = dev_config()
    config["in_cluster_layer"] = False
    plan = planning.run(ROOT, str(write_stack(config)))
    assert layer.objects(plan) == {}
    assert not [r for r in plan.resources if r.type == "pulumi:providers:kubernetes"]
    assert plan.of_type("azure-native:managedidentity:UserAssignedIdentity"), "the Azure side is unchanged"


def test_peak_join_rate_model() -> None:
    # batches overlap ceil(jitter / scan) deep, each spreading its nodes over the jitter window
    assert autoscaling.peak_join_rate_per_second(7500, 50, 10, 600) == pytest.approx(5.0)
    assert autoscaling.peak_join_rate_per_second(7500, 50, 10, 25) == pytest.approx(3 * 50 / 25)
    assert autoscaling.peak_join_rate_per_second(7500, 50, 10, 0) == 50  # a whole batch at once
    assert autoscaling.peak_join_rate_per_second(20, 50, 10, 100) == pytest.approx(0.2)  # one small batch
    assert math.isclose(autoscaling.peak_join_rate_per_second(100, 50, 10, 600), 2 * 50 / 600)


def test_every_object_goes_through_the_layers_provider_never_an_ambient_kubeconfig(any_plan: Plan) -> None:
    (provider,) = [r for r in any_plan.resources if r.type == "pulumi:providers:kubernetes"]
    objects = [r for r in any_plan.resources if r.custom and r.type.startswith("kubernetes:")]
    assert objects and {
        (r.provider or "").split("::")[0:4] == provider.urn.split("::")[0:4] for r in objects
    } == {True}
    assert all((r.provider or "").startswith(provider.urn + "::") for r in objects)


def test_the_agents_image_tag_follows_the_code(tmp_path: Path) -> None:
    """The layer pins the agents' image by a digest of the package: a changed module is a new tag
    (so new code rolls out), an unchanged copy the same one."""
    import shutil

    from superkube.agents import PACKAGE, content_digest, image_tag

    copy = tmp_path / "superkube"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    assert content_digest(copy) == content_digest(PACKAGE)
    (copy / "data" / "gpu_health.yaml").write_text((copy / "data" / "gpu_health.yaml").read_text() + "\n")
    assert content_digest(copy) != content_digest(PACKAGE)
    shutil.copytree(PACKAGE, tmp_path / "again", ignore=shutil.ignore_patterns("__pycache__"))
    agent = tmp_path / "again" / "agents" / "node_health.py"
    agent.write_text(agent.read_text().replace("cordon", "cordon ", 1))
    assert image_tag(tmp_path / "again") != image_tag(PACKAGE)


def test_the_agents_image_tag_follows_the_pins_and_dockerfiles(tmp_path: Path) -> None:
    """What the images are built from beyond the package is in the tag too: the shipped inputs file
    matches this checkout (else a pin change would not roll out), and a changed pin changes it."""
    import shutil
    import subprocess
    import sys

    from superkube.agents import CHECKOUT, IMAGE_INPUTS, INPUTS_FILE, PACKAGE, content_digest, image_inputs

    assert INPUTS_FILE.read_text() == image_inputs(), "run: python -m superkube.agents inputs --write"
    checkout = tmp_path / "checkout"
    for name in IMAGE_INPUTS:
        (checkout / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(CHECKOUT / name, checkout / name)
    (checkout / "constraints.txt").write_text(
        (checkout / "constraints.txt").read_text().replace("kubernetes==", "kubernetes==0.0.0.dev0+", 1)
    )
    assert image_inputs(checkout) != image_inputs()
    package = tmp_path / "superkube"
    shutil.copytree(PACKAGE, package, ignore=shutil.ignore_patterns("__pycache__"))
    (package / "data" / "image_inputs.txt").write_text(image_inputs(checkout))
    assert content_digest(package) != content_digest(PACKAGE)
    done = subprocess.run([sys.executable, "-m", "superkube.agents", "inputs", "--check"],
                          capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    assert done.returncode == 0 and done.stderr == "", done.stderr


def test_the_serving_approver_may_approve_for_one_signer_only(any_plan: Plan) -> None:
    """The approver's role approves for the kubelet-serving signer alone, and two replicas run (that
    kubelets ask for serving certificates is rule wiring-kubelet-serving-certificates)."""
    from modules.platform.serving_certs import NAME
    from superkube.agents.serving_certs import SIGNER

    (role,) = [r for r in of_kind(any_plan, "ClusterRole") if r["metadata"]["name"] == NAME]
    approve = [rule for rule in role["rules"] if "approve" in rule["verbs"]]
    assert approve == [{"apiGroups": ["certificates.k8s.io"], "resources": ["signers"], "resourceNames": [SIGNER],
                        "verbs": ["approve"]}]  # fmt: skip
    assert not any("delete" in rule["verbs"] or "*" in rule["verbs"] for rule in role["rules"])
    (deployment,) = [d for d in of_kind(any_plan, "Deployment") if d["metadata"]["name"] == NAME]
    assert deployment["spec"]["replicas"] >= 2


def test_the_platform_agents_serve_metrics_where_prometheus_discovers_them(any_plan: Plan) -> None:
    """The approver, the team webhook and the team-taints reconciler: each pod carries a component
    label the platform-agents job keeps, one container port named `metrics` at its agent's port,
    and a command that serves /metrics there (the webhook beside its HTTPS port)."""
    import re

    from superkube.cluster import kube
    from superkube.cluster.monitoring import jobs

    (job,) = [j for j in jobs() if j.name == "platform-agents"]
    want = {
        "superkube-serving-certs": kube.SERVING_CERTS_METRICS_PORT,
        "superkube-team-webhook": kube.TEAM_WEBHOOK_METRICS_PORT,
        "superkube-team-taints": kube.TEAM_TAINTS_METRICS_PORT,
    }
    deployments = {d["metadata"]["name"]: d for d in of_kind(any_plan, "Deployment")}
    for name, port in want.items():
        pod = deployments[name]["spec"]["template"]
        assert re.fullmatch(job.pods_of, pod["metadata"]["labels"]["app.kubernetes.io/component"]), name
        (container,) = pod["spec"]["containers"]
        assert [p for p in container["ports"] if p["name"] == "metrics"] == [
            {"name": "metrics", "containerPort": port}
        ], name
        assert f"--metrics-port={port}" in container["command"], name
    webhook = deployments["superkube-team-webhook"]["spec"]["template"]["spec"]["containers"][0]
    assert {p["name"]: p["containerPort"] for p in webhook["ports"]} == {
        "https": kube.TEAM_WEBHOOK_PORT,
        "metrics": kube.TEAM_WEBHOOK_METRICS_PORT,
    }
    # no other pod in superkube's namespace is kept by the job's component regex
    kept = {
        d["metadata"]["name"]
        for kind in ("Deployment", "DaemonSet")
        for d in of_kind(any_plan, kind)
        if re.fullmatch(
            job.pods_of, d["spec"]["template"]["metadata"]["labels"].get("app.kubernetes.io/component", "")
        )
    }
    assert kept == set(want)


def test_the_node_agents_may_evict_but_never_delete(any_plan: Plan) -> None:
    roles = {r["metadata"]["name"]: r for r in of_kind(any_plan, "ClusterRole")}
    granted = {
        name: {
            (res, verb)
            for rule in roles[name]["rules"]
            for res in rule["resources"]
            for verb in rule["verbs"]
        }
        for name in (
            "superkube-node-health",
            "superkube-node-health-controller",
            "superkube-preflight",
            "superkube-gpu-test",
            "superkube-gpu-reset",
        )
    }
    # the per-node agent reads (watches) and writes its own node only: no pods, no evictions
    assert granted["superkube-node-health"] == {
        ("nodes", "get"), ("nodes", "list"), ("nodes", "watch"), ("nodes", "patch"), ("events", "create")
    }  # fmt: skip
    # the controller evicts, and lists pods (of one node at a time), never deletes
    assert ("pods/eviction", "create") in granted["superkube-node-health-controller"]
    assert not {v for r, v in granted["superkube-node-health-controller"] if r == "pods"} - {"list"}
    # the preflight agent and the periodic test patch nodes, each fenced in by its admission policy,
    # and nothing else
    for agent in ("superkube-preflight", "superkube-gpu-test", "superkube-gpu-reset"):
        assert granted[agent] == {("nodes", "get"), ("nodes", "patch"), ("events", "create")}
    bindings = {
        b["spec"]["policyName"]: b["spec"]
        for b in of_kind(any_plan, "ValidatingAdmissionPolicyBinding", "node-health")
    }
    fenced = {
        "superkube-preflight-own-node": "superkube-preflight'",
        "superkube-gpu-test-own-node": "superkube-gpu-test'",
        # the GPU reset: its own node's reset outcome, only on a node labelled for the reset
        "superkube-gpu-reset-own-node": "superkube-gpu-reset'",
        # the health agent: its own node's report; the controller: nodes reported fatal, workload pods
        "superkube-node-health-own-node": "superkube-node-health'",
        "superkube-node-health-controller-nodes": "superkube-node-health-controller'",
        "superkube-node-health-evictions": "superkube-node-health-controller'",
        # remediation (a user on the API-server hosts): a cordoned node's mark, then its Node object
        "superkube-remediation-nodes": "request.userInfo.username == 'superkube-remediation'",
        "superkube-remediation-nodes-delete": "request.userInfo.username == 'superkube-remediation'",
        # and its ledger: the one ConfigMap it may create, where it counts the hour's deletions
        "superkube-remediation-nodes-ledger": "request.userInfo.username == 'superkube-remediation'",
    }
    assert bindings == {name: {"policyName": name, "validationActions": ["Deny"]} for name in fenced}
    policies = {
        p["metadata"]["name"]: p for p in of_kind(any_plan, "ValidatingAdmissionPolicy", "node-health")
    }
    assert {
        name: p["spec"]["matchConditions"][0]["expression"].rsplit(":", 1)[-1] for name, p in policies.items()
    } == fenced
    # remediation deletes Node objects and nothing else: no pods, no evictions; in kube-system, its
    # ledger ConfigMap by name (a create cannot be named: its admission policy holds it to the name)
    assert {(r, v) for rule in roles["superkube-remediation"]["rules"] for r in rule["resources"]
            for v in rule["verbs"]} == {("nodes", v) for v in ("get", "list", "patch", "delete")}  # fmt: skip
    (ledger,) = [
        r
        for r in of_kind(any_plan, "Role", "node-health")
        if r["metadata"]["name"] == "superkube-remediation"
    ]
    assert ledger["metadata"]["namespace"] == "kube-system"
    assert {(rule.get("resourceNames", ["*"])[0], v) for rule in ledger["rules"] for v in rule["verbs"]} == {
        ("superkube-remediation", "get"), ("superkube-remediation", "update"), ("*", "create")}  # fmt: skip


@pytest.mark.parametrize(("gpu_nodes", "cpu_nodes", "want"), [(1, None, 1), (1, 1, 2), (4, 3, 2)])
def test_cluster_dns_asks_for_no_more_replicas_than_the_stack_has_nodes(
    gpu_nodes: int, cpu_nodes: int | None, want: int, write_stack: Callable[..., Path]
) -> None:
    """Each CoreDNS replica needs a node of its own (required anti-affinity): a stack of one node
    gets one replica, not a second that could never be placed."""
    from superkube.cluster import dns

    config = dev_config()
    pools = yaml.safe_load(config["superkube:node_pools"])
    gpu = next(p for p in pools if p["role"] == "gpu")
    cpu = next(p for p in pools if p["role"] == "cpu")
    kept = [{**gpu, "nodes": gpu_nodes, "min_nodes": 0}]
    if cpu_nodes is not None:
        kept.append({**cpu, "nodes": cpu_nodes, "min_nodes": 0})
    config["superkube:node_pools"] = yaml.safe_dump(kept)
    plan = planning.run(ROOT, str(write_stack(config)))
    deployment = named(plan, "Deployment", dns.NAME)
    assert plan.spec.dns_replicas == 2 and deployment["spec"]["replicas"] == want
    affinity = deployment["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"]
    assert (
        affinity["requiredDuringSchedulingIgnoredDuringExecution"][0]["topologyKey"]
        == "kubernetes.io/hostname"
    )
