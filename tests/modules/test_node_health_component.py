"""The node-health component as the real program records it: the agents on every pool and their
host paths, preflight, the periodic GPU test, the controller, the GPU reset, and each health key
reaching the flag it sets."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from superkube.cluster import autoscaling
from superkube.cluster.cloudinit import POOL_LABEL
from superkube.cluster.inventory import cluster_facts
from superkube.cluster.kube import HOST_NETWORK_PODS
from superkube.model import vmsizes
from superkube.model.spec import PREFLIGHT_TAINT_KEY
from superkube.plan import engine as planning
from superkube.plan.engine import Plan
from tests.conftest import ROOT, dev_config
from tests.modules.test_platform_layer import named, of_kind


def test_health_runs_on_every_pool_and_preflight_on_every_gpu_pool_with_its_vm_facts(any_plan: Plan) -> None:
    from superkube.agents.gpu_probe import THRESHOLDS, Thresholds
    from superkube.cluster.kube import NODE_AGENTS_METRICS_PORT
    from superkube.cluster.monitoring import jobs

    pools = any_plan.spec.node_pools
    gpu_pools = [p for p in pools if p.role == "gpu"]
    assert gpu_pools and len(gpu_pools) < len(pools), "the stacks have CPU pools too"
    every = {d["metadata"]["name"]: d for d in of_kind(any_plan, "DaemonSet", "node-health")}
    sets = {name: d for name, d in every.items() if not name.startswith("superkube-gpu-reset-")}
    assert set(sets) == {f"superkube-node-health-{p.name}" for p in pools} | {
        f"superkube-preflight-{p.name}" for p in gpu_pools
    }
    assert set(every) - set(sets) == {f"superkube-gpu-reset-{p.name}" for p in gpu_pools}
    (agents_job,) = [j for j in jobs() if j.name == "node-agents"]
    ports = set()
    for name, ds in sets.items():
        pool = next(p for p in pools if name.endswith(f"-{p.name}"))
        pod = ds["spec"]["template"]
        (container,) = pod["spec"]["containers"]
        env = {e["name"]: e.get("value") for e in container["env"]}
        assert env["EXPECTED_GPUS"] == str(vmsizes.size(pool.vm_size, "x").gpus) == str(pool.gpus_per_node)
        assert ("NVIDIA_VISIBLE_DEVICES" in env) == (pool.role == "gpu")
        assert pod["spec"]["nodeSelector"]["superkube.io/pool"] == pool.name
        # Prometheus's node-agents job finds both agents' pods by their component and metrics port
        assert pod["metadata"]["labels"]["app.kubernetes.io/component"] == agents_job.pods_of
        (port,) = container["ports"]
        assert (
            pod["spec"]["hostNetwork"]
            and port["name"] == "metrics"
            and port["hostPort"] == port["containerPort"]
        )
        ports.add(port["hostPort"])
    assert NODE_AGENTS_METRICS_PORT == agents_job.port in ports and len(ports) == 2, "one port per agent"
    # the preflight agent only where a node still waits for it
    preflight = sets[f"superkube-preflight-{gpu_pools[0].name}"]["spec"]["template"]["spec"]
    assert preflight["nodeSelector"][PREFLIGHT_TAINT_KEY] == "pending"
    (config,) = [c for c in of_kind(any_plan, "ConfigMap") if c["metadata"]["name"] == "superkube-gpu-health"]
    assert config["data"]["gpu_health.yaml"] == THRESHOLDS.read_text()
    Thresholds.model_validate(yaml.safe_load(config["data"]["gpu_health.yaml"]))


def test_the_health_agent_reads_exactly_its_checks_host_paths_read_only(any_plan: Plan) -> None:
    """An empty directory on each filesystem the node keeps state on and the kernel log's own, all
    read-only, each filesystem passed by name; no privilege, no host PID."""
    from modules.platform.node_health import FILESYSTEMS, HEALTH_FS_DIR
    from superkube.cluster.kube import APISERVER_PORT, KERNEL_LOG_DIR

    assert FILESYSTEMS[0] == ("root", HEALTH_FS_DIR)
    for ds in of_kind(any_plan, "DaemonSet", "node-health"):
        if not ds["metadata"]["name"].startswith("superkube-node-health-"):
            continue
        spec = ds["spec"]["template"]["spec"]
        (container,) = spec["containers"]
        host = {v["name"]: v["hostPath"]["path"] for v in spec["volumes"] if "hostPath" in v}
        assert sorted(host.values()) == sorted([*(path for _, path in FILESYSTEMS), KERNEL_LOG_DIR])
        assert all(v["hostPath"]["type"] == "DirectoryOrCreate" for v in spec["volumes"] if "hostPath" in v)
        mounts = {m["name"]: m for m in container["volumeMounts"] if m["name"] in host}
        assert all(m["readOnly"] for m in mounts.values()) and len(mounts) == len(FILESYSTEMS) + 1
        assert not spec.get("hostPID") and not container["securityContext"].get("privileged")
        args = [f.removeprefix("--") for f in container["command"] if f.startswith("--")]
        flags = dict(f.split("=", 1) for f in args)
        assert flags["api-address"] == f"{any_plan.addresses.apiserver_lb_ip}:{APISERVER_PORT}"
        assert flags["scheduled-events"] == "http://169.254.169.254"
        assert flags["kernel-log"].startswith(mounts["host-kernel-log"]["mountPath"] + "/")
        # each filesystem by name, root first, at the mount of its host directory (mounts followed)
        watched = [f.removeprefix("filesystem=").split("=", 1) for f in args if f.startswith("filesystem=")]
        assert [name for name, _ in watched] == [name for name, _ in FILESYSTEMS]
        for name, path in watched:
            mount = next(m for m in mounts.values() if m["mountPath"] == path)
            assert host[mount["name"]] == dict(FILESYSTEMS)[name]
            assert mount["mountPropagation"] == "HostToContainer"
        assert flags["peers"] == "3"


def test_the_watched_directories_are_where_the_node_roles_keep_their_state() -> None:
    """The kubelet's state directory and the data disk's mount as the roles set them, and containerd
    at its default root (its config names no other): a role that moves one moves the watch too."""
    from modules.platform.node_health import CONTAINERD_DIR, DATA_DIR, FILESYSTEMS, KUBELET_DIR

    roles = ROOT / "playbooks" / "roles"
    kubelet = yaml.safe_load((roles / "kubelet" / "defaults" / "main.yml").read_text())
    disk = yaml.safe_load((roles / "data_disk" / "defaults" / "main.yml").read_text())
    assert kubelet["kubelet_state_dir"] == KUBELET_DIR and disk["data_disk_mount"] == DATA_DIR
    config = (roles / "node_software" / "templates" / "containerd-config.toml.j2").read_text()
    assert not any(
        line.split("=")[0].strip() in ("root", "state") for line in config.splitlines() if "=" in line
    )
    assert CONTAINERD_DIR == "/var/lib/containerd"  # containerd's documented default root
    paths = dict(FILESYSTEMS)
    for name, state in (("kubelet", KUBELET_DIR), ("containerd", CONTAINERD_DIR), ("data", DATA_DIR)):
        assert Path(paths[name]).parent == Path(state)


def test_the_health_agent_may_list_nodes_for_its_peers_and_only_its_writes_are_fenced() -> None:
    from modules.platform import node_health as component

    (nodes,) = [r for r in component.RULES["health"] if r["resources"] == ["nodes"]]
    assert "list" in nodes["verbs"]  # type: ignore[operator]
    policy = component.fence("health")[0]
    assert policy["spec"]["matchConstraints"]["resourceRules"][0]["operations"] == ["UPDATE"]


def test_no_peers_asked_passes_no_peer_flag() -> None:
    from modules.platform import node_health as component
    from superkube.model.spec import NodePool

    pool = NodePool.model_validate(
        {"name": "cpu", "role": "cpu", "vm_size": "Standard_D16s_v5", "nodes": 3, "pod_ips_per_node": 15}
    )
    args = component.NodeHealthArgs(pools=[(pool, vmsizes.size(pool.vm_size, "test"))], peers=0)
    container = component.daemonset(pool, vmsizes.size(pool.vm_size, "test"), args, "health")["spec"][
        "template"
    ]["spec"]["containers"][0]
    assert not any(f.startswith("--peers") for f in container["command"])
    with pytest.raises(ValueError, match="peers"):
        component.NodeHealthArgs(pools=[], peers=1)


def test_a_nodes_pod_limit_counts_exactly_the_host_network_pods_it_runs(any_plan: Plan) -> None:
    """maxPods is the NIC's pod IPs plus the host-network pods a serving node of the pool runs: with
    one more, the scheduler would bind a pod the CNI has no IP for. Counted here from the layer's own
    DaemonSets: those on the host network whose selector a serving node matches (preflight selects only
    nodes still labelled pending, behind its taint, which no pod that needs an IP passes)."""
    sets = of_kind(any_plan, "DaemonSet")
    assert sets, "the layer runs host-network agents"
    for pool in any_plan.spec.node_pools:
        serving = {POOL_LABEL: pool.name}  # a passed node has lost the preflight label
        host_network = [
            d["metadata"]["name"]
            for d in sets
            if d["spec"]["template"]["spec"].get("hostNetwork")
            and all(serving.get(k) == v for k, v in d["spec"]["template"]["spec"]["nodeSelector"].items())
        ]
        assert len(host_network) == HOST_NETWORK_PODS[pool.role], (pool.name, host_network)
        assert cluster_facts(any_plan.spec, any_plan.addresses)["pools"][pool.name]["max_pods"] == (
            pool.pod_ips_per_node + len(host_network)
        )


def test_preflight_has_the_memory_of_the_burn_it_runs(any_plan: Plan) -> None:
    """Preflight runs the same active check as the periodic test (PyTorch, CUDA on every GPU, a
    pinned host buffer): it gets the same memory, not the health agent's few hundred MiB."""
    from superkube.agents.gpu_burn import H2D_BYTES

    def memory(container: dict[str, Any], side: str) -> int:
        value = container["resources"][side]["memory"]
        return int(value.removesuffix("Gi")) * 1024 if value.endswith("Gi") else int(value.removesuffix("Mi"))

    sets = {d["metadata"]["name"]: d for d in of_kind(any_plan, "DaemonSet")}
    (test_job,) = [c for c in of_kind(any_plan, "CronJob") if "gpu-test" in c["metadata"]["name"]][:1]
    (periodic,) = test_job["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"]
    for name, ds in sets.items():
        (container,) = ds["spec"]["template"]["spec"]["containers"]
        if "preflight" in name:
            assert memory(container, "limits") == memory(periodic, "limits") >= 8 * (H2D_BYTES >> 20) + 4096
            assert memory(container, "requests") == memory(container, "limits")
        else:
            assert memory(container, "limits") <= 256


