"""Cluster DNS sized for the flagship: the real CoreDNS (the lab's build of the layer's pin, with the
layer's Corefile) against the real API server on loopback, which holds the flagship's Services and
EndpointSlices when its GPU nodes all run jobs.

Run: .venv/bin/python bench/dns.py [--workers 1000] [--queries 20000]   (as root; writes
bench/results/dns.json)

- memory: CoreDNS's resident set once it has synced, with only the API's own Service, then with
  the flagship's full load: 7,500 GPU nodes' workers in jobs of --workers (a headless Service per job,
  its EndpointSlices of 100 named endpoints each) and the CPU pool's 128 x 30 pods behind Services
  of 30;
- a job's start: a launcher resolving its hostfile's --workers names
  (`<job>-worker-N.<job>.<namespace>.svc`) through glibc with a pod's resolver (ndots:5 and the
  cluster's search path, in a mount namespace of its own), and then 100 names outside the cluster:
  the queries CoreDNS answered, and the queries it forwarded to the node's resolver (a second
  CoreDNS that answers as a public resolver would, and counts), twice within the cache's 30 s, to
  show what the cache keeps from the upstream;
- capacity: --queries lookups of a Service name sent as fast as one client process sends them, and
  the CPU time CoreDNS spent on them (/proc/<pid>/stat): queries per second per core, and the latency
  the client saw.
"""

from __future__ import annotations

import json
import os
import random
import socket
import struct
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "src")]

from superkube.cluster import dns  # noqa: E402
from superkube.harness import apiserver, build  # noqa: E402
from superkube.plan import engine as planning  # noqa: E402

RESULT = ROOT / "bench" / "results" / "dns.json"
SERVER, UPSTREAM = "127.0.53.1", "127.0.53.2"
METRICS, UPSTREAM_METRICS = 19153, 19154
PER_SERVICE = 30  # the CPU pool's pods behind Services of 30 (the loopback server's range holds 254)
NAMESPACE = "research"
CLIENT_TICKS = os.sysconf("SC_CLK_TCK")


def _flagship() -> tuple[int, int, int]:
    """The flagship's GPU nodes, CPU nodes and pod IPs per CPU node, from its stack."""
    _, spec, _ = planning.load(ROOT, "flagship")
    gpu = sum(p.nodes for p in spec.node_pools if p.role == "gpu")
    cpu = [p for p in spec.node_pools if p.role == "cpu"]
    return gpu, sum(p.nodes for p in cpu), max(p.pod_ips_per_node for p in cpu)


GPU_NODES, CPU_NODES, CPU_PODS = _flagship()


def corefile(kubeconfig: Path) -> str:
    """The layer's Corefile, bound to a loopback address, reading the loopback API server, forwarding
    to the counting upstream."""
    text = dns.corefile("cluster.local")
    text = text.replace(".:53 {", f".:53 {{\n    bind {SERVER}", 1)
    text = text.replace("       ttl 30\n", f"       ttl 30\n       kubeconfig {kubeconfig}\n", 1)
    text = text.replace("forward . /etc/resolv.conf", f"forward . {UPSTREAM}:53", 1)
    text = text.replace(f"prometheus :{dns.METRICS_PORT}", f"prometheus 127.0.0.1:{METRICS}", 1)
    text = text.replace("    health {", "    health 127.0.0.1:18080 {", 1).replace(
        "    ready", "    ready 127.0.0.1:18181", 1
    )
    return text.replace("    loop\n", "")  # the bench's upstream is no loop


UPSTREAM_COREFILE = f""".:53 {{
    bind {UPSTREAM}
    prometheus 127.0.0.1:{UPSTREAM_METRICS}
    template IN A {{
        answer "{{{{ .Name }}}} 60 IN A 192.0.2.1"
    }}
    template IN AAAA {{
        rcode NOERROR
        authority ". 60 IN SOA ns. hostmaster. 1 60 60 60 60"
    }}
}}
"""
"""The node's resolver, as a public name gets it: an address (A, for 60 s), no IPv6 address (NODATA,
with the SOA a negative answer carries, so it too may be cached)."""


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise SystemExit(f"process {pid} is gone")


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLIENT_TICKS


def requests_total(port: int) -> float:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("coredns_dns_requests_total{")
    )


def apply(api: apiserver.LocalApi, docs: list[dict[str, Any]]) -> None:
    for i in range(0, len(docs), 200):
        try:
            apiserver.kubectl(
                api, "apply", "-f", "-", stdin="\n".join(json.dumps(d) for d in docs[i : i + 200])
            )
        except subprocess.CalledProcessError as e:
            raise SystemExit(f"loading the objects: {e.stderr.strip()[-500:]}") from None


