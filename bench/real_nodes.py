"""Real nodes on the lab: from a kubelet's start to its Node Ready, and pod create -> Running through the
real runtime (kubelet, containerd, runc, the node's CNI chain), on the control-plane lab.

Run: .venv/bin/python bench/real_nodes.py [--pods 20] [--rounds 3]
Brings up the control-plane lab (one GPU and one CPU node), converges it, applies the in-cluster
layer, joins both nodes, then creates --pods pods at once on the CPU node (the GPU pool's nodes have
7 pod IPs), --rounds times, and prints p50/p99 of each pod's create -> Ready, seen by polling the API
every 0.2 s (with 20 pods, p99 is the slowest).

Then the CNI chain's cost through the real runtime: the kubelet's own RunPodSandbox latency (its
`kubelet_runtime_operations_duration_seconds` for run_podsandbox, read with the API server's kubelet
client certificate), which is containerd making the sandbox and calling the node's CNI chain, for
--cni-pods pods at once with
our chain (ptp, superkube-bandwidth, portmap) and with a stock bridge chain (bridge, host-local,
portmap) on the same node, alternating A B A B, as a ratio. Writes bench/results/real_nodes.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "src")]

from bench._lab import converged, kubectl  # noqa: E402
from superkube.lab import layer, machines, nodes  # noqa: E402
from superkube.lab.state import Lab  # noqa: E402

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


def delete_pods(fleet: Lab) -> None:
    """Every pod of this benchmark, gone (sandboxes and IPs released) before the call returns."""
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


def ready_at(fleet: Lab, names: set[str], start: float, timeout_s: float = 300) -> dict[str, float]:
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


STOCK_BRIDGE = "/etc/cni/net.d/05-stock-bridge.conflist"  # sorts before ours: containerd takes the first
STOCK_CONFLIST = {
    "cniVersion": "1.0.0",
    "name": "stock-bridge",
    "plugins": [
        {
            "type": "bridge",
            "bridge": "cni0",
            "isGateway": True,
            "ipMasq": True,
            "ipam": {"type": "host-local", "ranges": [[{"subnet": "10.250.0.0/24"}]]},
        },
        {"type": "portmap", "capabilities": {"portMappings": True}},
    ],
}


APISERVER_PKI = "/etc/kubernetes/pki"  # the kube_apiserver role's kube_apiserver_host_pki_dir


def sandbox_seconds(fleet: Lab) -> tuple[float, int, int]:
    """The kubelet's RunPodSandbox calls so far on NODE: (seconds in all, calls, calls that failed).
    Read on an API server host with the API server's own kubelet client certificate, as the API
    server would: its node proxy refuses the kubelet's self-signed serving certificate (no IP SANs,
    no cluster CA), so the certificate is not verified here (-k); the client one is, by the kubelet."""
    api = next(h for h in fleet.hosts if h.group == "apiservers")
    client = f"{APISERVER_PKI}/apiserver-kubelet-client"
    url = f"https://{fleet.host(NODE).address}:10250/metrics"
    proc = machines.ssh(fleet, api, f"curl -sS --fail -k --cert {client}.crt --key {client}.key {url}")
    if proc.returncode != 0:
        raise SystemExit(f"{api.name}: reading {url}: {proc.stderr.strip()}")
    total, count, errors = 0.0, 0, 0
    for line in proc.stdout.splitlines():
        if 'operation_type="run_podsandbox"' not in line:
            continue
        if line.startswith("kubelet_runtime_operations_duration_seconds_sum"):
            total = float(line.split()[-1])
        elif line.startswith("kubelet_runtime_operations_duration_seconds_count"):
            count = int(float(line.split()[-1]))
        elif line.startswith("kubelet_runtime_operations_errors_total"):
            errors = int(float(line.split()[-1]))
    return total, count, errors


def pod_ips(fleet: Lab) -> list[str]:
    listed = kubectl(fleet, "-n", "kube-system", "get", "pods", "-l", "bench=real-nodes", "-o", "json")
    return [p["status"].get("podIP", "") for p in json.loads(listed)["items"]]


def on_chain(fleet: Lab, chain: str, ip: str) -> bool:
    """Whether a pod's IP is the one `chain` gives: the stock bridge's range, or one of NODE's NIC IPs."""
    if chain == "stock":
        return ip.startswith("10.250.")
    return ip in fleet.host(NODE).secondary


