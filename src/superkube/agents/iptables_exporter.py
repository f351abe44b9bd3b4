"""Prometheus exporter for iptables rules tagged `iptables-exporter <cluster> key=value ...`.

Runs on nodes as a systemd service with nothing but python3 and prometheus_client (Debian's
python3-prometheus-client), so it is one file. Every scrape runs `iptables-save -c` once per
table and exports, per tagged rule, its byte and packet counters labelled with table, chain,
cluster and the comment's key=value pairs (rules with the same labels are summed), plus how long
the scrape took and whether it worked (those through prometheus_client).

Thousands of tagged rules are the normal case on a large node, so the rule samples are written
straight to exposition text from one regex pass, with each rule's label text memoised: the
scrape costs little more than iptables-save itself (bench/exporter.py).
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import time
from collections.abc import Iterable
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, make_server

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Gauge, generate_latest

TAG = "iptables-exporter"
# One pass over iptables-save's output: "[packets:bytes] -A CHAIN ... --comment "iptables-exporter ..."".
# iptables-save quotes comments that contain spaces, which every tagged comment does.
RULE = re.compile(rb'^\[(\d+):(\d+)\] -A (\S+) .*?--comment "?iptables-exporter ([^"\n]*)', re.M)
HELP = (
    "# HELP iptables_rule_packets_total Packets matched by a tagged iptables rule.\n"
    "# TYPE iptables_rule_packets_total counter\n",
    "# HELP iptables_rule_bytes_total Bytes matched by a tagged iptables rule.\n"
    "# TYPE iptables_rule_bytes_total counter\n",
)


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


_LABELS: dict[tuple[str, bytes, bytes], str] = {}  # (table, chain, comment) -> label text


def labels_of(table: str, chain: bytes, comment: bytes) -> str:
    """The label set of one tagged rule, as exposition text (rules rarely change: memoised)."""
    key = (table, chain, comment)
    text = _LABELS.get(key)
    if text is None:
        words = comment.decode(errors="replace").split()
        pairs = [("table", table), ("chain", chain.decode()), ("cluster", words[0] if words else "")]
        for word in words[1:]:
            name, sep, value = word.partition("=")
            if sep and name.isidentifier() and name not in ("table", "chain", "cluster"):
                pairs.append((name, value))
        text = ",".join(f'{k}="{_escape(v)}"' for k, v in pairs)
        if len(_LABELS) > 200_000:  # rules churned a lot: start over rather than grow without bound
            _LABELS.clear()
        _LABELS[key] = text
    return text


def parse(table: str, save_output: bytes, into: dict[str, list[int]] | None = None) -> dict[str, list[int]]:
    """Counters of one table's tagged rules by label set: {label text: [packets, bytes]}; same labels are summed."""
    out: dict[str, list[int]] = {} if into is None else into
    for packets, nbytes, chain, comment in RULE.findall(save_output):
        key = _LABELS.get((table, chain, comment)) or labels_of(table, chain, comment)
        counters = out.get(key)
        if counters is None:
            out[key] = [int(packets), int(nbytes)]
        else:
            counters[0] += int(packets)
            counters[1] += int(nbytes)
    return out


def render(rules: dict[str, list[int]]) -> str:
    packets = "".join([f"iptables_rule_packets_total{{{k}}} {v[0]}\n" for k, v in rules.items()])
    octets = "".join([f"iptables_rule_bytes_total{{{k}}} {v[1]}\n" for k, v in rules.items()])
    return HELP[0] + packets + HELP[1] + octets


class Exporter:
    """One scrape: iptables-save per table, the tagged rules, and the scrape's own health."""

    def __init__(self, tables: Iterable[str], iptables_save: str = "iptables-save") -> None:
        self.tables = list(tables)
        self.iptables_save = iptables_save
        self.registry = CollectorRegistry()
        self.success = Gauge(
            "iptables_scrape_success", "1 if iptables-save worked on this scrape.", registry=self.registry
        )
        self.duration = Gauge(
            "iptables_scrape_duration_seconds", "Time this scrape took.", registry=self.registry
        )
        self.count = Gauge(
            "iptables_tagged_rules", "Tagged rule label sets found on this scrape.", registry=self.registry
        )

    def read(self, table: str) -> bytes:
        proc = subprocess.run([self.iptables_save, "-c", "-t", table], capture_output=True, timeout=30)
        if proc.returncode != 0:
            raise RuntimeError(
                proc.stderr.decode(errors="replace").strip() or f"iptables-save exited {proc.returncode}"
            )
        return proc.stdout

    def scrape(self) -> bytes:
        started = time.perf_counter()
        body = ""
        try:
            rules: dict[str, list[int]] = {}
            for table in self.tables:
                parse(table, self.read(table), rules)
            body = render(rules)
            self.success.set(1)
            self.count.set(len(rules))
        except (OSError, RuntimeError, subprocess.TimeoutExpired, ValueError) as exc:
            print(f"iptables-exporter: scrape failed: {exc}", file=sys.stderr)
            self.success.set(0)
            self.count.set(0)
        self.duration.set(time.perf_counter() - started)
        return body.encode() + generate_latest(self.registry)

    def wsgi(self, environ: dict[str, Any], start_response: Any) -> list[bytes]:
        if environ.get("PATH_INFO", "/") not in ("/", "/metrics"):
            start_response("404 Not Found", [("Content-Type", "text/plain")])
            return [b"try /metrics\n"]
        payload = self.scrape()
        start_response(
            "200 OK", [("Content-Type", CONTENT_TYPE_LATEST), ("Content-Length", str(len(payload)))]
        )
        return [payload]


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


def serve(exporter: Exporter, host: str, port: int) -> None:
    server = make_server(host, port, exporter.wsgi, handler_class=_QuietHandler)
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
    serve(Exporter(args.tables or ["mangle"], args.iptables_save), host or "0.0.0.0", int(port))
    return 0


if __name__ == "__main__":
    sys.exit(main())
