"""What `superkube check` adds to the flagship's plan time.

Run: .venv/bin/python bench/check.py   (prints a table; writes bench/results/check.json)
Target: checking the flagship adds under 1 s to planning it. The table says whether this run met
it; bench/figures.py carries the verdict into docs/09-figures.md.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "src")]

from superkube.plan import checks  # noqa: E402
from superkube.plan import engine as planning  # noqa: E402

REPEATS = 7
CLI_REPEATS = 5


def timed(fn, repeats: int = REPEATS) -> list[float]:  # type: ignore[no-untyped-def]
    out = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        out.append(time.perf_counter() - started)
    return out


def main() -> None:
    rules = checks.load_rules(ROOT)
    planning.run(ROOT, "dev")  # imports paid once
    result = planning.run(ROOT, "flagship")
    document = result.to_dict()

    def check_recorded() -> None:
        view = checks.view_from_plan_document(document)
        report = checks.evaluate(view, rules, checks.rule_config(result.spec, result.addresses))
        assert report.passed

    def check_saved() -> None:
        saved = json.loads(text)
        spec, addresses = planning.spec_from_config(saved["config"], saved["stack"])
        report = checks.evaluate(
            checks.view_from_plan_document(saved), rules, checks.rule_config(spec, addresses)
        )
        assert report.passed

    text = json.dumps(document)
    plan_s = timed(lambda: planning.run(ROOT, "flagship"))
    check_s = timed(check_recorded)
    saved_s = timed(check_saved)

    def cli(*args: str) -> float:
        started = time.perf_counter()
        subprocess.run(
            [sys.executable, "-m", "superkube.cli", *args], check=True, capture_output=True, cwd=ROOT
        )
        return time.perf_counter() - started

    with tempfile.TemporaryDirectory() as tmp:
        saved_plan = Path(tmp) / "flagship.json"
        saved_plan.write_text(text)
        # alternate the two so that the machine's drift falls on both alike
        plans, checks_ = [], []
        for _ in range(CLI_REPEATS):
            plans.append(cli("plan", "-s", "flagship", "-o", "json"))
            checks_.append(cli("check", "-s", "flagship", "-o", "json"))
        cli_plan, cli_check = statistics.median(plans), statistics.median(checks_)
        cli_saved = statistics.median(
            cli("check", "--plan", str(saved_plan), "-o", "json") for _ in range(CLI_REPEATS)
        )

    figures = {
        "rules": len(rules),
        "resources": len(result.resources),
        "plan_s_median": statistics.median(plan_s),
        "check_recorded_plan_s_median": statistics.median(check_s),
        "check_saved_plan_s_median": statistics.median(saved_s),
        "cli_plan_s": cli_plan,
        "cli_plan_and_check_s": cli_check,
        "cli_check_saved_plan_s": cli_saved,
    }
    figures["check_adds_s"] = figures["cli_plan_and_check_s"] - figures["cli_plan_s"]
    print(
        f"flagship: {figures['resources']} resources, {figures['rules']} rules (in-process medians of {REPEATS})"
    )
    print(f"  plan                         {figures['plan_s_median']:.3f} s")
    print(
        f"  check a recorded plan        {figures['check_recorded_plan_s_median']:.3f} s  ({figures['check_recorded_plan_s_median'] / figures['plan_s_median']:.2f} x plan)"
    )
    print(f"  check a saved plan (JSON)    {figures['check_saved_plan_s_median']:.3f} s")
    print(f"whole processes (imports included), medians of {CLI_REPEATS}, alternating:")
    print(f"  superkube plan               {cli_plan:.2f} s")
    verdict = "met" if figures["check_adds_s"] < 1 else "MISSED"
    print(
        f"  superkube check (plans too)  {cli_check:.2f} s   -> check adds {figures['check_adds_s']:.2f} s "
        f"(target < 1 s: {verdict})"
    )
    print(f"  superkube check --plan FILE  {cli_saved:.2f} s")
    out = ROOT / "bench" / "results" / "check.json"
    out.write_text(json.dumps(figures, indent=2) + "\n")


if __name__ == "__main__":
    main()