def switch(fleet: Lab, chain: str, image: str, tag: str) -> None:
    """Put `chain` in place on NODE, and wait until containerd uses it: a probe pod gets its IP from
    it (containerd reloads the directory on a change, a moment later). The probe is gone after."""
    if chain == "stock":
        machines.put(fleet, NODE, STOCK_BRIDGE, json.dumps(STOCK_CONFLIST))
    else:
        machines.ssh(fleet, fleet.host(NODE), f"rm -f {STOCK_BRIDGE}")
    deadline = time.monotonic() + 120
    for attempt in range(100):
        name = f"probe-{tag}-{attempt}"
        kubectl(fleet, "apply", "-f", "-", stdin=POD.format(name=name, node=NODE, image=image))
        ready_at(fleet, {name}, time.monotonic())
        (ip,) = pod_ips(fleet)
        delete_pods(fleet)
        if on_chain(fleet, chain, ip):
            return
        if time.monotonic() > deadline:
            raise SystemExit(f"{chain}: containerd still gives pods {ip} two minutes after the change")
        time.sleep(2)


def sandbox_failures(fleet: Lab, names: set[str]) -> list[str]:
    """What the kubelet said of each failed sandbox of these pods (its FailedCreatePodSandBox events)."""
    listed = kubectl(
        fleet,
        "-n",
        "kube-system",
        "get",
        "events",
        "--field-selector=reason=FailedCreatePodSandBox",
        "-o",
        "json",
    )
    return [e["message"][-200:] for e in json.loads(listed)["items"] if e["involvedObject"]["name"] in names]


def sandboxes(fleet: Lab, chain: str, pods: int, image: str, tag: str, tries: int = 3) -> float:
    """Mean RunPodSandbox seconds for `pods` pods created at once on NODE with `chain` in place. A
    round in which any sandbox failed (the kubelet retries it, and the failed call's time would
    count) is said, with the kubelet's reasons, and run again, up to `tries` times."""
    switch(fleet, chain, image, tag)
    for attempt in range(tries):
        before = sandbox_seconds(fleet)
        names = {f"cni-{tag}-{attempt}-{i}" for i in range(pods)}
        kubectl(
            fleet,
            "apply",
            "-f",
            "-",
            stdin="---\n".join(POD.format(name=n, node=NODE, image=image) for n in sorted(names)),
        )
        ready_at(fleet, names, time.monotonic())
        after = sandbox_seconds(fleet)
        wrong = [ip for ip in pod_ips(fleet) if not on_chain(fleet, chain, ip)]
        reasons = sandbox_failures(fleet, names)
        # every pod goes before the chain changes: DEL runs the chain that is in place
        delete_pods(fleet)
        if wrong:
            raise SystemExit(f"{chain} round: pods got {wrong}, not from the {chain} chain")
        made, failed = after[1] - before[1], after[2] - before[2]
        if made == pods and not failed:
            return (after[0] - before[0]) / made
        print(
            f"  ({chain}: {made} sandboxes, {failed} failed, for {pods} pods: {sorted(set(reasons))}; again)"
        )
        time.sleep(10)
    raise SystemExit(f"{chain} round: sandboxes failed in each of {tries} tries")


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pods", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--cni-pods", type=int, default=10, help="pods at once per RunPodSandbox round")
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
            delete_pods(fleet)
        print("RunPodSandbox: our chain vs the stock bridge ...", flush=True)
        means: dict[str, list[float]] = {"ours": [], "stock": []}
        try:
            for i, chain in enumerate(("ours", "stock", "ours", "stock")):
                means[chain].append(sandboxes(fleet, chain, args.cni_pods, image, f"{chain}-{i}"))
                print(f"  {chain}: {means[chain][-1] * 1000:.0f} ms per sandbox", flush=True)
        finally:
            machines.ssh(fleet, fleet.host(NODE), f"rm -f {STOCK_BRIDGE}")
    ours, stock = statistics.mean(means["ours"]), statistics.mean(means["stock"])
    print(
        f"RunPodSandbox mean: ours {ours * 1000:.0f} ms, stock bridge {stock * 1000:.0f} ms, ratio {ours / stock:.2f}"
    )
    result = {
        "lab": CONTROL_PLANE,
        "kubelet_to_ready_s": {j.name: j.kubelet_to_ready_s for j in joined},
        "pods_per_round": args.pods,
        "node": NODE,
        "rounds": rounds,
        "p50_s_median": statistics.median(r["p50_s"] for r in rounds),
        "p99_s_median": statistics.median(r["p99_s"] for r in rounds),
        "run_podsandbox_pods_per_round": args.cni_pods,
        "run_podsandbox_s": {"ours": means["ours"], "stock_bridge": means["stock"]},
        "run_podsandbox_ratio": ours / stock,
    }
    out = ROOT / "bench" / "results" / "real_nodes.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {out.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
