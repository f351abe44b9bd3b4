"""The node agents at fleet scale, against the real API server (etcd and kube-apiserver at the pinned
versions, on loopback) with kwok (built from its Go module) as every node's kubelet: the flagship's
GPU Nodes, about 13 KB each (its labels, 8 GPUs, a kubelet's usual status with its image list),
at 1,000 / 2,500 / 5,000 / 7,500 beside its 128-node CPU pool. kwok turns each Ready, renews its
Lease every 10 s and reports status every 5 minutes, as kubelets do, and runs the pods bound to
them. At each size, with every agent as its own process and service account:

- started first, so their first reads fall outside the windows: health agents on 8 nodes that will
  fail and 8 that will not (each watches its own Node and reads its reading file every round), the
  team reconciler on the flagship's teams ConfigMap, and the health controller (leading by its
  Lease): each one's time to its first watch;
- steady state, 30 s with nothing failing: each one's API requests a minute;
- one node reported fatal in a quiet fleet: the time to its cordon;
- a burst: 5 % of the GPU nodes fail at once, each running a training pod. The 8 sampled agents
  read a fatal reading and report it themselves; the other failing nodes' reports (the one patch
  each the sampled agents show) are sent for them as the admin, since thousands of agent processes
  do not fit this machine. Measured: time to the last cordon and to the last evicted pod gone; the
  breaker, which must cordon exactly the share allowed and hold the rest; each agent's requests in
  the burst, and from them the whole fleet's (the controller, the reconciler, and one health agent
  per GPU node, failing or not, as its sampled kind);
- peak RSS of each process; the API server's; how long kwok took to make the new nodes Ready.
The nodes register as the plan's kubelets do, with their team's taint; racks r0000 carry research's
rack-group label, which the reconciler's first pass turns into research's taint.
Requests are counted from the API server's audit log, by service account, and a health agent's by
the node its requests name (kwok's are not audited).

Run: .venv/bin/python bench/agents_at_scale.py [--sizes 1000,2500,5000,7500]
Writes bench/results/agents_at_scale.json.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import functools
import json
import re
import subprocess
import sys
import tempfile
import time
import urllib.parse
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "src")]

import yaml  # noqa: E402
from kubernetes import client, config  # noqa: E402

from superkube.agents import health_controller as hc  # noqa: E402
from superkube.agents import node_health as nh  # noqa: E402
from superkube.agents import team_taints  # noqa: E402
from superkube.cluster import cloudinit  # noqa: E402
from superkube.cluster.kube import SYSTEM_NAMESPACE  # noqa: E402
from superkube.harness import apiserver  # noqa: E402
from superkube.harness import kwok as kwok_lab  # noqa: E402
from superkube.model.spec import PREFLIGHT_TAINT_KEY  # noqa: E402
from superkube.plan import engine as planning  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "agents_at_scale.json"
POOL = "gpu"
CPU_POOL, CPU_NODES = "cpu", 128  # the flagship's CPU pool, beside the GPU pool at every size
NAMESPACE = SYSTEM_NAMESPACE
TRAINERS = "trainers"
STACK = "flagship"
RESEARCH_RACK = (
    "r0000"  # labelled as research's rack group, as an operator labels racks: the reconciler's work
)
STEADY_S = 30.0
SAMPLE_AGENTS = 8  # health agents run as processes on failing nodes, and as many on healthy ones
AGENT_INTERVAL_S = 5  # the layer's is 60 s: a round reads a file; only a change of verdict writes
NODE_IN_URI = re.compile(r"(?:/nodes/|metadata\.name=)((?:gpu|cpu)-\d{5})")
CLEAN = {"metadata": {"annotations": {nh.VERDICT_ANNOTATION: "healthy", nh.ANNOTATION: None}},
         "spec": {"unschedulable": False}}  # fmt: skip
FAULT_SHARE = 0.05


def node_body(i: int, pool: str = POOL) -> tuple[dict[str, Any], dict[str, Any]]:
    """A node as its kubelet registers it (handed to kwok) and the status it reports at registration:
    the plan's node-template labels and taints (its team's among them), past preflight (its label
    and taint gone), and the hardware's."""
    name = f"{pool}-{i:05d}"
    gpu = pool == POOL
    labels = {
        k: v
        for k, v in cloudinit.node_labels("flagship", pool, "gpu" if gpu else "cpu", {}).items()
        if k != PREFLIGHT_TAINT_KEY
    }
    labels.update({
        "kubernetes.io/hostname": name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "node.kubernetes.io/instance-type": "Standard_ND96isr_H100_v5" if gpu else "Standard_D32s_v5",
        "topology.kubernetes.io/region": "eastus2",
        "topology.kubernetes.io/zone": "eastus2-1" if gpu else f"eastus2-{1 + i % 3}",
        "rack": f"r{i // 32:04d}",
        **({"superkube.io/rack-group": "b"} if gpu and f"r{i // 32:04d}" == RESEARCH_RACK else {}),
        **{f"feature.node.kubernetes.io/cpu-cpuid.{f}": "true" for f in ("AVX512F", "AMXBF16", "AMXINT8", "VAES")},
    })  # fmt: skip
    if gpu:
        labels.update({"nvidia.com/gpu.present": "true", "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
                       "nvidia.com/gpu.count": "8"})  # fmt: skip
        capacity = {
            "cpu": "96",
            "memory": "1900Gi",
            "nvidia.com/gpu": "8",
            "pods": "110",
            "ephemeral-storage": "2Ti",
        }
    else:
        capacity = {"cpu": "32", "memory": "128Gi", "pods": "110", "ephemeral-storage": "256Gi"}
    address = f"10.{(i >> 8) & 255 | (0 if gpu else 128)}.{i & 255}.4"
    body, status = kwok_lab.node(name, labels, capacity, registered_taints(pool), address=address)
    images = [
        {
            "names": [f"registry.example.com/team-{j % 7}/trainer@sha256:{(i * 131 + j):064x}",
                      f"registry.example.com/team-{j % 7}/trainer:v{j}.{i % 10}"],
            "sizeBytes": 8_000_000_000 + j,
        }
        for j in range(40)
    ]  # fmt: skip
    status["status"]["nodeInfo"] = {
        "kubeletVersion": "v1.35.0",
        "kubeProxyVersion": "v1.35.0",
        "osImage": "Ubuntu 22.04",
        "containerRuntimeVersion": "containerd://2.1.4",
        "kernelVersion": "5.15.0",
        "operatingSystem": "linux",
        "architecture": "amd64",
        "machineID": f"{i:032x}",
        "systemUUID": f"{i:032x}",
        "bootID": f"{i:032x}",
    }
    status["status"]["images"] = images
    return body, status


