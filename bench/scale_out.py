"""Scale-out on the lab: new GPU instances joining from the baked image and their custom data alone,
against today's join, where converge must reach each new instance first. Same lab, same pool, one run.

Run: .venv/bin/python bench/scale_out.py [--count 4]
Brings up the control-plane lab, converges it, applies the in-cluster layer (preflight must lift each
GPU node's taint), joins its first nodes, then:
1. bakes the GPU pool's image (a builder converged and captured) and publishes a join token;
2. boots --count instances at once from the image (`lab scale`): boot -> Ready, boot -> schedulable;
3. boots --count instances at once from the base image and converges them (the join before images):
   the same two spans, each from the instance's own boot, converge included.
Prints p50 and max of each, and the ratio converge / image. Writes bench/results/scale_out.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "src")]

from bench._lab import converged  # noqa: E402
from superkube.lab import agent_pods, layer, nodes, scaleout  # noqa: E402
from superkube.lab.state import Lab  # noqa: E402

CONTROL_PLANE = "gpu_nodes=1,cpu_nodes=1,nat_host=1,etcd_main=5,etcd_events=3,apiservers=2"
RESULTS = ROOT / "bench" / "results" / "scale_out.json"


def spans(instances: list[scaleout.Instance]) -> dict[str, float]:
    ready = [i.boot_to_ready_s for i in instances]
    usable = [i.boot_to_schedulable_s for i in instances]
    return {
        "boot_to_ready_p50_s": round(statistics.median(ready), 1),
        "boot_to_ready_max_s": round(max(ready), 1),
        "boot_to_schedulable_p50_s": round(statistics.median(usable), 1),
        "boot_to_schedulable_max_s": round(max(usable), 1),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--count", type=int, default=4, help="instances joining at once, each way (default 4)")
    args = p.parse_args()
    with converged(CONTROL_PLANE, "all") as fleet:
        say = lambda what: print(what, flush=True)  # noqa: E731
        layer.apply(fleet, say)
        nodes.join(fleet, ["gpu-1", "cpu-1"])
        pool = next(h.pool for h in fleet.hosts if h.group == "gpu_nodes")
        started = time.monotonic()
        scaleout.bake(fleet, pool, say)
        baked_s = time.monotonic() - started
        published = scaleout.publish(fleet)
        image = scaleout.scale_out(fleet, pool, args.count, progress=say)
        fleet = Lab.load() or fleet
        today = scaleout.scale_out_by_converge(fleet, pool, args.count, progress=say)
        doc = {
            "count": args.count,
            "pool": pool,
            "bake_s": round(baked_s, 1),
            "token_id_published": bool(published["token_id"]),
            "preflight_round_s": agent_pods.ROUND_S,
            "image": {"instances": [vars(i) for i in image], **spans(image)},
            "converge": {"instances": [vars(i) for i in today], **spans(today)},
        }
        for what in ("boot_to_ready_p50_s", "boot_to_schedulable_p50_s", "boot_to_schedulable_max_s"):
            doc[f"ratio_{what.removesuffix('_s')}"] = round(doc["converge"][what] / doc["image"][what], 1)
    RESULTS.write_text(json.dumps(doc, indent=2) + "\n")
    print(json.dumps({k: v for k, v in doc.items() if k not in ("image", "converge")}, indent=2))
    for way in ("image", "converge"):
        print(way, {k: v for k, v in doc[way].items() if k != "instances"})


if __name__ == "__main__":
    main()
