"""What per-pod accounting costs at the flagship's densities: rules per node, the exporter's scrape,
ADD and DEL latency, and its series in the metrics store.

Run as root: .venv/bin/python bench/pod_accounting.py   (prints a table; writes
bench/results/pod_accounting.json)

On a node in network namespaces (superkube.harness.podnet: the node's real conflist with Debian's
ptp, host-local and portmap, the roles' rules, hooks and settings rendered for the flagship, nft
iptables as Debian 12 and Ubuntu 22.04 ship it) it measures:
- the rules a node holds with no pods, with a GPU node's pods (the GPU pool's pod IPs, 7) and a CPU
  node's (30): mangle rules in all, the per-pod ones, the tagged rules and the exporter's series;
- the exporter's scrape at each density against `iptables-save -c` alone, as bench/exporter.py
  times them (bench/_exporter_worker.py, inside the node's namespace);
- ADD and DEL latency: a CPU node's 30 pods added one after another and deleted, each plugin of the
  chain timed as a container runtime calls it (bench/_pod_accounting_worker.py), the accounting
  step apart from the whole chain;
- the metrics store's cost of a series that lives and ends: Debian's VictoriaMetrics (the store's
  engine; the flagship runs the cluster version of a later release) is given the same samples
  twice, once as long-lived pods' series and once as pods that come and go eight times as often,
  and the difference on disk after a flush and merge is what each further series costs.

From those and the flagship's stack (pools, scrape interval, the scrape job's drop rules, the store's
retention and replication) `flagship_costs` computes the series for every node, the series made a
day as jobs come and go, and the store's size at its retention, under the assumptions named in
ASSUMPTIONS. bench/figures.py shows them from the results file.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "src")]

RESULT = ROOT / "bench" / "results" / "pod_accounting.json"
REPEATS, ROUNDS = 40, 5  # scrapes per worker; workers per scraper, the two alternated
DENSITIES = {"node": 0, "gpu": 7, "cpu": 30}  # pods; the pools' pod IPs per node (a test holds them equal)
BENCH_DIR = Path(os.environ.get("SUPERKUBE_BENCH_DIR", "/var/tmp/superkube-bench"))
VM_PORT = 18428
# the store's run: pods' series of one node pool's shape, at the scrape interval
STORE_PODS, STORE_SAMPLES, STORE_CHURN = 250, 240, 8  # 250 pods x 4 series, 2 h at 30 s; then 8x the pods
GB = 10**9

ASSUMPTIONS = {
    "gpu_pod_hours": 4.0,
    "cpu_pod_hours": 0.5,
    "occupancy": 1.0,
    "what": (
        "every pod IP of every node holds a pod (the most series); a GPU node's pods (a job's worker "
        "and its sidecars) end and are replaced every 4 h on average, a CPU node's every 30 min: "
        "each new pod is 4 new series (its chain and names are new)"
    ),
}


def flagship() -> dict[str, Any]:
    """The flagship's pools, scrape interval, what its scrape job keeps, and the store's retention."""
    import yaml

    from superkube.cluster import monitoring
    from superkube.plan import engine as planning

    _, spec, _ = planning.load(ROOT, "flagship")
    pools = {p.role: {"nodes": 0, "pod_ips": 0} for p in spec.node_pools}
    for p in spec.node_pools:
        pools[p.role]["nodes"] += p.nodes
        pools[p.role]["pod_ips"] = max(pools[p.role]["pod_ips"], p.pod_ips_per_node)
    dropped = [
        re.fullmatch(d.regex, "iptables_rule_packets_total") for d in monitoring.DROP["iptables-exporter"]
    ]
    role = yaml.safe_load((ROOT / "playbooks/roles/metrics_store/defaults/main.yml").read_text())
    retention = role["metrics_store_retention"]
    return {
        "pools": pools,
        "scrape_interval_s": int(monitoring.SCRAPE_INTERVAL.removesuffix("s")),
        "packets_kept": not any(dropped),
        "retention_days": int(retention[:-1]) * {"d": 1, "w": 7, "m": 31, "y": 365}[retention[-1]],
        "replication": role["metrics_store_replication_factor"],
        "store_raw_gb": spec.metrics_store_count * spec.metrics_store_disk_gb * 2**30 / GB,
    }


def flagship_costs(measured: dict[str, Any]) -> dict[str, Any]:
    """Series, churn and store size for the flagship from the measured figures and the stack."""
    fleet = flagship()
    traffic_kinds = 4  # internet-out, internet-in, internal-out, internal-in per pod
    kept = traffic_kinds * (2 if fleet["packets_kept"] else 1)  # bytes always; packets unless dropped
    pools = fleet["pools"]
    slots = {role: p["nodes"] * p["pod_ips"] * ASSUMPTIONS["occupancy"] for role, p in pools.items()}
    active = sum(slots.values()) * kept
    per_day = sum(slots[role] * 24 / ASSUMPTIONS[f"{role}_pod_hours"] for role in slots) * kept
    samples_per_day = active * 86_400 / fleet["scrape_interval_s"]
    store = measured["store"]
    sample_gb_day = samples_per_day * store["bytes_per_sample"] / GB
    series_gb_day = per_day * store["bytes_per_new_series"] / GB
    days = fleet["retention_days"]
    at_retention = (sample_gb_day + series_gb_day) * days * fleet["replication"]
    return {
        "nodes": sum(p["nodes"] for p in pools.values()),
        "exported_per_pod": 2 * traffic_kinds,
        "kept_per_pod": kept,
        "active_series": active,
        "active_series_by_pool": {role: n * kept for role, n in slots.items()},
        "series_made_per_day": per_day,
        "samples_per_s": active / fleet["scrape_interval_s"],
        "samples_gb_per_day": sample_gb_day,
        "new_series_gb_per_day": series_gb_day,
        "retention_days": days,
        "replication": fleet["replication"],
        "store_gb_at_retention": at_retention,
        "store_raw_gb": fleet["store_raw_gb"],
        "share_of_store": at_retention / fleet["store_raw_gb"],
    }


def role_files() -> Any:
    import yaml

    from superkube.harness.podnet import RoleFiles
    from superkube.plan import checks
    from superkube.plan import engine as planning

    engine = checks.plan_wiring(planning.run(ROOT, "flagship"))
    host = next(h for h in engine.hosts if h.group == "gpu_nodes")
    base = yaml.safe_load((ROOT / "playbooks/roles/iptables_base/defaults/main.yml").read_text())
    settings = engine.render("iptables_accounting", host, ["iptables_accounting_pod_settings"], **base)
    return RoleFiles(
        settings=settings["iptables_accounting_pod_settings"],
        rules=engine.template("iptables_accounting", host, "accounting.rules.j2"),
        hooks=engine.template("iptables_accounting", host, "accounting.hooks.j2"),
        apply_script=engine.template(
            "iptables_base", host, "superkube-iptables-apply.sh.j2", iptables_base_dir="{dir}"
        ),
    )


def scrape(node: Any, impl: str) -> dict[str, Any]:
    """bench/exporter.py's timing of one scraper, run inside the node's namespace."""
    out = node.ns(sys.executable, str(ROOT / "bench" / "_exporter_worker.py"), impl, "nft", str(REPEATS))
    return dict(json.loads(out))


def density(role: Any, pods: int) -> dict[str, Any]:
    """A node with `pods` pods: its rules, and the exporter's scrape against iptables-save alone."""
    from superkube.agents import iptables_exporter
    from superkube.harness.podnet import PodNode

    with tempfile.TemporaryDirectory(prefix="skpa-bench-") as tmp:
        node = PodNode(Path(tmp), role).up()
        try:
            node.apply_role()
            for i in range(pods):
                node.add(f"team-{i % 3}", f"worker-{i}")
            saved = node.ns("iptables-save", "-c", "-t", "mangle")
            rules = [line for line in saved.splitlines() if line.startswith("[")]
            per_pod = [r for r in rules if "SKPOD-" in r]
            tagged = [r for r in rules if "iptables-exporter " in r]
            series = len(iptables_exporter.parse("mangle", saved.encode()))
            alone, exporter = [], []
            for _ in range(ROUNDS):  # alternated, so the machine's other load falls on both alike
                alone.append(scrape(node, "iptables-save")["median_s"])
                exporter.append(scrape(node, "superkube")["median_s"])
        finally:
            node.down()
    return {
        "pods": pods,
        "mangle_rules": len(rules),
        "per_pod_rules": len(per_pod),
        "tagged_rules": len(tagged),
        "label_sets": series,
        "iptables_save_ms": 1000 * statistics.median(alone),
        "exporter_ms": 1000 * statistics.median(exporter),
        "exporter_over_iptables_save": statistics.median(exporter) / statistics.median(alone),
        "rounds_ms": {"iptables_save": [1000 * s for s in alone], "exporter": [1000 * s for s in exporter]},
    }


