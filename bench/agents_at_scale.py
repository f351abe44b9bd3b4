"""The node agents at fleet scale, against the real API server (etcd and kube-apiserver at the pinned
versions, on loopback) with kwok (built from its Go module) as every node's kubelet: the flagship's
GPU Nodes, about 13 KB each (its labels, 8 GPUs, a kubelet's usual status with its image list),
at 1,000 / 2,500 / 5,000 / 7,500 beside its 128-node CPU pool. kwok turns each Ready, renews its
Lease every 10 s and reports status every 5 minutes, as kubelets do, and runs the pods bound to
them. At each size:

- the health controller (its process, as its own service account, leading by its Lease): peak RSS,
  time to its first list, API requests per minute at steady state, time from one node's fatal
  report to its cordon; then 5 % of the nodes reported
  fatal at once: time from the reports to the last cordon, requests during the burst, and the
  breaker, which must cordon exactly the share allowed and hold the rest;
- one health agent (its process, on one node): peak RSS and requests per minute (7,500 of them make
  7,500 times that, whatever the number of failures);
- the team reconciler: peak RSS and requests per minute at steady state;
- the API server's resident memory, and how long kwok took to make the new nodes Ready.
Each node reported fatal in the burst runs a pod, which the controller evicts and kwok removes.
Requests are counted from the API server's audit log, by service account (kwok's are not audited).

Run: .venv/bin/python bench/agents_at_scale.py [--sizes 1000,2500,5000,7500]
Writes bench/results/agents_at_scale.json.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "src")]

from kubernetes import client, config  # noqa: E402

from superkube.agents import health_controller as hc  # noqa: E402
from superkube.agents import node_health as nh  # noqa: E402
from superkube.agents import team_taints  # noqa: E402
from superkube.cluster import cloudinit  # noqa: E402
from superkube.cluster.kube import SYSTEM_NAMESPACE  # noqa: E402
from superkube.lab import apiserver  # noqa: E402
from superkube.lab import kwok as kwok_lab  # noqa: E402
from superkube.model.spec import PREFLIGHT_TAINT_KEY  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "agents_at_scale.json"
POOL = "gpu"
CPU_POOL, CPU_NODES = "cpu", 128  # the flagship's CPU pool, beside the GPU pool at every size
NAMESPACE = SYSTEM_NAMESPACE
TRAINERS = "trainers"
STEADY_S = 30.0
FAULT_SHARE = 0.05


def node_body(i: int, pool: str = POOL) -> tuple[dict[str, Any], dict[str, Any]]:
    """A node as its kubelet registers it (handed to kwok) and the status it reports at registration:
    the plan's node-template labels, past preflight (its label gone), and the hardware's. Not its
    team's taint, which kubelets now register with: the reconciler's first pass adds it, so the
    figures include a write per node that a real cluster's first pass no longer makes."""
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
    body, status = kwok_lab.node(name, labels, capacity, address=address)
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


def grow(core: Any, start: int, stop: int, pool: str = POOL) -> None:
    def one(i: int) -> None:
        body, status = node_body(i, pool)
        core.create_node(body)
        core.patch_node_status(body["metadata"]["name"], status)
        # the node lifecycle controller lifts the not-ready taint once the node is Ready; none runs here
        core.patch_node(body["metadata"]["name"], {"spec": {"taints": None}})

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


def per_minute(
    api: apiserver.LocalApi, user: str, since: int, seconds: float
) -> tuple[float, dict[str, int]]:
    requests = api.requests(user)[since:]
    verbs: dict[str, int] = {}
    for r in requests:
        verbs[r["verb"]] = verbs.get(r["verb"], 0) + 1
    return len(requests) * 60 / seconds, verbs


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


def steady(api: apiserver.LocalApi, user: str, argv: list[str], log: Path, name: str) -> dict[str, Any]:
    """Run one agent's process for the steady window: its requests a minute, by verb, and peak RSS."""
    seen = len(api.requests(user))
    proc = start(argv, log)
    try:
        time.sleep(STEADY_S)
        rate, verbs = per_minute(api, user, seen, STEADY_S)
        return {
            f"{name}_requests_per_min": round(rate, 1),
            f"{name}_verbs": verbs,
            f"{name}_peak_rss_mib": round(peak_rss_mib(proc.pid), 1),
        }
    finally:
        proc.terminate()
        proc.wait(30)


