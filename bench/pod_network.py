"""The pod network on a real lab: CNI ADD latency, pod-to-pod vs host-to-host throughput, egress shaping.

Run (as root, with no lab up): .venv/bin/python bench/pod_network.py [--pods 100] [--seconds 5] [--reps 3]
     (prints a table; writes bench/results/pod_network.json)

Brings up a lab of two GPU nodes (+ the internet host), converges node_software and the accounting,
and measures, each figure a ratio within this one run:
- CNI ADD latency, p50/p99 over `--pods` pods one after another on one node (ADD timed, then DEL;
  the pod's network namespace is made inside the timing, the same for both): our chain (ptp +
  host-local over the NIC's IPs, superkube-bandwidth, portmap) vs the stock bridge + host-local +
  portmap network containerd ships as its example, with the same plugins from the same package;
- TCP throughput pod-to-pod across the two nodes vs node-to-node (iperf3, medians of `--reps`,
  alternated), target >= 0.9: the pod path adds two veth hops and no encapsulation;
- shaped throughput / limit at 10M, 100M and 1G, for the egress annotation delivered as the kubelet
  delivers it (rate + a burst of 2**32 - 1 bits) through our plugin and straight to the standard
  bandwidth plugin.
The lab is taken down at the end, whatever happens.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "src")]

from _lab import converged  # noqa: E402  (bench/ is the script's folder)

from superkube.lab import machines  # noqa: E402
from superkube.lab.state import Lab  # noqa: E402
from superkube.model.rates import parse_rate  # noqa: E402

CONFLIST = "/etc/cni/net.d/10-superkube.conflist"
CNIRUN = "cd /root/cni && python3 cnirun.py"
LIMITS = ("10M", "100M", "1G")
STOCK = {  # containerd's example network (its 10-containerd-net.conflist), on the same plugins
    "cniVersion": "1.0.0",
    "name": "containerd-net",
    "plugins": [
        {
            "type": "bridge",
            "bridge": "cni0",
            "isGateway": True,
            "ipMasq": True,
            "promiscMode": True,
            "ipam": {
                "type": "host-local",
                "ranges": [[{"subnet": "10.88.0.0/16"}]],
                "routes": [{"dst": "0.0.0.0/0"}],
            },
        },
        {"type": "portmap", "capabilities": {"portMappings": True}},
    ],
}


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def iperf(the_lab: Lab, host: str, target: str, seconds: int, pod: str = "") -> float:
    inside = f"ip netns exec {pod} " if pod else ""
    out = json.loads(machines.run_on(the_lab, host, f"{inside}iperf3 -c {target} -t {seconds} -J"))
    return float(out["end"]["sum_received"]["bits_per_second"])


def pod_ip(result: str) -> str:
    return str(json.loads(result)["ips"][0]["address"].split("/")[0])


def measure(the_lab: Lab, pods: int, seconds: int, reps: int) -> dict[str, Any]:
    for host in ("gpu-1", "gpu-2"):
        for name in ("lab/cnirun.py", "model/rates.py"):
            machines.put(
                the_lab, host, f"/root/cni/{Path(name).name}", (ROOT / "src" / "superkube" / name).read_text()
            )
    machines.put(the_lab, "gpu-1", "/root/cni/stock.conflist", json.dumps(STOCK))
    conf = json.loads(machines.run_on(the_lab, "gpu-1", f"cat {CONFLIST}"))
    conf["plugins"][1]["type"] = "bandwidth"  # the same chain, the standard plugin given the CRI burst
    machines.put(the_lab, "gpu-1", "/root/cni/stock-shaping.conflist", json.dumps(conf))
    out: dict[str, Any] = {}

    print(f"CNI ADD latency over {pods} pods ...", flush=True)
    ours = json.loads(machines.run_on(the_lab, "gpu-1", f"{CNIRUN} bench {pods}", timeout=600))["add_seconds"]
    stock = json.loads(
        machines.run_on(
            the_lab, "gpu-1", f"{CNIRUN} bench {pods} --conflist /root/cni/stock.conflist", timeout=600
        )
    )["add_seconds"]
    out["add_latency_ms"] = {
        name: {"p50": 1000 * pct(v, 0.5), "p99": 1000 * pct(v, 0.99)}
        for name, v in (("ours", ours), ("stock", stock))
    }

    print("pod-to-pod vs node-to-node throughput ...", flush=True)
    a = pod_ip(machines.run_on(the_lab, "gpu-1", f"{CNIRUN} add bench-a"))
    b = pod_ip(machines.run_on(the_lab, "gpu-2", f"{CNIRUN} add bench-b"))
    machines.run_on(the_lab, "gpu-2", "iperf3 -s -D && ip netns exec bench-b iperf3 -s -D -p 5201")
    time.sleep(0.5)
    del a
    pod_rates, node_rates = [], []
    for _ in range(reps):
        pod_rates.append(iperf(the_lab, "gpu-1", b, seconds, pod="bench-a"))
        node_rates.append(iperf(the_lab, "gpu-1", the_lab.host("gpu-2").address, seconds))
    out["throughput_gbit"] = {
        "pod_to_pod": statistics.median(pod_rates) / 1e9,
        "node_to_node": statistics.median(node_rates) / 1e9,
    }
    machines.run_on(the_lab, "gpu-1", f"{CNIRUN} del bench-a")
    machines.run_on(the_lab, "gpu-2", f"pkill -x iperf3; {CNIRUN} del bench-b")

    print("egress shaping ...", flush=True)
    machines.run_on(the_lab, "internet", "iperf3 -s -D")
    internet = the_lab.host("internet").address
    out["shaping"] = {}
    for limit in LIMITS:
        row = {}
        for name, conflist in (
            ("ours", CONFLIST),
            ("standard plugin, CRI burst", "/root/cni/stock-shaping.conflist"),
        ):
            machines.run_on(the_lab, "gpu-1", f"{CNIRUN} add shaped --egress {limit} --conflist {conflist}")
            try:
                row[name] = iperf(the_lab, "gpu-1", internet, seconds, pod="shaped") / parse_rate(limit)
            finally:
                machines.run_on(the_lab, "gpu-1", f"{CNIRUN} del shaped --conflist {conflist}")
        out["shaping"][limit] = row
    return out


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pods", type=int, default=100)
    parser.add_argument("--seconds", type=int, default=5)
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    with converged("gpu_nodes=2", "node_software,iptables_accounting,iptables_exporter") as the_lab:
        figures = measure(the_lab, args.pods, args.seconds, args.reps)
    lat, thr = figures["add_latency_ms"], figures["throughput_gbit"]
    print(f"\nCNI ADD latency, {args.pods} pods one after another on one node (ms):")
    for name in ("ours", "stock"):
        print(f"  {name:6} p50 {lat[name]['p50']:7.1f}   p99 {lat[name]['p99']:7.1f}")
    ratio = lat["ours"]["p50"] / lat["stock"]["p50"]
    print(f"  ours / stock: p50 x{ratio:.2f}, p99 x{lat['ours']['p99'] / lat['stock']['p99']:.2f}")
    frac = thr["pod_to_pod"] / thr["node_to_node"]
    print(
        f"\nTCP across nodes: pod-to-pod {thr['pod_to_pod']:.2f} Gbit/s, node-to-node {thr['node_to_node']:.2f} Gbit/s"
        f" -> {frac:.2f} (target >= 0.9)"
    )
    print("\nShaped egress / limit (iperf3 to the internet host):")
    for limit, row in figures["shaping"].items():
        print("  " + f"{limit:>5}: " + ", ".join(f"{k} {v:.2f}" for k, v in row.items()))
    figures.update(
        {
            "pods": args.pods,
            "seconds": args.seconds,
            "reps": args.reps,
            "add_p50_ratio_ours_to_stock": ratio,
            "pod_to_pod_fraction": frac,
        }
    )
    results = ROOT / "bench" / "results"
    results.mkdir(exist_ok=True)
    (results / "pod_network.json").write_text(json.dumps(figures, indent=2) + "\n")
    print(f"\nwritten: {results / 'pod_network.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