def latency(role: Any, pods: int) -> dict[str, Any]:
    """ADD then DEL of `pods` pods one after another, each plugin timed inside the node's namespace."""
    from superkube.harness.podnet import PodNode

    with tempfile.TemporaryDirectory(prefix="skpa-bench-") as tmp:
        node = PodNode(Path(tmp), role).up()
        try:
            node.apply_role()
            job = {"bin": str(node.bin), "network": node.network, "count": pods}
            out = node.ns(
                sys.executable, str(ROOT / "bench" / "_pod_accounting_worker.py"), stdin=json.dumps(job)
            )
            assert node.chains() == [], "every pod's chains gone after its DEL"
        finally:
            node.down()
    timed = json.loads(out)

    def ms(values: list[float]) -> dict[str, float]:
        return {
            "p50_ms": 1000 * statistics.median(values),
            "max_ms": 1000 * max(values),
            "first_ms": 1000 * values[0],
            "last_ms": 1000 * values[-1],
        }

    step = "superkube-pod-accounting"
    return {
        "pods": pods,
        "add": {"step": ms(timed["add_s"][step]), "chain": ms(timed["add_s"]["chain"])},
        "del": {"step": ms(timed["del_s"][step]), "chain": ms(timed["del_s"]["chain"])},
        "step_share_of_add": sum(timed["add_s"][step]) / sum(timed["add_s"]["chain"]),
    }


