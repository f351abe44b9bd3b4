"""Scrape time of superkube's iptables exporter at 5,000 tagged rules, in one run, against
`iptables-save -c` alone and against the iptables-exporter package from PyPI.

Run as root: .venv/bin/python bench/exporter.py   (prints a table; writes bench/results/exporter.json)
Targets: within 1.5x of `iptables-save -c`, and faster than the PyPI package.

The PyPI package reads rules through libiptc (python-iptables), i.e. the legacy xtables backend,
so the head-to-head loads the same rules with iptables-legacy-restore; superkube's exporter is
also timed on the nft backend that Debian 12's iptables uses. Everything happens in a network
namespace this script creates and removes; the other package lives in a virtualenv of its own
with the prometheus-client it was written for.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NETNS = "skbench-exporter"
RULES = 5_000
REPEATS = 15
OTHER = Path(os.environ.get("SUPERKUBE_BENCH_DIR", "/var/tmp/superkube-bench")) / "iptables-exporter-venv"
OTHER_PINS = ["iptables-exporter==0.9.3", "prometheus-client==0.7.1"]


def rules_file() -> str:
    lines = ["*mangle", ":BENCH - [0:0]", "-A INPUT -j BENCH"]
    for i in range(RULES):
        a, b = divmod(i, 250)
        traffic = "internet-in" if i % 2 else "internet-out"
        lines.append(
            f'-A BENCH -s 10.{a}.{b}.1/32 -m comment --comment "iptables-exporter bench traffic={traffic} rule={i}"'
        )
    lines.append("COMMIT")
    return "\n".join(lines) + "\n"


def ensure_other_venv() -> Path:
    python = OTHER / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(OTHER)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", *OTHER_PINS], check=True)
    return python


def worker(python: str, impl: str, backend: str, env: dict[str, str]) -> dict[str, float]:
    proc = subprocess.run(
        [
            "ip",
            "netns",
            "exec",
            NETNS,
            python,
            str(ROOT / "bench" / "_exporter_worker.py"),
            impl,
            backend,
            str(REPEATS),
        ],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    return json.loads(proc.stdout)


def main() -> None:
    if os.geteuid() != 0:
        raise SystemExit("run as root: the benchmark creates a network namespace")
    other = ensure_other_venv()
    subprocess.run(["ip", "netns", "del", NETNS], capture_output=True)
    subprocess.run(["ip", "netns", "add", NETNS], check=True)
    try:
        text = rules_file()
        for restore in ("iptables-restore", "iptables-legacy-restore"):
            subprocess.run(
                ["ip", "netns", "exec", NETNS, restore, "--noflush"], input=text, text=True, check=True
            )
        env = {
            **os.environ,
            "PYTHONPATH": str(ROOT / "src"),
            "XTABLES_LIBDIR": "/usr/lib/x86_64-linux-gnu/xtables",
        }
        rows = [
            worker(sys.executable, "iptables-save", "nft", env),
            worker(sys.executable, "superkube", "nft", env),
            worker(sys.executable, "iptables-save", "legacy", env),
            worker(sys.executable, "superkube", "legacy", env),
            worker(str(other), "pypi", "legacy", {**env, "PYTHONPATH": ""}),
        ]
    finally:
        subprocess.run(["ip", "netns", "del", NETNS], capture_output=True)
    by = {(r["impl"], r["backend"]): r["median_s"] for r in rows}
    figures = {
        "rules": RULES,
        "repeats": REPEATS,
        "rows": rows,
        "superkube_vs_iptables_save_nft": by[("superkube", "nft")] / by[("iptables-save", "nft")],
        "superkube_vs_iptables_save_legacy": by[("superkube", "legacy")] / by[("iptables-save", "legacy")],
        "pypi_vs_superkube_legacy": by[("pypi", "legacy")] / by[("superkube", "legacy")],
    }
    print(f"{RULES:,} tagged rules, median of {REPEATS} scrapes each (one run, same machine)")
    print(f"{'scraper':<34}{'backend':<9}{'median ms':>10}{'output KB':>11}")
    names = {
        "iptables-save": "iptables-save -c -t mangle alone",
        "superkube": "superkube iptables exporter",
        "pypi": "iptables-exporter 0.9.3 (PyPI)",
    }
    for r in rows:
        print(
            f"{names[r['impl']]:<34}{r['backend']:<9}{r['median_s'] * 1000:>10.1f}{r['bytes'] / 1024:>11.0f}"
        )
    print(
        f"superkube / iptables-save: nft {figures['superkube_vs_iptables_save_nft']:.2f}x, legacy {figures['superkube_vs_iptables_save_legacy']:.2f}x (target <= 1.5x)"
    )
    print(f"PyPI package / superkube (legacy): {figures['pypi_vs_superkube_legacy']:.1f}x (target > 1)")
    (ROOT / "bench" / "results").mkdir(exist_ok=True)
    (ROOT / "bench" / "results" / "exporter.json").write_text(json.dumps(figures, indent=2) + "\n")


if __name__ == "__main__":
    main()