@functools.cache
def flagship() -> Any:
    return planning.load(ROOT, STACK)[1]


def registered_taints(pool: str) -> list[dict[str, str]]:
    """The taints the plan's kubelets of `pool` register with (`cloudinit.node_taints`), less the
    preflight taint a passed preflight lifts."""
    spec = flagship()
    node_pool = next(p for p in spec.node_pools if p.name == pool)
    out = []
    for t in cloudinit.node_taints(
        node_pool.role, node_pool.taints, spec.pool_team(node_pool, spec.name(STACK))
    ):
        if t == cloudinit.PREFLIGHT_TAINT:
            continue
        key_value, effect = t.rsplit(":", 1)
        key, _, value = key_value.partition("=")
        out.append(
            {"key": key, "value": value, "effect": effect} if value else {"key": key, "effect": effect}
        )
    return out


def grow(core: Any, start: int, stop: int, pool: str = POOL) -> None:
    taints = registered_taints(pool) or None

    def one(i: int) -> None:
        body, status = node_body(i, pool)
        core.create_node(body)
        core.patch_node_status(body["metadata"]["name"], status)
        # the node lifecycle controller lifts the not-ready taint once the node is Ready (none runs
        # here), leaving those the kubelet registered with
        core.patch_node(body["metadata"]["name"], {"spec": {"taints": taints}})

    with concurrent.futures.ThreadPoolExecutor(8) as pool_:
        list(pool_.map(one, range(start, stop)))


