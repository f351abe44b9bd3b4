"""Runs inside the benchmark's network namespace: times one scraper, prints JSON. Stdlib at the top,
so the other exporter's virtualenv can run it too."""

import json
import statistics
import subprocess
import sys
import time

impl, backend, repeats = sys.argv[1], sys.argv[2], int(sys.argv[3])
save = "iptables-legacy-save" if backend == "legacy" else "iptables-save"

if impl == "iptables-save":

    def scrape() -> int:
        return len(subprocess.run([save, "-c", "-t", "mangle"], capture_output=True, check=True).stdout)

elif impl == "superkube":
    from superkube.agents.iptables_exporter import Exporter

    exporter = Exporter(["mangle"], save)

    def scrape() -> int:
        return len(exporter.scrape())

elif impl == "pypi":
    from iptables_exporter.main import collect_metrics
    from prometheus_client import core, generate_latest

    def scrape() -> int:
        collect_metrics(["4"], ["mangle"])
        return len(generate_latest(core.REGISTRY))

else:
    raise SystemExit(f"unknown scraper {impl}")

size = scrape()  # warm up (imports, caches)
times = []
for _ in range(repeats):
    started = time.perf_counter()
    scrape()
    times.append(time.perf_counter() - started)
print(
    json.dumps(
        {
            "impl": impl,
            "backend": backend,
            "median_s": statistics.median(times),
            "min_s": min(times),
            "bytes": size,
        }
    )
)
