"""Plan time and resource count at 75, 750 and 7,500 GPU nodes; the whole `superkube plan` process for
the flagship beside a bare import of the Pulumi SDKs it runs on, `superkube --help`, and what the plan
process spends its imports on.

Run: .venv/bin/python bench/plan.py   (prints a table; writes bench/results/plan.json)
Targets: the flagship plans in under 2 s as a process, and within 3 times a bare
`import pulumi, pulumi_azure_native, pulumi_kubernetes` timed in the same run (a ratio that the
machine's speed and load move less than seconds); `--help` answers in under 0.5 s; resources grow
far slower than nodes.

Both sides run from compiled bytecode, as installed code does: pip compiled the SDKs when it
installed them, and the project's own sources (installed editable) are compiled here first, as any
first run compiles them where Python may write its cache. Where it may not
(PYTHONDONTWRITEBYTECODE), every process would otherwise compile ~80 modules of the project again.

`plan_floor_s` splits one plan process (timed from inside, in order) into what it is made of: the
SDKs' import (the bare import's share), the command line's imports, azure-native's typed modules
that the program's resources load, the rest of the first run (the program's modules, the SDK's
first reading of each type, registering every resource), one run more in the same process (what
registering the resources costs once everything is loaded), and writing the document. The
interpreter's own start (about 20 ms here) is in the process's time and in the bare import's, and in
none of the parts.
"""

from __future__ import annotations

import compileall
import json
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "src")]

from superkube.plan import engine as planning  # noqa: E402

SIZES = (75, 750, 7_500)
REPEATS = 5
PROCESS_RUNS = 5
TOP_IMPORTS = 12
SDK_IMPORT = "import pulumi, pulumi_azure_native, pulumi_kubernetes"
"""The floor under any plan: the SDKs the program is written against, imported and nothing run."""


def process_seconds(args: list[str]) -> list[float]:
    """Wall seconds of whole `superkube ARGS` processes, after one run that warms the file cache."""
    times = []
    for i in range(PROCESS_RUNS + 1):
        started = time.perf_counter()
        subprocess.run(
            [sys.executable, "-m", "superkube.cli", *args], check=True, capture_output=True, cwd=ROOT
        )
        if i:
            times.append(time.perf_counter() - started)
    return times


def paired_seconds(args: list[str]) -> tuple[list[float], list[float]]:
    """Wall seconds of whole `superkube ARGS` processes and of bare `SDK_IMPORT` processes, taken in
    turn so both see the same machine, after one of each that warms the file cache."""
    commands = ([sys.executable, "-m", "superkube.cli", *args], [sys.executable, "-c", SDK_IMPORT])
    times: tuple[list[float], list[float]] = ([], [])
    for i in range(PROCESS_RUNS + 1):
        for command, kept in zip(commands, times, strict=True):
            started = time.perf_counter()
            subprocess.run(command, check=True, capture_output=True, cwd=ROOT)
            if i:
                kept.append(time.perf_counter() - started)
    return times


def import_costs(args: list[str]) -> dict[str, float]:
    """Milliseconds of imports by top-level package, as `python -X importtime` reports them."""
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "superkube.cli", *args],
        check=True,
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    by_package: dict[str, float] = {}
    for line in proc.stderr.splitlines():
        if not line.startswith("import time:") or "|" not in line:
            continue
        _, cumulative, name = line.split("|")
        if name.startswith("  ") or not cumulative.strip().isdigit():
            continue  # a nested import: already in its importer's cumulative figure
        package = name.strip().split(".")[0]
        by_package[package] = by_package.get(package, 0.0) + int(cumulative) / 1000
    top = sorted(by_package.items(), key=lambda item: -item[1])[:TOP_IMPORTS]
    return {package: round(ms, 1) for package, ms in top}


FLOOR = """
import importlib, json, sys, time
started = time.perf_counter()
import pulumi, pulumi_azure_native, pulumi_kubernetes
sdk = time.perf_counter() - started
started = time.perf_counter()
import superkube.cli
from superkube.plan import collector, engine
cli = time.perf_counter() - started
azure, depth, import_module = [0.0], [0], importlib.import_module
def timed(name, package=None):
    if not name.startswith("pulumi_azure_native.") or depth[0]:
        return import_module(name, package)
    depth[0] += 1
    began = time.perf_counter()
    try:
        return import_module(name, package)
    finally:
        depth[0] -= 1
        azure[0] += time.perf_counter() - began
importlib.import_module = timed
root = engine.find_project()
with collector.paused(for_the_command=True):
    started = time.perf_counter()
    plan = engine.run(root, "flagship")
    first = time.perf_counter() - started
    started = time.perf_counter()
    document = json.dumps(plan.to_dict(), indent=2)
    written = time.perf_counter() - started
    started = time.perf_counter()
    engine.run(root, "flagship")
    again = time.perf_counter() - started
print(json.dumps({"sdk_import": sdk, "cli_imports": cli, "azure_typed_modules": azure[0],
    "first_run_rest": first - azure[0], "run_again": again, "document": written}))
"""
"""A plan process's parts, timed from inside it (see the module's docstring)."""