def ready_count(core: Any) -> int:
    """Nodes whose Ready condition is True (read raw, in pages: the client's models cost 37 s at 7,500)."""
    count, token = 0, None
    while True:
        raw = core.list_node(limit=500, _continue=token, _preload_content=False)
        page = json.loads(raw.data)
        for n in page["items"]:
            count += any(
                c["type"] == "Ready" and c["status"] == "True" for c in n["status"].get("conditions") or []
            )
        token = page["metadata"].get("continue")
        if not token:
            return count


def pod_count(core: Any) -> int:
    return len(json.loads(core.list_namespaced_pod(TRAINERS, _preload_content=False).data)["items"])


def running_pods(core: Any) -> int:
    pods = json.loads(core.list_namespaced_pod(TRAINERS, _preload_content=False).data)["items"]
    return sum(1 for p in pods if p["status"].get("phase") == "Running")


def apiserver_rss_mib(api: apiserver.LocalApi) -> float:
    return round(peak_rss_mib(api.processes[-1].pid), 1)


def token_for(core: Any, account: str, namespace: str = NAMESPACE) -> str:
    core.create_namespaced_service_account(namespace, {"metadata": {"name": account}})
    request = {"spec": {"audiences": [apiserver.ISSUER], "expirationSeconds": 7200}}
    return str(core.create_namespaced_service_account_token(account, namespace, request).status.token)


def peak_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