def measure(
    api: apiserver.LocalApi, core: Any, n: int, kubeconfigs: dict[str, Path], work: Path
) -> dict[str, Any]:
    out: dict[str, Any] = {"nodes": n}
    sa = {k: f"system:serviceaccount:{NAMESPACE}:{k}" for k in kubeconfigs}
    # the controller
    seen = len(api.requests(sa[hc.COMPONENT]))
    began = time.monotonic()
    ctl = start(["superkube.agents.health_controller", "--pools", POOL, "--kubeconfig",
                 str(kubeconfigs[hc.COMPONENT]), "--metrics-port", "0", "--metrics-address", "127.0.0.1",
                 "--interval", "10", "--namespace", NAMESPACE, "--identity", f"bench-{n}"],
                work / f"controller-{n}.log")  # fmt: skip
    try:
        out["controller_first_list_s"] = round(
            wait_for(lambda: any(r["verb"] == "watch" for r in api.requests(sa[hc.COMPONENT])[seen:]), 300), 2
        )
        steady_from = len(api.requests(sa[hc.COMPONENT]))
        time.sleep(STEADY_S)
        rate, verbs = per_minute(api, sa[hc.COMPONENT], steady_from, STEADY_S)
        out["controller_steady_requests_per_min"] = round(rate, 1)
        out["controller_steady_verbs"] = verbs
        # one node reported fatal, in a quiet fleet: the time to its cordon
        single = f"gpu-{n - 1:05d}"
        seen_single = len(api.requests(sa[hc.COMPONENT]))
        began = time.monotonic()
        core.patch_node(single, nh.report_patch("fatal: GPU 1: Xid 48: double-bit ECC error", nh.now()))
        out["one_report_to_cordon_s"] = round(wait_for(lambda: any(
            r["verb"] == "patch" and r["uri"].split("?")[0].endswith(f"/nodes/{single}")
            for r in api.requests(sa[hc.COMPONENT])[seen_single:]), 120), 2)  # fmt: skip
        core.patch_node(single, {"metadata": {"annotations": {nh.VERDICT_ANNOTATION: "healthy", nh.ANNOTATION: None}},
                                 "spec": {"unschedulable": False}})  # fmt: skip
        time.sleep(2)
        # 5 % of the pool reported fatal at once (each by its own agent, here by the admin)
        failing = [f"gpu-{i:05d}" for i in range(0, n, int(1 / FAULT_SHARE) - 1)][: int(n * FAULT_SHARE) + 3]
        allowed = int(n * FAULT_SHARE)
        # each runs a training pod (bound as the scheduler would; kwok runs it)
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda name: core.create_namespaced_pod(TRAINERS, {
                "metadata": {"name": f"trainer-on-{name}"},
                "spec": {"nodeName": name, "automountServiceAccountToken": False,
                         "containers": [{"name": "c", "image": "registry.invalid/trainer:0"}]}}), failing))  # fmt: skip
        wait_for(lambda: running_pods(core) == len(failing), 300)
        burst_from = len(api.requests(sa[hc.COMPONENT]))
        began = time.monotonic()
        report = nh.report_patch("fatal: GPU 3: Xid 79: GPU has fallen off the bus", nh.now())
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda name: core.patch_node(name, report), failing))
        reported_s = time.monotonic() - began

        def cordoned() -> int:
            return sum(1 for r in api.requests(sa[hc.COMPONENT])[burst_from:]
                       if r["verb"] == "patch" and "/nodes/" in r["uri"])  # fmt: skip

        out["reports"] = len(failing)
        out["reports_sent_s"] = round(reported_s, 2)
        out["report_to_last_cordon_s"] = round(wait_for(lambda: cordoned() >= allowed, 300) + reported_s, 2)
        # the evicted pods stopped by their kubelets (kwok) and gone; the held nodes' pods stay
        wait_for(lambda: pod_count(core) <= len(failing) - allowed, 300)
        out["report_to_last_pod_gone_s"] = round(time.monotonic() - began, 2)
        time.sleep(3)  # and no more than the share
        out["cordoned"] = cordoned()
        out["breaker_allowed"] = allowed
        out["pods_left_on_held_nodes"] = pod_count(core)
        out["evicted"] = sum(
            1 for r in api.requests(sa[hc.COMPONENT])[burst_from:] if r["uri"].endswith("/eviction")
        )
        burst_s = time.monotonic() - began
        rate, verbs = per_minute(api, sa[hc.COMPONENT], burst_from, burst_s)
        out["controller_burst_requests"] = sum(verbs.values())
        out["controller_burst_verbs"] = verbs
        out["controller_peak_rss_mib"] = round(peak_rss_mib(ctl.pid), 1)
    finally:
        ctl.terminate()
        ctl.wait(30)
    # un-report and uncordon for the next size
    clean = {"metadata": {"annotations": {nh.VERDICT_ANNOTATION: "healthy", nh.ANNOTATION: None}},
             "spec": {"unschedulable": False}}  # fmt: skip
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda name: core.patch_node(name, clean), failing))
    core.delete_collection_namespaced_pod(TRAINERS)
    wait_for(lambda: pod_count(core) == 0, 120)
    # one health agent
    reading = work / "reading.json"
    doc = json.loads((ROOT / "tests" / "agents" / "readings" / "healthy.json").read_text())
    reading.write_text(json.dumps({**doc, "node": "gpu-00001"}))
    common = ["--metrics-port", "0", "--metrics-address", "127.0.0.1", "--interval", "5"]
    agent = ["superkube.agents.node_health", "--node", "gpu-00001", "--pool", POOL, "--reading", str(reading),
             "--kubeconfig", str(kubeconfigs[nh.COMPONENT]), *common]  # fmt: skip
    out.update(steady(api, sa[nh.COMPONENT], agent, work / f"agent-{n}.log", "agent"))
    # the team reconciler
    teams_file = work / "teams.yaml"
    teams_file.write_text("- {selector: {rack: r0000}, team: research, priority: 0}\n")
    reconciler = ["superkube.agents.team_taints", "--config", str(teams_file),
                  "--kubeconfig", str(kubeconfigs[team_taints.COMPONENT]), *common]  # fmt: skip
    out.update(steady(api, sa[team_taints.COMPONENT], reconciler, work / f"teams-{n}.log", "team_reconciler"))
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
            tuples=team_capacity.teams.parse([{"selector": {"rack": "r0000"}, "team": "research"}]), webhook_tls=""))
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
