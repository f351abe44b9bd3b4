"""A training job on the lab's real nodes: submit -> every pod Running, and submit -> Succeeded, for the
lab's example MPI job (examples/jobs/allreduce-lab.yaml, as `superkube job render` writes it) run
--runs times one after another through the real MPI Operator, gang scheduler, kubelets and cluster
DNS; and a pod's DNS lookups through the layer's CoreDNS.

Run: .venv/bin/python bench/training_job.py [--runs 10] [--lookups 1000] [--running-lab]
Brings up the control-plane lab (two GPU nodes, one CPU node), converges it, applies the in-cluster
layer and joins the nodes (minutes), unless --running-lab uses the lab that is up (converged, applied,
nodes joined). Each run's times are seen by polling the API every 0.2 s. The lookups are made by one
pod on a GPU node, with the resolver every pod has (ndots:5, the cluster's search path), of the API's
Service by its full name. Writes bench/results/training_job.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "src")]

from bench._lab import converged, kubectl  # noqa: E402
from superkube.cli import app  # noqa: E402
from superkube.cluster import gang  # noqa: E402
from superkube.lab import layer, nodes  # noqa: E402
from superkube.lab.state import LAB_STACK, Lab  # noqa: E402
from superkube.model import teams  # noqa: E402
from superkube.model.spec import PREFLIGHT_TAINT_KEY  # noqa: E402

CONTROL_PLANE = "gpu_nodes=2,cpu_nodes=1,nat_host=1,etcd_main=5,etcd_events=3,apiservers=2"
JOINED = ("gpu-1", "cpu-1", "gpu-2")
JOB = ROOT / "examples" / "jobs" / "allreduce-lab.yaml"
TEAM = "research"
RESULT = ROOT / "bench" / "results" / "training_job.json"
LOOKUP = r"""
import json, socket, time
took = []
for _ in range(COUNT):
    started = time.perf_counter()
    socket.getaddrinfo("kubernetes.default.svc.cluster.local", 443, socket.AF_INET, socket.SOCK_STREAM)
    took.append(time.perf_counter() - started)
