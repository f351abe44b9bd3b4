"""What `superkube render` costs on the flagship: taking the objects from the plan, validating each
against the official Kubernetes 1.35 schema (strict), and writing the YAML.

Run: .venv/bin/python bench/render.py   (prints a table; writes bench/results/render.json)
Target: render + validation of the flagship's in-cluster layer under 2 s (the plan it reads is
bench/plan.py's figure; the whole `superkube render` process, plan included, is printed beside it).
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

from superkube.cluster import render  # noqa: E402
from superkube.plan import engine as planning  # noqa: E402
from superkube.plan import layer  # noqa: E402

REPEATS = 7


def main() -> None:
    planning.run(ROOT, "dev")  # imports paid once
    result = planning.run(ROOT, "flagship")
    version = result.spec.kubernetes_version

    def render_and_validate(out: Path) -> int:
        objs = layer.objects(result)
        assert layer.problems(result, version) == []
        for component, docs in objs.items():
            (out / f"{component}.yaml").write_text(render.to_yaml(docs))
        return sum(len(d) for d in objs.values())

    with tempfile.TemporaryDirectory() as tmp:
        first_started = time.perf_counter()
        count = render_and_validate(Path(tmp))  # the first run loads the schemas
        first = time.perf_counter() - first_started
        warm = []
        for _ in range(REPEATS):
            started = time.perf_counter()
            render_and_validate(Path(tmp))
            warm.append(time.perf_counter() - started)
        plan_s = []
        for _ in range(3):
            started = time.perf_counter()
            planning.run(ROOT, "flagship")
            plan_s.append(time.perf_counter() - started)
        cli = []
        for _ in range(3):
            started = time.perf_counter()
            subprocess.run(
                [sys.executable, "-m", "superkube.cli", "render", "-s", "flagship", "--out", f"{tmp}/cli"],
                check=True,
                capture_output=True,
                cwd=ROOT,
            )
            cli.append(time.perf_counter() - started)

    figures = {
        "objects": count,
        "render_validate_first_s": first,
        "render_validate_warm_s_median": statistics.median(warm),
        "plan_s_median": statistics.median(plan_s),
        "cli_render_s_median": statistics.median(cli),
    }
    print(f"flagship in-cluster layer: {count} objects, Kubernetes {version} schemas (strict)")
    print(f"  render + validate, first (schemas loaded)  {first:.3f} s   (target < 2 s)")
    print(
        f"  render + validate, warm (median of {REPEATS})    {figures['render_validate_warm_s_median']:.3f} s"
    )
    print(f"  plan it reads (median of 3)                {figures['plan_s_median']:.3f} s")
    print(
        f"  whole `superkube render` process (median of 3, imports + plan) {figures['cli_render_s_median']:.2f} s"
    )
    out = ROOT / "bench" / "results" / "render.json"
    out.write_text(json.dumps(figures, indent=2) + "\n")


if __name__ == "__main__":
    main()