# --- the store ------------------------------------------------------------------------------------


def victoria_metrics() -> tuple[Path, str]:
    """Debian's victoria-metrics binary and its package version, unpacked once under the bench
    directory (not installed: the package would start a service)."""
    home = BENCH_DIR / "victoria-metrics"
    binary, version = home / "usr" / "bin" / "victoria-metrics", home / "package-version"
    if not (binary.exists() and version.exists()):
        home.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory() as work:
            subprocess.run(
                ["apt-get", "download", "victoria-metrics"], cwd=work, check=True, capture_output=True
            )
            (deb,) = Path(work).glob("victoria-metrics_*.deb")
            subprocess.run(["dpkg-deb", "-x", str(deb), str(home)], check=True)
            said = subprocess.run(
                ["dpkg-deb", "-f", str(deb), "Version"], check=True, capture_output=True, text=True
            )
            version.write_text(said.stdout.strip() + "\n")
    return binary, version.read_text().strip()


def _get(path: str) -> bytes:
    with urllib.request.urlopen(f"http://127.0.0.1:{VM_PORT}{path}", timeout=60) as response:
        return bytes(response.read())


def _du(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def store_run(binary: Path, pods: int, samples: int) -> dict[str, Any]:
    """Bytes on disk for `pods` pods' 4 series each with `samples` samples at 30 s, every pod's chain
    and name its own, one pod after another in each of STORE_PODS slots."""
    with tempfile.TemporaryDirectory(prefix="skpa-vm-") as tmp:
        data = Path(tmp) / "data"
        proc = subprocess.Popen(
            [
                str(binary),
                f"-storageDataPath={data}",
                f"-httpListenAddr=127.0.0.1:{VM_PORT}",
                "-retentionPeriod=1y",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            for _ in range(200):
                try:
                    _get("/health")
                    break
                except OSError:
                    time.sleep(0.1)
            empty = _du(data)
            per_slot = pods // STORE_PODS
            start = int(time.time()) - STORE_SAMPLES * 30 - 600
            lines = []
            for pod in range(pods):
                slot, turn = divmod(pod, per_slot)
                # a pod's bytes in 30 s: idle a fifth of the time, else uneven as real traffic is
                rng = random.Random(pod)
                chain = f"SKPOD-{pod:016x}"
                node = f"10.64.{slot // 250}.{slot % 250 + 4}:9455"
                for traffic in ("internet-out", "internet-in", "internal-out", "internal-in"):
                    labels = (
                        f'chain="{chain}-{"O" if traffic.endswith("out") else "I"}",cluster="flagship",'
                        f'instance="{node}",job="iptables-exporter",namespace="team-{slot % 40}",'
                        f'pod="job-{slot}-{turn}-worker-0",table="mangle",traffic="{traffic}"'
                    )
                    value = 0
                    for s in range(samples):
                        ts = (start + (turn * samples + s) * 30) * 1000
                        value += int(rng.paretovariate(1.2) * 10_000) if rng.random() < 0.8 else 0
                        lines.append(f"iptables_rule_bytes_total{{{labels}}} {value} {ts}")
            body = ("\n".join(lines) + "\n").encode()
            request = urllib.request.Request(
                f"http://127.0.0.1:{VM_PORT}/api/v1/import/prometheus", data=body
            )
            urllib.request.urlopen(request, timeout=600).read()
            total = len(lines)
            window = STORE_SAMPLES * 30 + 1200
            deadline = time.monotonic() + 300
            while True:
                got = json.loads(
                    _get(f"/api/v1/query?query=sum(count_over_time(iptables_rule_bytes_total[{window}s]))")
                )
                result = got["data"]["result"]
                if result and float(result[0]["value"][1]) >= total:
                    break
                if time.monotonic() > deadline:
                    raise SystemExit(f"the store counts {result} of {total} imported samples after 300 s")
                time.sleep(0.5)
            _get("/internal/force_flush")
            time.sleep(6)
            _get("/internal/force_merge")
            time.sleep(10)
            return {
                "series": pods * 4,
                "samples": total,
                "bytes": _du(data) - empty,
                "index_bytes": _du(data / "indexdb"),
            }
        finally:
            proc.terminate()
            proc.wait(timeout=30)


def store_figures() -> dict[str, Any]:
    binary, version = victoria_metrics()
    steady = store_run(binary, STORE_PODS, STORE_SAMPLES)
    churn = store_run(binary, STORE_PODS * STORE_CHURN, STORE_SAMPLES // STORE_CHURN)
    extra = churn["series"] - steady["series"]
    return {
        "victoriametrics": f"VictoriaMetrics {version} (Debian)",
        "steady": steady,
        "churn": churn,
        "bytes_per_sample": steady["bytes"] / steady["samples"],
        "bytes_per_new_series": (churn["bytes"] - steady["bytes"]) / extra,
    }


def main() -> None:
    if os.geteuid() != 0:
        raise SystemExit("run as root: the benchmark makes network namespaces")
    if shutil.which("iptables-save") is None:
        raise SystemExit("no iptables: run `make debian-deps`")
    role = role_files()
    fleet = flagship()
    assert (
        DENSITIES["gpu"] == fleet["pools"]["gpu"]["pod_ips"]
        and DENSITIES["cpu"] == fleet["pools"]["cpu"]["pod_ips"]
    )
    measured: dict[str, Any] = {
        "repeats": REPEATS,
        "rounds": ROUNDS,
        "backend": "nft",
        "densities": {name: density(role, pods) for name, pods in DENSITIES.items()},
        "latency": latency(role, DENSITIES["cpu"]),
        "store": store_figures(),
        "assumptions": ASSUMPTIONS,
    }
    measured["flagship"] = flagship_costs(measured)
    report(measured)
    RESULT.parent.mkdir(exist_ok=True)
    RESULT.write_text(json.dumps(measured, indent=2) + "\n")


def report(m: dict[str, Any]) -> None:
    print(f"{'node':<6}{'pods':>5}{'mangle rules':>14}{'per pod':>9}{'tagged':>8}{'series':>8}"
          f"{'save ms':>9}{'scrape ms':>11}{'ratio':>7}")  # fmt: skip
    for name, d in m["densities"].items():
        print(f"{name:<6}{d['pods']:>5}{d['mangle_rules']:>14}{d['per_pod_rules']:>9}{d['tagged_rules']:>8}"
              f"{d['label_sets']:>8}{d['iptables_save_ms']:>9.1f}{d['exporter_ms']:>11.1f}"
              f"{d['exporter_over_iptables_save']:>6.2f}x")  # fmt: skip
    lat = m["latency"]
    print(
        f"{lat['pods']} pods one after another: ADD p50 (max) the step {lat['add']['step']['p50_ms']:.0f} "
        f"({lat['add']['step']['max_ms']:.0f}) ms of the chain's {lat['add']['chain']['p50_ms']:.0f} "
        f"({lat['add']['chain']['max_ms']:.0f}) ms; DEL the step {lat['del']['step']['p50_ms']:.0f} "
        f"({lat['del']['step']['max_ms']:.0f}) ms of {lat['del']['chain']['p50_ms']:.0f} ms"
    )
    s = m["store"]
    print(
        f"{s['victoriametrics']}: {s['bytes_per_sample']:.2f} bytes per sample, "
        f"{s['bytes_per_new_series']:.0f} bytes per further series"
    )
    f = m["flagship"]
    print(
        f"flagship, {f['nodes']:,} nodes: {f['active_series']:,.0f} series kept ({f['kept_per_pod']} a pod), "
        f"{f['series_made_per_day']:,.0f} made a day ({m['assumptions']['what']}); "
        f"{f['samples_gb_per_day'] + f['new_series_gb_per_day']:.1f} GB a day, "
        f"{f['store_gb_at_retention']:,.0f} GB at {f['retention_days']} days x {f['replication']} copies "
        f"({f['share_of_store']:.1%} of the store's {f['store_raw_gb']:,.0f} GB)"
    )


if __name__ == "__main__":
    main()
