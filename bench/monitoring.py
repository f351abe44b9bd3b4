"""Monitoring figures on a real lab: series the drop rules remove, store ingestion, bytes per sample.

Run (as root, with no lab up): .venv/bin/python bench/monitoring.py [--series 5000] [--points 60]
     (prints a table; writes bench/results/monitoring.json)

Brings up a lab of two GPU nodes and a monitoring host, converges node software, the accounting and
the monitoring role (two Prometheus shards, VictoriaMetrics), and measures:
- series per scraped host before and after the drop rules, per job, from Prometheus's own
  `scrape_samples_scraped` and `scrape_samples_post_metric_relabeling` for the lab's real
  node-exporter and iptables exporter, and for a real etcd's metrics page (an etcd member started on
  the monitoring host) and an API-server-shaped page (synthetic: no API server runs here), each
  scraped by a third Prometheus through the etcd and apiserver jobs' drop rules;
- ingestion into the store: `--series` x `--points` samples (Prometheus text format) posted to
  VictoriaMetrics' import API from the monitoring host, samples/s;
- bytes per sample on disk for the same data in VictoriaMetrics and in a Prometheus TSDB block
  (promtool tsdb create-blocks-from openmetrics), after both have flushed.
The lab is taken down at the end, whatever happens.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any
from urllib.parse import quote

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "src"), str(ROOT / "tests" / "monitoring")]

from _lab import converged  # noqa: E402  (bench/ is the script's folder)

from superkube.cluster import monitoring  # noqa: E402
from superkube.lab import hosts as lab  # noqa: E402
from superkube.lab import machines  # noqa: E402
from superkube.lab.state import Lab  # noqa: E402

HOST = "monitoring-1"


def query(the_lab: Lab, port: int, expr: str) -> list[dict[str, Any]]:
    out = machines.run_on(
        the_lab, HOST, f"curl -sf 'http://127.0.0.1:{port}/api/v1/query?query={quote(expr)}'"
    )
    return list(json.loads(out)["data"]["result"])


def per_job(the_lab: Lab, port: int) -> dict[str, dict[str, float]]:
    rows: dict[str, dict[str, float]] = {}
    for metric, key in (
        ("scrape_samples_scraped", "before"),
        ("scrape_samples_post_metric_relabeling", "after"),
    ):
        for r in query(the_lab, port, f"avg by (job) ({metric})"):
            rows.setdefault(r["metric"]["job"], {})[key] = float(r["value"][1])
    return rows


def drop_figures(the_lab: Lab) -> dict[str, dict[str, float]]:
    from test_prometheus import apiserver_page  # the test suite's API-server-shaped page

    rows: dict[str, dict[str, float]] = {}
    for port in (9090, 9091):
        rows.update(per_job(the_lab, port))
    # a real etcd member on the monitoring host, and the synthetic API-server page, scraped through
    # their jobs' drop rules by a third Prometheus
    machines.run_on(
        the_lab,
        HOST,
        "systemd-run --unit bench-etcd etcd --data-dir /var/tmp/bench-etcd --listen-client-urls http://127.0.0.1:23790 "
        "--advertise-client-urls http://127.0.0.1:23790 --listen-peer-urls http://127.0.0.1:23800 "
        "--initial-advertise-peer-urls http://127.0.0.1:23800 --initial-cluster default=http://127.0.0.1:23800 "
        "--listen-metrics-urls http://127.0.0.1:23810",
    )
    machines.put(the_lab, HOST, "/var/tmp/bench-page/metrics", apiserver_page())
    machines.run_on(
        the_lab,
        HOST,
        "systemd-run --unit bench-page python3 -m http.server 23820 --bind 127.0.0.1 -d /var/tmp/bench-page",
    )
    jobs = {j.name: j for j in monitoring.jobs()}
    config = {
        "global": {"scrape_interval": "2s"},
        "scrape_configs": [
            {
                "job_name": "etcd",
                "static_configs": [{"targets": ["127.0.0.1:23810"]}],
                "metric_relabel_configs": [d.config() for d in monitoring.DROP[jobs["etcd-main"].drops]],
            },
            {
                "job_name": "apiserver (synthetic page)",
                "static_configs": [{"targets": ["127.0.0.1:23820"]}],
                "metric_relabel_configs": [d.config() for d in monitoring.DROP[jobs["apiserver"].drops]],
            },
        ],
    }
    machines.put(the_lab, HOST, "/var/tmp/bench-prom/prometheus.yml", json.dumps(config))
    machines.run_on(
        the_lab,
        HOST,
        "systemd-run --unit bench-prom prometheus --config.file=/var/tmp/bench-prom/prometheus.yml "
        "--storage.tsdb.path=/var/tmp/bench-prom/data --web.listen-address=127.0.0.1:9190",
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            extra = per_job(the_lab, 9190)
            if len(extra) == 2 and all("after" in r for r in extra.values()):
                rows.update(extra)
                break
        except lab.LabError:
            pass
        time.sleep(2)
    machines.run_on(the_lab, HOST, "systemctl stop bench-etcd bench-page bench-prom")
    return rows


def store_figures(the_lab: Lab, series: int, points: int) -> dict[str, float]:
    # one text file, Prometheus exposition with timestamps: `series` counters, `points` samples each
    now = int(time.time()) - points * 15 - 3600
    lines = []
    for p in range(points):
        ts = (now + p * 15) * 1000
        for s in range(series):
            lines.append(f'bench_counter{{host="h{s % 500}",series="{s}"}} {p * 10 + s % 7} {ts}')
    body = "\n".join(lines) + "\n"
    machines.put(the_lab, HOST, "/var/tmp/bench-store/samples.prom", body)
    samples = series * points
    before = machines.run_on(the_lab, HOST, "du -sb /var/lib/private/superkube-victoria-metrics | cut -f1")
    start = time.monotonic()
    machines.run_on(
        the_lab,
        HOST,
        "curl -sf --data-binary @/var/tmp/bench-store/samples.prom http://127.0.0.1:8428/api/v1/import/prometheus",
        timeout=600,
    )
    # ingested when the store can count every sample
    while True:
        got = query(the_lab, 8428, f"count_over_time(bench_counter[{points * 15 + 7200}s])")
        total = sum(float(r["value"][1]) for r in got)
        if total >= samples:
            break
        if time.monotonic() - start > 300:
            raise SystemExit(f"the store counts {total:.0f} of {samples} imported samples after 300 s")
        time.sleep(0.2)
    seconds = time.monotonic() - start
    machines.run_on(
        the_lab,
        HOST,
        "curl -s http://127.0.0.1:8428/internal/force_flush; sleep 6; curl -s http://127.0.0.1:8428/internal/force_merge; sleep 10",
    )
    after = machines.run_on(the_lab, HOST, "du -sb /var/lib/private/superkube-victoria-metrics | cut -f1")
    vm_bytes = int(after) - int(before)
    # the same samples as a Prometheus TSDB block (OpenMetrics wants seconds and an EOF marker)
    om = (
        "# TYPE bench_counter counter\n"
        + "\n".join(line.rsplit(" ", 1)[0] + f" {int(line.rsplit(' ', 1)[1]) / 1000:.3f}" for line in lines)
        + "\n# EOF\n"
    )
    machines.put(the_lab, HOST, "/var/tmp/bench-store/samples.om", om)
    machines.run_on(
        the_lab,
        HOST,
        "rm -rf /var/tmp/bench-store/tsdb && promtool tsdb create-blocks-from openmetrics /var/tmp/bench-store/samples.om /var/tmp/bench-store/tsdb >/dev/null",
        timeout=600,
    )
    prom_bytes = int(machines.run_on(the_lab, HOST, "du -sb /var/tmp/bench-store/tsdb | cut -f1"))
    return {
        "samples": samples,
        "ingest_seconds": seconds,
        "ingest_samples_per_second": samples / seconds,
        "victoriametrics_bytes_per_sample": vm_bytes / samples,
        "prometheus_tsdb_bytes_per_sample": prom_bytes / samples,
    }


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--series", type=int, default=5000)
    parser.add_argument("--points", type=int, default=60)
    args = parser.parse_args()
    with converged(
        "gpu_nodes=2,monitoring=1", "node_software,iptables_accounting,iptables_exporter,monitoring"
    ) as the_lab:
        time.sleep(20)  # a few scrapes
        print("series before and after the drop rules ...", flush=True)
        drops = drop_figures(the_lab)
        print("ingestion and bytes per sample ...", flush=True)
        store = store_figures(the_lab, args.series, args.points)
    print("\nSeries per scraped host, before -> after the drop rules:")
    for job, row in sorted(drops.items()):
        print(
            f"  {job:28} {row['before']:8.0f} -> {row['after']:8.0f}  (x{row['after'] / row['before']:.2f})"
        )
    print(
        f"\nStore: {store['samples']:,} samples imported in {store['ingest_seconds']:.1f} s = "
        f"{store['ingest_samples_per_second']:,.0f} samples/s"
    )
    ratio = store["victoriametrics_bytes_per_sample"] / store["prometheus_tsdb_bytes_per_sample"]
    print(
        f"Bytes per sample: VictoriaMetrics {store['victoriametrics_bytes_per_sample']:.2f}, "
        f"Prometheus TSDB {store['prometheus_tsdb_bytes_per_sample']:.2f} (x{ratio:.2f})"
    )
    results = ROOT / "bench" / "results"
    results.mkdir(exist_ok=True)
    figures = {"series_per_host": drops, "store": store, "vm_to_prometheus_bytes": ratio, **vars(args)}
    (results / "monitoring.json").write_text(json.dumps(figures, indent=2) + "\n")
    print(f"\nwritten: {results / 'monitoring.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
