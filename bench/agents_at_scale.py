"""The node agents at fleet scale, against the real API server (etcd and kube-apiserver at the pinned
versions, on loopback): GPU Nodes of about 13 KB each (the flagship's labels and capacity, 8 GPUs,
a kubelet's usual status with its image list) at 1,000 / 2,500 / 5,000 / 7,500, and at each size:

- the health controller (its process, as its own service account, leading by its Lease): peak RSS,
  time to its first list, API requests per minute at steady state, time from one node's fatal
  report to its cordon; then 5 % of the nodes reported
  fatal at once: time from the reports to the last cordon, requests during the burst, and the
  breaker, which must cordon exactly the share allowed and hold the rest;
- one health agent (its process, on one node): peak RSS and requests per minute (7,500 of them make
  7,500 times that, whatever the number of failures);
- the team reconciler: peak RSS and requests per minute at steady state.
Requests are counted from the API server's audit log, by service account.

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
from superkube.lab import apiserver  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "agents_at_scale.json"
POOL = "gpu"
NAMESPACE = "superkube-system"
STEADY_S = 30.0
FAULT_SHARE = 0.05


def node_body(i: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """A GPU node as a kubelet registers it, and its status."""
    name = f"gpu-{i:05d}"
    labels = {
        "superkube.io/pool": POOL,
        "kubernetes.io/hostname": name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "node.kubernetes.io/instance-type": "Standard_ND96isr_H100_v5",
        "topology.kubernetes.io/region": "eastus2",
        "topology.kubernetes.io/zone": f"eastus2-{1 + i % 3}",
        "nvidia.com/gpu.present": "true",
        "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
        "nvidia.com/gpu.count": "8",
        "rack": f"r{i // 32:04d}",
        **{
            f"feature.node.kubernetes.io/cpu-cpuid.{f}": "true"
            for f in ("AVX512F", "AMXBF16", "AMXINT8", "VAES")
        },
    }
    body = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels}}
    images = [
        {
            "names": [f"registry.example.com/team-{j % 7}/trainer@sha256:{(i * 131 + j):064x}",
                      f"registry.example.com/team-{j % 7}/trainer:v{j}.{i % 10}"],
            "sizeBytes": 8_000_000_000 + j,
        }
        for j in range(40)
    ]  # fmt: skip
    capacity = {
        "cpu": "96",
        "memory": "1900Gi",
        "nvidia.com/gpu": "8",
        "pods": "110",
        "ephemeral-storage": "2Ti",
    }
    status = {
        "status": {
            "capacity": capacity,
            "allocatable": capacity,
            "addresses": [
                {"type": "InternalIP", "address": f"10.{(i >> 8) & 255}.{i & 255}.4"},
                {"type": "Hostname", "address": name},
            ],
            "conditions": [
                {
                    "type": t,
                    "status": "False" if t != "Ready" else "True",
                    "reason": f"Kubelet{t}",
                    "message": f"kubelet reports {t}",
                    "lastHeartbeatTime": "2026-11-25T10:00:00Z",
                    "lastTransitionTime": "2026-11-25T10:00:00Z",
                }
                for t in ("MemoryPressure", "DiskPressure", "PIDPressure", "Ready")
            ],
            "nodeInfo": {
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
            },
            "images": images,
        }
    }
    return body, status


def grow(core: Any, start: int, stop: int) -> None:
    def one(i: int) -> None:
        body, status = node_body(i)
        core.create_node(body)
        core.patch_node_status(body["metadata"]["name"], status)
        core.patch_node(body["metadata"]["name"], {"spec": {"taints": None}})  # in service: not-ready lifted

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        list(pool.map(one, range(start, stop)))


def token_for(core: Any, account: str) -> str:
    core.create_namespaced_service_account(NAMESPACE, {"metadata": {"name": account}})
    request = {"spec": {"audiences": [apiserver.ISSUER], "expirationSeconds": 7200}}
    return str(core.create_namespaced_service_account_token(account, NAMESPACE, request).status.token)


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


def wait_for(check: Any, timeout: float) -> float:
    began = time.monotonic()
    while not check():
        if time.monotonic() - began > timeout:
            raise TimeoutError("timed out")
        time.sleep(0.1)
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
        time.sleep(3)  # and no more than the share
        out["cordoned"] = cordoned()
        out["breaker_allowed"] = allowed
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
        from tests.agents.conftest import apply
        from tests.agents.test_real_api import _args

        objects = [
            *component._access("health"),
            *[m for m in component.controller(_args()) if m["kind"] != "Deployment"],
        ]
        objects += [m for m in team_capacity.reconciler(team_capacity.TeamCapacityArgs(
            tuples=team_capacity.teams.parse([{"selector": {"rack": "r0000"}, "team": "research"}]), webhook_tls=""))
            if m["kind"] in ("ServiceAccount", "ClusterRole", "ClusterRoleBinding")]  # fmt: skip
        apply(api, *[o for o in objects if o["kind"] != "ServiceAccount"])
        kubeconfigs = {
            account: api.token_kubeconfig(account, token_for(core, account))
            for account in (hc.COMPONENT, nh.COMPONENT, team_taints.COMPONENT)
        }
        rows = []
        have = 0
        for n in sizes:
            began = time.monotonic()
            grow(core, have, n)
            have = n
            print(f"{n} nodes made in {time.monotonic() - began:.0f} s", file=sys.stderr)
            row = measure(api, core, n, kubeconfigs, work)
            print(json.dumps(row), file=sys.stderr)
            rows.append(row)
        sample = json.dumps(core.api_client.sanitize_for_serialization(core.read_node("gpu-00002")))
    result = {
        "node_json_bytes": len(sample),
        "steady_window_s": STEADY_S,
        "fault_share": FAULT_SHARE,
        "sizes": rows,
    }
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
