"""Converge time on the lab for 1, 4 and 8 hosts, superkube's Ansible settings vs stock, in one run.

Run as root: .venv/bin/python bench/converge.py   (prints a table; writes bench/results/converge.json)
Each cell is a fresh lab (first converge: everything changes) followed by a second converge
(nothing changes), so both the install and the steady-state cost are measured.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "src")]

from superkube.fleet import converge as fleet  # noqa: E402
from superkube.lab import hosts as lab  # noqa: E402

SIZES = (1, 4, 8)


def cell(hosts: int, settings: fleet.Settings) -> dict[str, float | int | str]:
    lab.down()
    started = lab.up(hosts, lambda what, fraction: None)
    try:
        first = fleet.converge(started.inventory, settings=settings)
        second = fleet.converge(started.inventory, settings=settings)
        if not (first.ok and second.ok):
            raise SystemExit(f"converge failed: {first.to_dict() if not first.ok else second.to_dict()}")
        return {
            "hosts": hosts,
            "settings": settings,
            "first_s": first.seconds,
            "second_s": second.seconds,
            "changed_second": sum(h.changed for h in second.hosts.values()),
        }
    finally:
        lab.down()


def main() -> None:
    rows = [cell(n, s) for n in SIZES for s in ("stock", "superkube")]
    print(
        f"{'hosts':>5} {'settings':<10} {'first converge s':>17} {'second converge s':>18} {'changed on 2nd':>15}"
    )
    for r in rows:
        print(
            f"{r['hosts']:>5} {r['settings']:<10} {r['first_s']:>17.1f} {r['second_s']:>18.1f} {r['changed_second']:>15}"
        )
    for n in SIZES:
        stock = next(r for r in rows if r["hosts"] == n and r["settings"] == "stock")
        ours = next(r for r in rows if r["hosts"] == n and r["settings"] == "superkube")
        print(
            f"{n} host(s): superkube/stock first {float(ours['first_s']) / float(stock['first_s']):.2f}x, second {float(ours['second_s']) / float(stock['second_s']):.2f}x"
        )
    (ROOT / "bench" / "results").mkdir(exist_ok=True)
    (ROOT / "bench" / "results" / "converge.json").write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