def test_periodic_gpu_tests_take_whole_idle_nodes_and_never_add_or_displace_any(any_plan: Plan) -> None:
    gpu_pools = [p for p in any_plan.spec.node_pools if p.role == "gpu"]
    jobs = {j["metadata"]["name"]: j for j in of_kind(any_plan, "CronJob")}
    assert set(jobs) == {f"superkube-gpu-test-{p.name}" for p in gpu_pools}
    classes = {c["metadata"]["name"]: c for c in of_kind(any_plan, "PriorityClass")}
    for pool in gpu_pools:
        job = jobs[f"superkube-gpu-test-{pool.name}"]
        assert job["spec"]["schedule"] == any_plan.spec.gpu_test_schedule
        spec = job["spec"]["jobTemplate"]["spec"]
        assert spec["parallelism"] == spec["completions"] == any_plan.spec.gpu_test_nodes
        assert spec["backoffLimitPerIndex"] == 0, "a node that fails is not tested again in the run"
        pod = spec["template"]["spec"]
        (container,) = pod["containers"]
        gpus = str(vmsizes.size(pool.vm_size, "test").gpus)
        # every GPU of the node: the pod fits only where none is in use
        assert (
            container["resources"]["requests"]["nvidia.com/gpu"]
            == gpus
            == container["resources"]["limits"]["nvidia.com/gpu"]
        )
        assert f"--burn-seconds={any_plan.spec.gpu_burn_seconds}" in container["command"]
        assert container["image"].startswith("ghcr.io/superkube/gpu-tests:")
        cls = classes[pod["priorityClassName"]]
        assert cls["value"] < autoscaling.EXPENDABLE_CUTOFF and cls["preemptionPolicy"] == "Never"
        assert all(t.get("key") != PREFLIGHT_TAINT_KEY and t.get("key") for t in pod["tolerations"])
        (term,) = pod["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        assert term["topologyKey"] == "kubernetes.io/hostname"
        assert term["labelSelector"]["matchLabels"].items() <= spec["template"]["metadata"]["labels"].items()
    (preflight,) = [
        d for d in of_kind(any_plan, "DaemonSet") if d["metadata"]["name"].startswith("superkube-preflight")
    ]
    command = preflight["spec"]["template"]["spec"]["containers"][0]["command"]
    assert f"--burn-seconds={any_plan.spec.gpu_burn_seconds}" in command


def test_no_schedule_means_no_periodic_tests(write_stack: Callable[..., Path]) -> None:
    config = dev_config()
    config["superkube:gpu_test_schedule"] = ""
    plan = planning.run(ROOT, str(write_stack(config)))
    assert of_kind(plan, "CronJob") == []
    assert sorted(b["spec"]["policyName"] for b in of_kind(plan, "ValidatingAdmissionPolicyBinding")) == [
        "superkube-gpu-reset-own-node",  # the GPU reset's, whatever the schedule
        "superkube-node-documents-admins-only",  # the join-tokens component's, whatever the schedule
        "superkube-node-health-controller-nodes",
        "superkube-node-health-evictions",
        "superkube-node-health-own-node",
        "superkube-preflight-own-node",
        "superkube-remediation-nodes",  # remediation's, whatever the schedule
        "superkube-remediation-nodes-delete",
        "superkube-remediation-nodes-ledger",
    ]


def test_each_health_key_reaches_the_agents_flags(write_stack: Callable[..., Path]) -> None:
    config = dev_config()
    config.update({"health_max_cordoned_share": 0.1, "health_dry_run": True})
    plan = planning.run(ROOT, str(write_stack(config)))
    (deployment,) = [
        d for d in of_kind(plan, "Deployment") if d["metadata"]["name"] == "superkube-node-health-controller"
    ]
    command = deployment["spec"]["template"]["spec"]["containers"][0]["command"]
    assert "--max-cordoned-share=0.1" in command and "--dry-run" in command
    pools = [p.name for p in plan.spec.node_pools]  # every pool's nodes have their health agent
    assert f"--pools={','.join(pools)}" in command


def test_prometheus_may_discover_and_read_what_its_config_asks_and_nothing_more(any_plan: Plan) -> None:
    from superkube.cluster import monitoring

    (role,) = [r for r in of_kind(any_plan, "ClusterRole") if r["metadata"]["name"] == "superkube-prometheus"]
    verbs = {v for rule in role["rules"] for v in rule["verbs"]}
    assert verbs <= {"get", "list", "watch"}, "read-only"
    resources = {res for rule in role["rules"] for res in rule.get("resources", [])}
    config = yaml.safe_load(monitoring.shard_configs(any_plan.spec, any_plan.addresses, any_plan.cluster)[0])
    discovered = {
        sd["role"] for job in config["scrape_configs"] for sd in job.get("kubernetes_sd_configs", [])
    }
    assert {f"{r}s" for r in discovered} <= resources and "nodes/metrics" in resources
    (secret,) = [s for s in of_kind(any_plan, "Secret") if s["type"] == "kubernetes.io/service-account-token"]
    assert secret["metadata"]["annotations"]["kubernetes.io/service-account.name"] == "superkube-prometheus"


def test_the_dcgm_exporter_url_reaches_both_agents_with_the_nodes_address(
    write_stack: Callable[..., Path],
) -> None:
    config = dev_config()
    config["superkube:health_dcgm_exporter_url"] = "http://$(NODE_IP):9400/metrics"
    plan = planning.run(ROOT, str(write_stack(config)))
    for name in ("superkube-node-health-gpu", "superkube-preflight-gpu"):
        container = named(plan, "DaemonSet", name)["spec"]["template"]["spec"]["containers"][0]
        assert "--dcgm-url=http://$(NODE_IP):9400/metrics" in container["command"]
        # $(NODE_IP) expands only from a variable defined in the container's env
        env = {e["name"]: e for e in container["env"]}
        assert env["NODE_IP"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.hostIP"
    default = named(
        planning.run(ROOT, str(write_stack(dev_config()))), "DaemonSet", "superkube-node-health-gpu"
    )
    assert not any(
        a.startswith("--dcgm-url") for a in default["spec"]["template"]["spec"]["containers"][0]["command"]
    )


def test_the_health_controller_leads_one_at_a_time_and_is_scraped_with_the_agents(any_plan: Plan) -> None:
    from superkube.cluster.kube import NODE_AGENTS_METRICS_PORT
    from superkube.cluster.monitoring import jobs

    (deployment,) = [
        d
        for d in of_kind(any_plan, "Deployment")
        if d["metadata"]["name"] == "superkube-node-health-controller"
    ]
    pod = deployment["spec"]["template"]
    (container,) = pod["spec"]["containers"]
    assert deployment["spec"]["replicas"] == 2  # one leads by its Lease, one stands by
    env = {e["name"] for e in container["env"]}
    assert {"POD_NAME", "POD_NAMESPACE"} <= env  # its identity in the Lease, and where the Lease lives
    (agents_job,) = [j for j in jobs() if j.name == "node-agents"]
    assert pod["metadata"]["labels"]["app.kubernetes.io/component"] == agents_job.pods_of
    assert container["ports"] == [{"name": "metrics", "containerPort": NODE_AGENTS_METRICS_PORT}]
    (lease_role,) = [
        r for r in of_kind(any_plan, "Role") if r["metadata"]["name"].startswith("superkube-node-health")
    ]
    assert lease_role["rules"] == [
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["get", "create", "update"]}
    ]
    # every watcher of nodes may watch them (a role without `watch` leaves a store that never changes)
    roles = {r["metadata"]["name"]: r for r in of_kind(any_plan, "ClusterRole")}
    for name in ("superkube-node-health", "superkube-node-health-controller", "superkube-team-taints"):
        verbs = {v for rule in roles[name]["rules"] if "nodes" in rule["resources"] for v in rule["verbs"]}
        assert {"list", "watch"} <= verbs, name


def test_a_stack_without_the_governor_grants_its_user_nothing() -> None:
    from modules.platform import autoscaler as rbac

    users = {
        s["name"]
        for o in rbac.manifests(rbac.AutoscalerArgs(governor_user=None))
        for s in o.get("subjects", [])
    }
    assert users == {autoscaling.USER}


def test_the_gpu_reset_runs_only_on_nodes_the_controller_labelled_as_root_with_no_host_path(
    any_plan: Plan,
) -> None:
    """The one privileged container of the layer: on a GPU pool's nodes that carry the reset label
    (drained by health), off the host network, no host directory, its service account fenced to its
    own node's one annotation; the policy's allow-list names it."""
    from policies.rules.platform import _allowed
    from superkube.cluster import health

    resets = [
        d for d in of_kind(any_plan, "DaemonSet", "node-health") if "gpu-reset" in d["metadata"]["name"]
    ]
    assert resets
    for ds in resets:
        spec = ds["spec"]["template"]["spec"]
        (container,) = spec["containers"]
        assert spec["nodeSelector"][health.GPU_RESET_LABEL] == health.RESET_REQUESTED
        assert container["command"][:3] == ["python", "-m", "superkube.agents.gpu_reset"]
        assert container["securityContext"]["privileged"] and container["securityContext"]["runAsUser"] == 0
        assert not spec.get("hostNetwork") and not spec.get("hostPID")
        assert not [v for v in spec["volumes"] if "hostPath" in v]
        assert spec["serviceAccountName"] == "superkube-gpu-reset"
        assert _allowed(f"superkube-system/{ds['metadata']['name']}/reset")
    assert not _allowed("superkube-system/superkube-gpu-reset/reset")  # the pattern needs a pool
    assert not _allowed("superkube-system/superkube-node-health-gpu/agent")
    fences = {p["metadata"]["name"] for p in of_kind(any_plan, "ValidatingAdmissionPolicy")}
    assert "superkube-gpu-reset-own-node" in fences
