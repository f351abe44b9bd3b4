"""Real nodes on the lab: from a kubelet's start to its Node Ready, and pod create -> Running through the
real runtime (kubelet, containerd, runc, the node's CNI chain), on the control-plane lab.

Run: .venv/bin/python bench/real_nodes.py [--pods 20] [--rounds 3]
Brings up the control-plane lab (one GPU and one CPU node), converges it, applies the in-cluster
layer, joins both nodes, then creates --pods pods at once on the CPU node (the GPU pool's nodes have
7 pod IPs), --rounds times, and prints p50/p99 of each pod's create -> Ready, seen by polling the API
every 0.2 s (with 20 pods, p99 is the slowest). Writes bench/results/real_nodes.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "src")]

from bench._lab import converged  # noqa: E402
from superkube.lab import hosts as lab  # noqa: E402
from superkube.lab import layer, nodes  # noqa: E402

CONTROL_PLANE = "gpu_nodes=1,cpu_nodes=1,nat_host=1,etcd_main=5,etcd_events=3,apiservers=2"
NODE = "cpu-1"
# kube-system: the team webhook, which asks about every other pod, does not run on the lab yet
POD = """apiVersion: v1
kind: Pod
metadata: {{name: {name}, namespace: kube-system, labels: {{bench: real-nodes}}}}
spec:
  nodeSelector: {{kubernetes.io/hostname: {node}}}
  terminationGracePeriodSeconds: 0
  containers:
  - {{name: main, image: "{image}", imagePullPolicy: Never}}
"""


def kubectl(fleet: lab.Lab, *args: str, stdin: str | None = None) -> str:
    proc = subprocess.run(
        [*layer.kubectl(fleet), *args], input=stdin, capture_output=True, text=True, timeout=300
    )
    if proc.returncode != 0:
        raise SystemExit(f"kubectl {' '.join(args)}: {proc.stderr.strip()}")
    return proc.stdout


def ready_at(fleet: lab.Lab, names: set[str], start: float, timeout_s: float = 300) -> dict[str, float]:
    """Seconds from `start` until each named pod was first seen Ready."""
    seen: dict[str, float] = {}
    while len(seen) < len(names):
        if time.monotonic() - start > timeout_s:
            raise SystemExit(f"not Ready after {timeout_s:.0f} s: {sorted(names - set(seen))}")
        for pod in json.loads(
            kubectl(fleet, "-n", "kube-system", "get", "pods", "-l", "bench=real-nodes", "-o", "json")
        )["items"]:
            name = pod["metadata"]["name"]
            conditions = (pod.get("status") or {}).get("conditions") or []
            if (
                name in names
                and name not in seen
                and any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)
            ):
                seen[name] = time.monotonic() - start
        time.sleep(0.2)
    return seen


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pods", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with converged(CONTROL_PLANE, "all") as fleet:
        print("applying the in-cluster layer ...", flush=True)
        layer.apply(fleet, lambda what: None)
        joined = nodes.join(fleet)
        for j in joined:
            if j.kubelet_to_ready_s is None:
                raise SystemExit(f"{j.name} was Ready before the join: a fresh lab was expected")
            print(f"{j.name}: kubelet start -> Node Ready {j.kubelet_to_ready_s:.2f} s", flush=True)
        image = fleet.images["pause"]["ref"]
        rounds = []
        for r in range(args.rounds):
            names = {f"bench-{r}-{i}" for i in range(args.pods)}
            manifests = "---\n".join(POD.format(name=n, node=NODE, image=image) for n in sorted(names))
            start = time.monotonic()
            kubectl(fleet, "apply", "-f", "-", stdin=manifests)
            seen = ready_at(fleet, names, start)
            values = list(seen.values())
            rounds.append({"p50_s": pct(values, 0.5), "p99_s": pct(values, 0.99), "max_s": max(values)})
            print(f"round {r + 1}: {args.pods} pods create -> Ready p50 {rounds[-1]['p50_s']:.2f} s, "
                  f"p99 {rounds[-1]['p99_s']:.2f} s", flush=True)  # fmt: skip
            kubectl(
                fleet,
                "-n",
                "kube-system",
                "delete",
                "pods",
                "-l",
                "bench=real-nodes",
                "--wait=true",
                "--timeout=120s",
            )
    result = {
        "lab": CONTROL_PLANE,
        "kubelet_to_ready_s": {j.name: j.kubelet_to_ready_s for j in joined},
        "pods_per_round": args.pods,
        "node": NODE,
        "rounds": rounds,
        "p50_s_median": statistics.median(r["p50_s"] for r in rounds),
        "p99_s_median": statistics.median(r["p99_s"] for r in rounds),
    }
    out = ROOT / "bench" / "results" / "real_nodes.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {out.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