def jobs_load(workers: int) -> list[dict[str, Any]]:
    """Headless Services and named EndpointSlices for every GPU node's worker, and the CPU pool's pods
    behind Services of PER_SERVICE (addresses from 10.64.0.0/13, as the flagship's pod IPs)."""
    docs: list[dict[str, Any]] = [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}]
    address = iter(f"10.{64 + i // 65536}.{i // 256 % 256}.{i % 256}" for i in range(10, 10**6))
    for j in range(-(-GPU_NODES // workers)):
        job, size = f"job-{j}", min(workers, GPU_NODES - j * workers)
        docs.append({"apiVersion": "v1", "kind": "Service", "metadata": {"name": job, "namespace": NAMESPACE},
                     "spec": {"clusterIP": "None", "selector": {"job": job}}})  # fmt: skip
        for s in range(0, size, 100):
            endpoints = [{"addresses": [next(address)], "hostname": f"{job}-worker-{n}", "conditions": {"ready": True}}
                         for n in range(s, min(s + 100, size))]  # fmt: skip
            docs.append({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
                         "metadata": {"name": f"{job}-{s // 100}", "namespace": NAMESPACE,
                                      "labels": {"kubernetes.io/service-name": job}},
                         "addressType": "IPv4", "endpoints": endpoints, "ports": []})  # fmt: skip
    pods = CPU_NODES * CPU_PODS
    for s in range(0, pods, PER_SERVICE):
        name = f"cpu-svc-{s // PER_SERVICE}"
        docs.append({"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "namespace": NAMESPACE},
                     "spec": {"selector": {"app": name}, "ports": [{"port": 80}]}})  # fmt: skip
        docs.append({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
                     "metadata": {"name": name, "namespace": NAMESPACE, "labels": {"kubernetes.io/service-name": name}},
                     "addressType": "IPv4", "ports": [{"port": 80, "protocol": "TCP"}],
                     "endpoints": [{"addresses": [next(address)], "conditions": {"ready": True}} for _ in range(PER_SERVICE)]})  # fmt: skip
    return docs


RESOLVE = r"""
import socket, sys, json
names = json.loads(sys.argv[1])
found = 0
for name in names:
    try:
        socket.getaddrinfo(name, 22, type=socket.SOCK_STREAM)
        found += 1
    except socket.gaierror:
        pass
print(found)
"""


def resolve_as_a_pod(names: list[str], work: Path) -> int:
    """Resolve `names` with getaddrinfo (A and AAAA, as ssh asks) under a pod's resolv.conf."""
    conf = work / "resolv.conf"
    conf.write_text(
        f"search {NAMESPACE}.svc.cluster.local svc.cluster.local cluster.local\nnameserver {SERVER}\noptions ndots:5\n"
    )
    script = f'mount --bind {conf} /etc/resolv.conf && exec {sys.executable} -c "$0" "$1"'
    done = subprocess.run(["unshare", "--mount", "sh", "-c", script, RESOLVE, json.dumps(names)],
                          capture_output=True, text=True, timeout=600)  # fmt: skip
    if done.returncode != 0:
        raise SystemExit(f"resolving as a pod failed: {done.stderr.strip()}")
    return int(done.stdout.strip())


def query(name: str, ident: int) -> bytes:
    header = struct.pack(">HHHHHH", ident, 0x0100, 1, 0, 0, 0)
    labels = b"".join(bytes([len(p)]) + p.encode() for p in name.rstrip(".").split(".")) + b"\0"
    return header + labels + struct.pack(">HH", 1, 1)


def load(count: int, pid: int) -> dict[str, float]:
    """`count` A queries for the API's Service, 64 in flight from one client: CoreDNS's CPU per query
    and the round trips the client saw."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.connect((SERVER, 53))
    sock.settimeout(2)
    packets = [query("kubernetes.default.svc.cluster.local", i % 65536) for i in range(count)]
    sent_at: dict[int, float] = {}
    took: list[float] = []
    before, started = cpu_s(pid), time.perf_counter()
    sent = 0
    while len(took) < count:
        while sent < count and sent - len(took) < 64:
            sent_at[sent % 65536] = time.perf_counter()
            sock.send(packets[sent])
            sent += 1
        try:
            reply = sock.recv(512)
        except TimeoutError:
            raise SystemExit(f"CoreDNS stopped answering after {len(took)} of {count} queries") from None
        (ident,) = struct.unpack(">H", reply[:2])
        took.append(time.perf_counter() - sent_at.pop(ident, time.perf_counter()))
    wall, spent = time.perf_counter() - started, cpu_s(pid) - before
    took.sort()
    return {
        "queries": count,
        "wall_s": round(wall, 2),
        "coredns_cpu_s": round(spent, 2),
        "queries_per_cpu_s": round(count / spent),
        "client_qps": round(count / wall),
        "p50_ms": round(1000 * took[len(took) // 2], 3),
        "p99_ms": round(1000 * took[int(len(took) * 0.99)], 3),
    }


def main() -> None:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=1000)
    parser.add_argument("--queries", type=int, default=20000)
    args = parser.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("run as root: CoreDNS binds port 53 and the resolver gets a mount namespace")
    built = build.build_all([c for c in build.components() if c.name == "coredns"])[0]
    binary = built.binary("coredns")
    with tempfile.TemporaryDirectory(prefix="superkube-dns-") as tmp:
        work = Path(tmp)
        with apiserver.running(work / "api") as api:
            (work / "Corefile").write_text(corefile(api.kubeconfig))
            (work / "Upstream").write_text(UPSTREAM_COREFILE)
            procs = [subprocess.Popen([str(binary), "-conf", str(work / name)], cwd=work,
                                      stdout=subprocess.DEVNULL, stderr=open(work / f"{name}.log", "w"))  # noqa: SIM115
                     for name in ("Upstream", "Corefile")]  # fmt: skip
            try:
                server = procs[1]
                deadline = time.monotonic() + 30
                while True:
                    try:
                        if urllib.request.urlopen("http://127.0.0.1:18181/ready", timeout=2).status == 200:
                            break
                    except OSError:
                        pass
                    if time.monotonic() > deadline or server.poll() is not None:
                        raise SystemExit(
                            f"CoreDNS did not get ready:\n{(work / 'Corefile.log').read_text()[-2000:]}"
                        )
                    time.sleep(0.5)
                time.sleep(3)
                empty_mib = rss_mib(server.pid)
                docs = jobs_load(args.workers)
                started = time.monotonic()
                apply(api, docs)
                print(f"loaded {len(docs):,} objects in {time.monotonic() - started:.0f} s", flush=True)
                time.sleep(10)  # the informers' events, then the memory they hold
                loaded_mib = rss_mib(server.pid)
                hostfile = [f"job-0-worker-{n}.job-0.{NAMESPACE}.svc" for n in range(args.workers)]
                outside = [f"host-{random.randrange(10**9)}.example.org" for _ in range(100)]
                rounds = []
                for _ in range(2):
                    asked, forwarded = requests_total(METRICS), requests_total(UPSTREAM_METRICS)
                    found = resolve_as_a_pod(hostfile, work)
                    mid_asked, mid_forwarded = requests_total(METRICS), requests_total(UPSTREAM_METRICS)
                    resolve_as_a_pod(outside, work)
                    end_asked, end_forwarded = requests_total(METRICS), requests_total(UPSTREAM_METRICS)
                    rounds.append({
                        "hostfile_names": len(hostfile), "resolved": found,
                        "hostfile_queries": mid_asked - asked, "hostfile_forwarded": mid_forwarded - forwarded,
                        "outside_names": len(outside), "outside_queries": end_asked - mid_asked,
                        "outside_forwarded": end_forwarded - mid_forwarded,
                    })  # fmt: skip
                capacity = load(args.queries, server.pid)
                peak_mib = rss_mib(server.pid)
            finally:
                for p in procs:
                    p.terminate()
                    p.wait(timeout=10)
    result = {
        "command": "bench/dns.py",
        "coredns": dns.COREDNS_VERSION,
        "workers_per_job": args.workers,
        "objects": {
            "services": -(-GPU_NODES // args.workers) + CPU_NODES * CPU_PODS // PER_SERVICE,
            "endpoints": GPU_NODES + CPU_NODES * CPU_PODS,
        },
        "rss_mib": {
            "api_service_only": round(empty_mib, 1),
            "flagship_loaded": round(loaded_mib, 1),
            "after_load": round(peak_mib, 1),
        },
        "job_start": rounds,
        "capacity": capacity,
    }
    first = rounds[0]
    print(f"CoreDNS {dns.COREDNS_VERSION} resident: {empty_mib:.0f} MiB with only the API's Service, "
          f"{loaded_mib:.0f} MiB with the flagship's ({result['objects']['services']:,} Services, "
          f"{result['objects']['endpoints']:,} endpoints)")  # fmt: skip
    print(f"a {args.workers}-worker job's hostfile through a pod's resolver: {first['hostfile_queries']:.0f} "
          f"queries ({first['hostfile_queries'] / args.workers:.1f} a name), {first['hostfile_forwarded']:.0f} "
          f"forwarded upstream; 100 outside names: {first['outside_queries']:.0f} queries, "
          f"{first['outside_forwarded']:.0f} forwarded, again: {rounds[1]['outside_forwarded']:.0f} forwarded")  # fmt: skip
    print(f"capacity: {capacity['queries_per_cpu_s']:,} queries per CPU-second; one client saw "
          f"{capacity['client_qps']:,} q/s, p50 {capacity['p50_ms']} ms, p99 {capacity['p99_ms']} ms")  # fmt: skip
    RESULT.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