print(json.dumps(took))
"""


def render(name: str) -> dict[str, Any]:
    from typer.testing import CliRunner

    result = CliRunner().invoke(app, ["job", "render", str(JOB), "--stack", LAB_STACK, "-o", "json"])
    if result.exit_code != 0:
        raise SystemExit(result.output)
    mpijob = dict(json.loads(result.stdout))
    mpijob["metadata"]["name"] = name
    for replica in mpijob["spec"]["mpiReplicaSpecs"].values():
        replica["template"]["metadata"]["labels"][gang.POD_GROUP_LABEL] = name
    return mpijob


def one_run(fleet: Lab, name: str) -> dict[str, float]:
    mpijob = render(name)
    started = time.monotonic()
    kubectl(fleet, "apply", "--server-side", "-f", "-", stdin=json.dumps(mpijob))
    running = None
    while True:
        now = time.monotonic() - started
        if now > 300:
            raise SystemExit(f"{name} has not finished in 300 s")
        if running is None:
            pods = json.loads(
                kubectl(
                    fleet, "-n", TEAM, "get", "pods", "-l", f"{gang.POD_GROUP_LABEL}={name}", "-o", "json"
                )
            )
            phases = [p["status"].get("phase") for p in pods["items"]]
            if len(phases) == 3 and all(p in ("Running", "Succeeded") for p in phases):
                running = now
        status = json.loads(kubectl(fleet, "-n", TEAM, "get", "mpijob", name, "-o", "json")).get("status", {})
        done = {c["type"] for c in status.get("conditions", []) if c["status"] == "True"} & {
            "Succeeded",
            "Failed",
        }
        if done:
            if done != {"Succeeded"} or running is None:
                raise SystemExit(f"{name}: {status}")
            nodes.approve_serving(fleet, JOINED)  # the lab's kubelet certificates last minutes
            log = kubectl(fleet, "-n", TEAM, "logs", f"job/{name}-launcher")
            if "expected 10: OK" not in log:
                raise SystemExit(f"{name}: the launcher did not report the right sum:\n{log}")
            kubectl(fleet, "-n", TEAM, "delete", "mpijob", name, "--wait=true")
            return {"running_s": round(running, 2), "succeeded_s": round(now, 2)}
        time.sleep(0.2)


def lookups(fleet: Lab, count: int) -> list[float]:
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "bench-dns", "namespace": "kube-system"},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": "gpu-1"},
            "tolerations": [
                {"key": PREFLIGHT_TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"},
                {"key": teams.TEAM_KEY, "operator": "Exists", "effect": "NoSchedule"},
            ],
            "restartPolicy": "Never",
            "containers": [
                {
                    "name": "main",
                    "image": fleet.images["agents"]["ref"],
                    "imagePullPolicy": "Never",
                    "command": ["python3", "-c", LOOKUP.replace("COUNT", str(count))],
                }
            ],
        },
    }
    kubectl(fleet, "apply", "-f", "-", stdin=json.dumps(pod))
    try:
        deadline = time.monotonic() + 300
        while (
            phase := json.loads(kubectl(fleet, "-n", "kube-system", "get", "pod", "bench-dns", "-o", "json"))[
                "status"
            ].get("phase")
        ) not in ("Succeeded", "Failed"):
            if time.monotonic() > deadline:
                raise SystemExit("the DNS pod did not finish in 300 s")
            time.sleep(1)
        nodes.approve_serving(fleet, ["gpu-1"])
        log = kubectl(fleet, "-n", "kube-system", "logs", "bench-dns")
        if phase != "Succeeded":
            raise SystemExit(f"the DNS pod failed:\n{log}")
        return sorted(json.loads(log.strip().splitlines()[-1]))
    finally:
        subprocess.run(
            [*layer.kubectl(fleet), "-n", "kube-system", "delete", "pod", "bench-dns", "--wait=false"],
            capture_output=True,
        )


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * share))]


def measure(fleet: Lab, runs: int, count: int) -> dict[str, Any]:
    namespace = {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {"name": TEAM, "labels": {teams.TEAM_KEY: TEAM}},
    }
    kubectl(fleet, "apply", "-f", "-", stdin=json.dumps(namespace))
    results = []
    for i in range(runs):
        got = one_run(fleet, f"bench-allreduce-{i}")
        print(
            f"  run {i + 1}/{runs}: all pods Running {got['running_s']} s, Succeeded {got['succeeded_s']} s",
            flush=True,
        )
        results.append(got)
    took = lookups(fleet, count)
    return {
        "command": "bench/training_job.py",
        "job": str(JOB.relative_to(ROOT)),
        "runs": results,
        "running_p50_s": statistics.median(r["running_s"] for r in results),
        "running_p99_s": percentile([r["running_s"] for r in results], 0.99),
        "succeeded_p50_s": statistics.median(r["succeeded_s"] for r in results),
        "succeeded_p99_s": percentile([r["succeeded_s"] for r in results], 0.99),
        "dns_lookups": count,
        "dns_p50_ms": round(1000 * percentile(took, 0.5), 2),
        "dns_p99_ms": round(1000 * percentile(took, 0.99), 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--lookups", type=int, default=1000)
    parser.add_argument("--running-lab", action="store_true", help="use the lab that is up")
    args = parser.parse_args()
    if args.running_lab:
        fleet = Lab.load()
        if fleet is None:
            raise SystemExit("no lab is up; leave out --running-lab to bring one up")
        result = measure(fleet, args.runs, args.lookups)
    else:
        with converged(CONTROL_PLANE, "all") as fleet:
            from typer.testing import CliRunner

            applied = CliRunner().invoke(app, ["lab", "apply"])
            if applied.exit_code != 0:
                raise SystemExit(applied.output)
            nodes.join(fleet, JOINED)
            result = measure(fleet, args.runs, args.lookups)
    print(
        f"submit -> all pods Running: p50 {result['running_p50_s']} s, p99 {result['running_p99_s']} s; "
        f"-> Succeeded: p50 {result['succeeded_p50_s']} s, p99 {result['succeeded_p99_s']} s ({args.runs} runs)"
    )
    print(
        f"DNS from a pod: {args.lookups} lookups, p50 {result['dns_p50_ms']} ms, p99 {result['dns_p99_ms']} ms"
    )
    RESULT.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