def start(argv: list[str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        return subprocess.Popen([sys.executable, "-m", *argv], stdout=out, stderr=subprocess.STDOUT)


def wait_for(check: Any, timeout: float, every_s: float = 0.1) -> float:
    began = time.monotonic()
    while not check():
        if time.monotonic() - began > timeout:
            raise TimeoutError("timed out")
        time.sleep(every_s)
    return time.monotonic() - began


def node_of(uri: str) -> str:
    """The node a request names (its path, or its field selector), or ''."""
    found = NODE_IN_URI.search(urllib.parse.unquote(uri))
    return found.group(1) if found else ""


def by_node(requests: list[dict[str, Any]]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for r in requests:
        node = node_of(r["uri"])
        counts[node] = counts.get(node, 0) + 1
    return counts


def write_reading(path: Path, name: str, node: str) -> None:
    """The reading file an agent reads each round, replaced whole (as a ConfigMap's mount changes)."""
    doc = json.loads((ROOT / "tests" / "agents" / "readings" / f"{name}.json").read_text())
    path.with_suffix(".new").write_text(json.dumps({**doc, "node": node}))
    path.with_suffix(".new").replace(path)


def measure(
    api: apiserver.LocalApi, core: Any, n: int, kubeconfigs: dict[str, Path], work: Path
) -> dict[str, Any]:
    out: dict[str, Any] = {"nodes": n}
    sa = {k: f"system:serviceaccount:{NAMESPACE}:{k}" for k in kubeconfigs}
    single = f"gpu-{n - 1:05d}"
    failing = [f"gpu-{i:05d}" for i in range(0, n, int(1 / FAULT_SHARE) - 1)][: int(n * FAULT_SHARE) + 3]
    allowed = int(n * FAULT_SHARE)
    healthy = [f"gpu-{i:05d}" for i in range(n) if f"gpu-{i:05d}" not in set(failing) | {single}]
    sampled_failing, sampled_healthy = failing[:SAMPLE_AGENTS], healthy[:SAMPLE_AGENTS]
    common = ["--metrics-port", "0", "--metrics-address", "127.0.0.1", "--interval", str(AGENT_INTERVAL_S)]
    procs: dict[str, subprocess.Popen[bytes]] = {}
    seen = {k: len(api.requests(u)) for k, u in sa.items()}
    try:
        # the agents first, so their first reads fall before the windows: health agents on sampled
        # nodes (each watches its own node and reads its reading file each round), the team reconciler
        for node in sampled_failing + sampled_healthy:
            write_reading(work / f"reading-{node}.json", "healthy", node)
            procs[node] = start(["superkube.agents.node_health", "--node", node, "--pool", POOL,
                                 "--reading", str(work / f"reading-{node}.json"),
                                 "--kubeconfig", str(kubeconfigs[nh.COMPONENT]), *common],
                                work / f"agent-{n}-{node}.log")  # fmt: skip
        teams_file = work / "teams.yaml"
        teams_file.write_text(yaml.safe_dump([t.model_dump() for t in flagship().teams]))  # its ConfigMap
        procs["team_reconciler"] = start(["superkube.agents.team_taints", "--config", str(teams_file),
                                          "--kubeconfig", str(kubeconfigs[team_taints.COMPONENT]), *common],
                                         work / f"teams-{n}.log")  # fmt: skip
        watching = {*procs} - {"team_reconciler"}
        began = time.monotonic()
        wait_for(lambda: {node_of(r["uri"]) for r in api.requests(sa[nh.COMPONENT])[seen[nh.COMPONENT]:]
                          if r["verb"] == "watch"} >= watching, 300)  # fmt: skip
        out["agents_first_watch_s"] = round(time.monotonic() - began, 2)
        out["team_reconciler_first_watch_s"] = round(wait_for(lambda: any(
            r["verb"] == "watch" for r in api.requests(sa[team_taints.COMPONENT])[seen[team_taints.COMPONENT]:]), 300)
            + out["agents_first_watch_s"], 2)  # fmt: skip
        # the controller
        ctl_from = len(api.requests(sa[hc.COMPONENT]))
        procs["controller"] = start(["superkube.agents.health_controller", "--pools", POOL, "--kubeconfig",
                                     str(kubeconfigs[hc.COMPONENT]), "--metrics-port", "0", "--metrics-address",
                                     "127.0.0.1", "--interval", "10", "--namespace", NAMESPACE,
                                     "--identity", f"bench-{n}"], work / f"controller-{n}.log")  # fmt: skip
        out["controller_first_list_s"] = round(
            wait_for(
                lambda: any(r["verb"] == "watch" for r in api.requests(sa[hc.COMPONENT])[ctl_from:]), 300
            ),
            2,
        )
        settled(lambda: sum(len(api.requests(u)) for u in sa.values()))  # first passes done, the lease taken
        # steady state: everyone running, nothing failing
        marks = {k: len(api.requests(u)) for k, u in sa.items()}
        out["team_reconciler_first_pass_writes"] = sum(
            1
            for r in api.requests(sa[team_taints.COMPONENT])[seen[team_taints.COMPONENT] :]
            if r["verb"] == "patch"
        )
        time.sleep(STEADY_S)
        window = {k: api.requests(u)[marks[k] :] for k, u in sa.items()}
        per_agent = by_node(window[nh.COMPONENT])
        out["steady_requests_per_min"] = {
            "controller": round(len(window[hc.COMPONENT]) * 60 / STEADY_S, 1),
            "team_reconciler": round(len(window[team_taints.COMPONENT]) * 60 / STEADY_S, 1),
            "health_agent_max": round(max(per_agent.get(a, 0) for a in watching) * 60 / STEADY_S, 1),
        }
        out["steady_verbs"] = {k: verbs(v) for k, v in window.items()}
        # one node reported fatal, in a quiet fleet: the time to its cordon
        seen_single = len(api.requests(sa[hc.COMPONENT]))
        core.patch_node(single, nh.report_patch("fatal: GPU 1: Xid 48: double-bit ECC error", nh.now()))
        out["one_report_to_cordon_s"] = round(wait_for(lambda: any(
            r["verb"] == "patch" and r["uri"].split("?")[0].endswith(f"/nodes/{single}")
            for r in api.requests(sa[hc.COMPONENT])[seen_single:]), 120), 2)  # fmt: skip
        core.patch_node(single, CLEAN)
        time.sleep(2)
        # 5 % of the pool fails at once, each node running a training pod (bound as the scheduler
        # would; kwok runs it). The sampled agents read a fatal reading and report it themselves;
        # the others' reports, one patch of their own node each as the sampled ones show, are sent
        # for them as the admin (thousands of agent processes do not fit this machine)
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda name: core.create_namespaced_pod(TRAINERS, {
                "metadata": {"name": f"trainer-on-{name}"},
                "spec": {"nodeName": name, "automountServiceAccountToken": False,
                         "containers": [{"name": "c", "image": "registry.invalid/trainer:0"}]}}), failing))  # fmt: skip
        wait_for(lambda: running_pods(core) == len(failing), 300)
        marks = {k: len(api.requests(u)) for k, u in sa.items()}
        began = time.monotonic()
        for node in sampled_failing:
            write_reading(work / f"reading-{node}.json", "xid-79-off-the-bus", node)
        report = nh.report_patch("fatal: GPU 3: Xid 79: GPU has fallen off the bus", nh.now())
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda name: core.patch_node(name, report), failing[SAMPLE_AGENTS:]))
        reported_s = time.monotonic() - began

        def cordoned() -> int:
            return sum(1 for r in api.requests(sa[hc.COMPONENT])[marks[hc.COMPONENT]:]
                       if r["verb"] == "patch" and "/nodes/" in r["uri"])  # fmt: skip

        out["reports"] = len(failing)
        out["reports_sent_s"] = round(reported_s, 2)
        out["report_to_last_cordon_s"] = round(wait_for(lambda: cordoned() >= allowed, 300) + reported_s, 2)
        # the evicted pods stopped by their kubelets (kwok) and gone; the held nodes' pods stay
        wait_for(lambda: pod_count(core) <= len(failing) - allowed, 300)
        out["report_to_last_pod_gone_s"] = round(time.monotonic() - began, 2)
        time.sleep(max(3.0, AGENT_INTERVAL_S))  # and no more than the share; every sampled agent has reported
        burst_s = time.monotonic() - began
        window = {k: api.requests(u)[marks[k] :] for k, u in sa.items()}
        per_agent = by_node(window[nh.COMPONENT])
        out["cordoned"] = cordoned()
        out["breaker_allowed"] = allowed
        out["pods_left_on_held_nodes"] = pod_count(core)
        out["evicted"] = sum(1 for r in window[hc.COMPONENT] if r["uri"].endswith("/eviction"))
        out["sampled_agents_reported"] = sum(
            1 for node in sampled_failing
            if core.read_node(node).metadata.annotations.get(nh.VERDICT_ANNOTATION, "").startswith("fatal")
        )  # fmt: skip
        failing_agent = max(per_agent.get(a, 0) for a in sampled_failing)
        healthy_agent = max(per_agent.get(a, 0) for a in sampled_healthy)
        burst = {
            "controller": len(window[hc.COMPONENT]),
            "team_reconciler": len(window[team_taints.COMPONENT]),
            "health_agent_on_a_failing_node_max": failing_agent,
            "health_agent_on_a_healthy_node_max": healthy_agent,
            "health_agent_unattributed": per_agent.get("", 0),
        }
        # every agent of the fleet: the controller, the reconciler, and one health agent per GPU
        # node (the failing ones as the sampled failing, the rest as the sampled healthy)
        total = (burst["controller"] + burst["team_reconciler"] + len(failing) * failing_agent
                 + (n - len(failing)) * healthy_agent + burst["health_agent_unattributed"])  # fmt: skip
        out["burst_window_s"] = round(burst_s, 1)
        out["burst_requests"] = burst
        out["burst_verbs"] = {k: verbs(v) for k, v in window.items()}
        out["burst_all_agents_requests"] = total
        out["burst_all_agents_requests_per_min"] = round(total * 60 / burst_s, 1)
        out["burst_requests_per_failure"] = round(total / len(failing), 2)
        out["peak_rss_mib"] = {
            "controller": round(peak_rss_mib(procs["controller"].pid), 1),
            "team_reconciler": round(peak_rss_mib(procs["team_reconciler"].pid), 1),
            "health_agent_max": round(max(peak_rss_mib(procs[a].pid) for a in watching), 1),
        }
    finally:
        for proc in procs.values():
            proc.terminate()
        for proc in procs.values():
            proc.wait(30)
    # un-report and uncordon for the next size
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda name: core.patch_node(name, CLEAN), failing))
    core.delete_collection_namespaced_pod(TRAINERS)
    wait_for(lambda: pod_count(core) == 0, 120)
    return out


