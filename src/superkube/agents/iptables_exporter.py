"""Prometheus exporter for iptables rules tagged `iptables-exporter <cluster> key=value ...`.

Runs on nodes as a systemd service with nothing but python3 and prometheus_client (Debian's
python3-prometheus-client), so it is one file. Every scrape runs `iptables-save -c` once per
table and exports, per tagged rule, its byte and packet counters labelled with table, chain,
cluster and the comment's key=value pairs (rules with the same labels are summed), plus how long
the scrape took and whether it worked.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from collections.abc import Iterable, Iterator
from wsgiref.simple_server import WSGIRequestHandler

from prometheus_client import CollectorRegistry, make_wsgi_app
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

TAG = "iptables-exporter"
MARKER = f'--comment "{TAG} '
BARE_MARKER = f"--comment {TAG} "  # iptables-save leaves a comment without spaces unquoted


def parse(save_output: str) -> dict[tuple[tuple[str, str], ...], list[int]]:
    """Counters of tagged rules by label set: {((label, value), ...): [packets, bytes]}."""
    out: dict[tuple[tuple[str, str], ...], list[int]] = {}
    table = ""
    for line in save_output.splitlines():
        if not line:
            continue
        first = line[0]
        if first == "*":
            table = line[1:].strip()
            continue
        if first != "[" or TAG not in line:
            continue
        start = line.find(MARKER)
        if start >= 0:
            start += len(MARKER)
            end = line.find('"', start)
        else:
            start = line.find(BARE_MARKER)
            if start < 0:
                continue
            start += len(BARE_MARKER)
            end = line.find(" ", start)
        comment = line[start : end if end >= 0 else len(line)].split()
        if not comment:
            continue
        close = line.index("]")
        packets, _, nbytes = line[1:close].partition(":")
        chain_at = line.find("-A ", close)
        chain = line[chain_at + 3 : line.find(" ", chain_at + 3)] if chain_at >= 0 else ""
        labels = [("table", table), ("chain", chain), ("cluster", comment[0])]
        for pair in comment[1:]:
            key, sep, value = pair.partition("=")
            if sep and key.isidentifier():
                labels.append((key, value))
        key_ = tuple(labels)
        counters = out.get(key_)
        if counters is None:
            out[key_] = [int(packets), int(nbytes)]
        else:
            counters[0] += int(packets)
            counters[1] += int(nbytes)
    return out


class IptablesCollector:
    def __init__(self, tables: Iterable[str], iptables_save: str = "iptables-save") -> None:
        self.tables = list(tables)
        self.iptables_save = iptables_save

    def read(self) -> str:
        parts = []
        for table in self.tables:
            proc = subprocess.run(
                [self.iptables_save, "-c", "-t", table], capture_output=True, text=True, timeout=30
            )
            if proc.returncode != 0:
                raise RuntimeError(proc.stderr.strip() or f"iptables-save exited {proc.returncode}")
            parts.append(proc.stdout)
        return "".join(parts)

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        started = time.perf_counter()
        success = 1
        rules: dict[tuple[tuple[str, str], ...], list[int]] = {}
        try:
            rules = parse(self.read())
        except (OSError, RuntimeError, subprocess.TimeoutExpired, ValueError) as exc:
            print(f"iptables-exporter: scrape failed: {exc}", file=sys.stderr)
            success = 0
        names: list[str] = []
        for key in rules:
            for label, _ in key:
                if label not in names:
                    names.append(label)
        packets = CounterMetricFamily(
            "iptables_rule_packets", "Packets matched by a tagged iptables rule.", labels=names
        )
        octets = CounterMetricFamily(
            "iptables_rule_bytes", "Bytes matched by a tagged iptables rule.", labels=names
        )
        for key, (n_packets, n_bytes) in rules.items():
            values = dict(key)
            label_values = [values.get(n, "") for n in names]
            packets.add_metric(label_values, n_packets)
            octets.add_metric(label_values, n_bytes)
        yield packets
        yield octets
        yield GaugeMetricFamily(
            "iptables_scrape_success", "1 if iptables-save worked on this scrape.", value=success
        )
        yield GaugeMetricFamily(
            "iptables_scrape_duration_seconds", "Time this scrape took.", value=time.perf_counter() - started
        )
        yield GaugeMetricFamily(
            "iptables_tagged_rules", "Tagged rule label sets found on this scrape.", value=len(rules)
        )


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


def serve(collector: IptablesCollector, host: str, port: int) -> None:
    from wsgiref.simple_server import make_server

    registry = CollectorRegistry()
    registry.register(collector)
    server = make_server(host, port, make_wsgi_app(registry), handler_class=_QuietHandler)
    server.serve_forever()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--listen", default="0.0.0.0:9455", help="address:port to serve /metrics on")
    parser.add_argument(
        "--table", action="append", dest="tables", help="iptables table to read (repeatable; default mangle)"
    )
    parser.add_argument("--iptables-save", default="iptables-save", help="iptables-save binary")
    args = parser.parse_args(argv)
    host, _, port = args.listen.rpartition(":")
    if not port.isdigit():
        parser.error(f"--listen {args.listen}: give address:port, e.g. 0.0.0.0:9455")
    serve(IptablesCollector(args.tables or ["mangle"], args.iptables_save), host or "0.0.0.0", int(port))
    return 0


if __name__ == "__main__":
    sys.exit(main())