def floor_parts() -> dict[str, float]:
    """Each part of `FLOOR`'s process: the median of PROCESS_RUNS fresh processes."""
    runs = [
        json.loads(
            subprocess.run(
                [sys.executable, "-c", FLOOR], check=True, capture_output=True, text=True, cwd=ROOT
            ).stdout
        )
        for _ in range(PROCESS_RUNS)
    ]
    return {part: round(statistics.median(r[part] for r in runs), 3) for part in runs[0]}


def stack_for(nodes: int, directory: Path) -> Path:
    """The flagship stack with its GPU pool resized to `nodes` (everything else unchanged)."""
    data = yaml.safe_load((ROOT / "stacks" / "Pulumi.flagship.yaml").read_text())
    pools = yaml.safe_load(data["config"]["superkube:node_pools"])
    pools[0]["nodes"] = nodes
    data["config"]["superkube:node_pools"] = yaml.safe_dump(pools, sort_keys=False)
    path = directory / f"Pulumi.bench{nodes}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def main() -> None:
    for sources in (ROOT / "src", ROOT / "modules"):  # as installed code runs: see the docstring
        compileall.compile_dir(sources, quiet=1)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        planning.run(ROOT, "dev")  # imports and first-run costs, paid once like any long-lived process
        for nodes in SIZES:
            path = stack_for(nodes, Path(tmp))
            times, result = [], None
            for _ in range(REPEATS):
                started = time.perf_counter()
                result = planning.run(ROOT, str(path))
                times.append(time.perf_counter() - started)
            assert result is not None
            rows.append(
                {
                    "gpu_nodes": nodes,
                    "nodes": result.addresses.capacity["nodes"],
                    "scale_sets": result.addresses.capacity["scale_sets"],
                    "resources": len(result.resources),
                    "plan_s_median": statistics.median(times),
                    "plan_s_max": max(times),
                }
            )
    cold, sdk = paired_seconds(["plan", "--stack", "flagship", "--output", "json"])
    help_s = process_seconds(["--help"])
    imports = import_costs(["plan", "--stack", "flagship", "--output", "json"])
    floor = floor_parts()
    small, big = rows[0], rows[-1]
    summary = {
        "machine": f"{platform.machine()}, {platform.python_implementation()} {platform.python_version()}",
        "rows": rows,
        "flagship_cold_cli_s_median": statistics.median(cold),
        "flagship_cold_cli_s_max": max(cold),
        "sdk_import_s_median": statistics.median(sdk),
        "flagship_cli_over_sdk_import": statistics.median(cold) / statistics.median(sdk),
        "help_s_median": statistics.median(help_s),
        "plan_imports_ms": imports,
        "plan_floor_s": floor,
        "node_growth": big["gpu_nodes"] / small["gpu_nodes"],
        "resource_growth": big["resources"] / small["resources"],
        "time_growth": big["plan_s_median"] / small["plan_s_median"],
    }
    print(
        f"{'GPU nodes':>10} {'nodes':>7} {'scale sets':>10} {'resources':>9} {'plan s (median of 5)':>21} {'max s':>7}"
    )
    for r in rows:
        print(
            f"{r['gpu_nodes']:>10,} {r['nodes']:>7,} {r['scale_sets']:>10} {r['resources']:>9} {r['plan_s_median']:>21.3f} {r['plan_s_max']:>7.3f}"
        )
    print(
        f"flagship, whole `superkube plan` process (imports included), median of {PROCESS_RUNS}: "
        f"{summary['flagship_cold_cli_s_median']:.2f} s (max {max(cold):.2f}; target < 2 s)"
    )
    print(
        f"bare `{SDK_IMPORT}`, taken in turn with it, median of {PROCESS_RUNS}: "
        f"{summary['sdk_import_s_median']:.2f} s; the plan takes "
        f"{summary['flagship_cli_over_sdk_import']:.1f} times as long (target <= 3)"
    )
    print(f"`superkube --help`, median of {PROCESS_RUNS}: {summary['help_s_median']:.2f} s (target < 0.5 s)")
    print("the plan process's imports, by top-level package (cumulative ms, python -X importtime):")
    for package, ms in imports.items():
        print(f"  {package:<28} {ms:>7.0f}")
    print(f"one plan process, timed from inside, median of {PROCESS_RUNS}:")
    for part, seconds in floor.items():
        print(f"  {part:<28} {seconds * 1000:>7.0f} ms")
    print(
        f"75 -> 7,500 GPU nodes: nodes x{summary['node_growth']:.0f}, resources x{summary['resource_growth']:.2f}, "
        f"plan time x{summary['time_growth']:.2f}"
    )
    out = ROOT / "bench" / "results" / "plan.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(summary, indent=2) + "\n")


if __name__ == "__main__":
    main()