def settled(count: Any, quiet_s: float = 3.0, timeout: float = 300) -> None:
    """Wait until `count()` has not changed for `quiet_s` (the agents' first passes are over)."""
    began, last, since = time.monotonic(), count(), time.monotonic()
    while time.monotonic() - since < quiet_s:
        if time.monotonic() - began > timeout:
            raise TimeoutError("the agents never settled")
        time.sleep(0.5)
        now = count()
        if now != last:
            last, since = now, time.monotonic()


def verbs(requests: list[dict[str, Any]]) -> dict[str, int]:
    out: dict[str, int] = {}
    for r in requests:
        out[r["verb"]] = out.get(r["verb"], 0) + 1
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--sizes", default="1000,2500,5000,7500")
    args = p.parse_args()
    sizes = [int(x) for x in args.sizes.split(",")]
    work = Path(tempfile.mkdtemp(prefix="agents-at-scale-"))
    from modules.platform import node_health as component
    from modules.platform import team_capacity

    with apiserver.running(work / "api", lambda line: print(line, file=sys.stderr)) as api:
        core = client.CoreV1Api(config.new_client_from_config(config_file=str(api.kubeconfig)))
        core.create_namespace({"metadata": {"name": NAMESPACE}})
        core.create_namespace({"metadata": {"name": TRAINERS}})
        core.create_namespaced_service_account(
            TRAINERS, {"metadata": {"name": "default"}}
        )  # no controller-manager
        from tests.agents.conftest import apply
        from tests.agents.test_real_api import _args

        objects = [
            *component._access("health"),
            *[m for m in component.controller(_args()) if m["kind"] != "Deployment"],
        ]
        objects += [m for m in team_capacity.reconciler(team_capacity.TeamCapacityArgs(
            tuples=flagship().teams, webhook_tls=""))
            if m["kind"] in ("ServiceAccount", "ClusterRole", "ClusterRoleBinding")]  # fmt: skip
        # kwok, every node's kubelet, as its own account (not audited: see apiserver.KWOK_USER)
        objects.append({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
                        "metadata": {"name": apiserver.KWOK_ACCOUNT},
                        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
                        "subjects": [{"kind": "ServiceAccount", "name": apiserver.KWOK_ACCOUNT,
                                      "namespace": apiserver.KWOK_NAMESPACE}]})  # fmt: skip
        apply(api, *[o for o in objects if o["kind"] != "ServiceAccount"])
        kubeconfigs = {
            account: api.token_kubeconfig(account, token_for(core, account))
            for account in (hc.COMPONENT, nh.COMPONENT, team_taints.COMPONENT)
        }
        kwok_token = token_for(core, apiserver.KWOK_ACCOUNT, apiserver.KWOK_NAMESPACE)
        kwok_config = api.token_kubeconfig(apiserver.KWOK_ACCOUNT, kwok_token)
        rows = []
        have = 0
        with kwok_lab.running(kwok_config, work / "kwok", lambda line: print(line, file=sys.stderr)) as kwok:
            grow(core, 0, CPU_NODES, CPU_POOL)
            for n in sizes:
                began = time.monotonic()
                grow(core, have, n)
                made_s = time.monotonic() - began
                ready_s = wait_for(lambda n=n: ready_count(core) >= n + CPU_NODES, 900, 2.0) + made_s
                have = n
                print(f"{n} nodes made in {made_s:.0f} s, all Ready in {ready_s:.0f} s", file=sys.stderr)
                row = {"nodes_made_s": round(made_s, 1), "all_ready_s": round(ready_s, 1)}
                row.update(measure(api, core, n, kubeconfigs, work))
                row["apiserver_peak_rss_mib"] = apiserver_rss_mib(api)
                row["kwok_alive"] = kwok.alive()
                print(json.dumps(row), file=sys.stderr)
                rows.append(row)
        sample = json.dumps(core.api_client.sanitize_for_serialization(core.read_node("gpu-00002")))
    result = {
        "node_json_bytes": len(sample),
        "kwok": kwok_lab.build.KWOK_VERSION,
        "cpu_nodes": CPU_NODES,
        "kwok_lease_duration_s": kwok_lab.LEASE_DURATION_S,
        "steady_window_s": STEADY_S,
        "fault_share": FAULT_SHARE,
        "sizes": rows,
    }
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
