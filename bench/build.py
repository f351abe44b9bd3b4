"""What `superkube lab build` costs: the pinned control plane from its Go modules, cold and warm.

Run: .venv/bin/python bench/build.py   (prints a table; writes bench/results/build.json)
Cold: an empty build cache and empty Go caches (module and build cache in a temporary folder), as on
a fresh machine. Warm: the same command again, which must find every component and build nothing.
The figures are what a cold build adds to a CI run on a fresh machine, and what every later run pays.
"""

from __future__ import annotations

import json
import os
import platform
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULT = ROOT / "bench" / "results" / "build.json"


def run(env: dict[str, str]) -> tuple[float, list[dict[str, Any]]]:
    started = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "superkube.cli", "lab", "build", "--output", "json"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )
    seconds = time.perf_counter() - started
    if proc.returncode != 0:
        sys.exit(f"superkube lab build failed (exit {proc.returncode})")
    return seconds, json.loads(proc.stdout)


def _go() -> str:
    sys.path[:0] = [str(ROOT / "src")]
    from superkube.harness import build

    return build.go_binary()


def main() -> None:
    tmp = Path(tempfile.mkdtemp(prefix="superkube-bench-build."))
    env = {
        **os.environ,
        "SUPERKUBE_BUILD_CACHE": str(tmp / "cache"),
        "GOCACHE": str(tmp / "go-build"),
        "GOMODCACHE": str(tmp / "go-mod"),
    }
    try:
        cold_s, cold = run(env)
        peak_rss_mb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
        warm_s, warm = run(env)
        sizes = {name: _du(tmp / name) for name in ("cache", "go-build", "go-mod")}
    finally:
        # the module cache's files are read-only: go removes them
        subprocess.run([_go(), "clean", "-modcache"], env=env, check=False)
        shutil.rmtree(tmp, ignore_errors=True)
    assert all(entry["cached"] for entry in warm), "the warm run built something"
    result = {
        "command": "superkube lab build --output json",
        "machine": f"{os.cpu_count()} cores, {platform.machine()}",
        "go": cold[0]["go"],
        "cold_s": round(cold_s, 1),
        "warm_s": round(warm_s, 2),
        "cold_per_component_s": {e["component"]: e["seconds"] for e in cold},
        "versions": {e["component"]: e["version"] for e in cold},
        "peak_go_rss_mb": round(peak_rss_mb),
        "disk_mb": sizes,
    }
    RESULT.write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
    print(f"{'build':<34}{'seconds':>10}")
    for name, seconds in result["cold_per_component_s"].items():
        label = f"  cold: {name} {result['versions'][name]}"
        print(f"{label:<34}{seconds:>10.1f}")
    print(f"{'cold, all (empty caches)':<34}{cold_s:>10.1f}")
    print(f"{'warm, all (nothing built)':<34}{warm_s:>10.2f}")
    print(f"peak RSS of one go process: {result['peak_go_rss_mb']} MB; disk (MB): {sizes}")
    print(f"wrote {RESULT.relative_to(ROOT)}")


def _du(path: Path) -> int:
    total = sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())
    return round(total / 2**20)


if __name__ == "__main__":
    main()
