"""The join storm a full-pool scale-up sends to the API servers, and how the join priority level takes it.

Run: .venv/bin/python bench/join_storm.py [--stack flagship] [--seed 1]
     (prints a table; writes bench/results/join_storm.json)

Model (documented in docs/04-in-cluster-layer.md, "Smoothed scale-up"):
- under the scale-up governor (`superkube.agents.scale_governor`), cluster-autoscaler asks for at
  most the governor's room, `budget(safe_join_rate_per_minute)` nodes, at each provider refresh (one
  a minute): its worst case is the whole room at once, every refresh. Without it, a batch of
  `autoscaler_max_nodes_per_scaleup` nodes every loop, and the real autoscaler runs its loops back to
  back while pods stay pending (bench/autoscaler.py), modelled as one a second (N = the pool's nodes);
- each VM boots in 90-180 s (uniform), then waits a uniform 0..`autoscaler_join_jitter_seconds`;
- a join is REQUESTS requests on the join path (CSR create, CSR watch, Node create, Node get),
  each holding one seat for SERVICE_MS at one of the API servers (spread evenly by the load balancer);
- the join priority level has `apf_seats(apf_node_join_shares, 4000)` seats per API server (4000 =
  --max-requests-inflight 3000 + --max-mutating-requests-inflight 1000, the role defaults); a request
  waits first-come first-served (each joining node is its own flow, so fair queuing is FIFO here);
  once queues x queueLengthLimit requests wait, the next is rejected with 429.
It prints the peak join rate the simulation sees (per second, and as nodes/minute over the busiest
minute) beside `superkube.cluster.autoscaling.peak_join_rate_per_second`'s formula (which the policy rule
uses; it leaves out the boot-time spread, so it is the conservative one), and the queue wait.
Only the join path is modelled: a joined kubelet's LIST/WATCH load is outside these FlowSchemas.
"""

from __future__ import annotations

import argparse
import heapq
import json
import random
import statistics
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "src")]

from modules.platform.flowcontrol import NodeJoinFlowArgs  # noqa: E402
from superkube.agents import scale_governor  # noqa: E402
from superkube.cluster import autoscaling, kube  # noqa: E402
from superkube.plan import engine as planning  # noqa: E402

REQUESTS = 4
SERVICE_MS = 50
TOTAL_CONCURRENCY = 3000 + 1000
BOOT_S = (90, 180)


@dataclass(frozen=True)
class Scenario:
    name: str
    nodes: int
    per_scaleup: int
    scan_interval: int
    jitter: int


def simulate(s: Scenario, seats: int, queue_capacity: int, rng: random.Random) -> dict[str, float]:
    joins = []
    issued = 0
    t = 0.0
    while issued < s.nodes:
        batch = min(s.per_scaleup, s.nodes - issued)
        joins += [t + rng.uniform(*BOOT_S) + rng.uniform(0, s.jitter) for _ in range(batch)]
        issued += batch
        t += s.scan_interval
    joins.sort()
    # join arrivals: busiest second and busiest minute (sliding over whole seconds)
    per_second = Counter(int(j) for j in joins)
    peak_second = max(per_second.values())
    window, best = 0, 0
    seconds = sorted(per_second)
    lo = 0
    for sec in seconds:
        window += per_second[sec]
        while seconds[lo] <= sec - 60:
            window -= per_second[seconds[lo]]
            lo += 1
        best = max(best, window)
    # the join path's requests at the priority level: FIFO over `seats`, bounded queue
    service = SERVICE_MS / 1000
    free = [0.0] * seats
    heapq.heapify(free)
    waits: list[float] = []
    rejected = 0
    in_service_ends: list[float] = []  # when queued requests start (to count the queue's length)
    arrivals = sorted(j + i * service for j in joins for i in range(REQUESTS))
    for arrival in arrivals:
        while in_service_ends and in_service_ends[0] <= arrival:
            heapq.heappop(in_service_ends)
        start = max(arrival, free[0])
        if start > arrival and len(in_service_ends) >= queue_capacity:
            rejected += 1
            continue
        heapq.heapreplace(free, start + service)
        if start > arrival:
            heapq.heappush(in_service_ends, start)
        waits.append(start - arrival)
    waits.sort()
    return {
        "peak_joins_per_second": peak_second,
        "peak_joins_per_minute": best,
        "formula_joins_per_second": autoscaling.peak_join_rate_per_second(
            s.nodes, s.per_scaleup, s.scan_interval, s.jitter
        ),
        "wait_p50_ms": 1000 * statistics.median(waits),
        "wait_p99_ms": 1000 * waits[int(0.99 * (len(waits) - 1))],
        "wait_max_ms": 1000 * waits[-1],
        "rejected_429": rejected,
        "span_minutes": (joins[-1] - joins[0]) / 60,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stack", default="flagship")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    _, spec, _ = planning.load(ROOT, args.stack)
    flow = NodeJoinFlowArgs(shares=spec.apf_node_join_shares)
    seats = kube.apf_seats(flow.shares, TOTAL_CONCURRENCY) * spec.apiserver_count
    queue_capacity = flow.queues * flow.queue_length_limit * spec.apiserver_count
    pool = max(spec.node_pools, key=lambda p: p.nodes)
    room = scale_governor.budget(spec.safe_join_rate_per_minute)
    jitter, per_scaleup = spec.autoscaler_join_jitter_seconds, spec.autoscaler_max_nodes_per_scaleup
    governed = [
        Scenario(
            f"stack {args.stack}, governed ({room} a refresh)",
            pool.nodes,
            room,
            scale_governor.PROVIDER_REFRESH_S,
            jitter,
        )
    ]
    scenarios = [
        *(governed if spec.autoscaler_governor else []),
        Scenario(f"{per_scaleup} a loop, loops back to back", pool.nodes, per_scaleup, 1, jitter),
        Scenario("same, no join jitter", pool.nodes, per_scaleup, 1, 0),
        Scenario("upstream defaults (1000/scan, no jitter)", pool.nodes, 1000, 10, 0),
    ]
    safe = spec.safe_join_rate_per_minute
    print(
        f"full scale-up of pool {pool.name}: {pool.nodes:,} nodes; join level {flow.shares} shares -> "
        f"{seats} seats over {spec.apiserver_count} API servers; {REQUESTS} requests x {SERVICE_MS} ms per join; "
        f"safe rate {safe}/minute"
    )
    print(
        f"the join level holds at most {seats} of {TOTAL_CONCURRENCY * spec.apiserver_count} seats "
        f"({seats / (TOTAL_CONCURRENCY * spec.apiserver_count):.0%}): the rest serve everyone else whatever joins"
    )
    header = f"{'scenario':44} {'peak/s':>7} {'peak/min':>8} {'formula/min':>11} {'wait p99':>9} {'wait max':>9} {'429s':>6} {'minutes':>7}"
    print(header)
    results = {}
    for s in scenarios:
        r = simulate(s, seats, queue_capacity, random.Random(args.seed))
        results[s.name] = {**r, **s.__dict__}
        print(
            f"{s.name:44} {r['peak_joins_per_second']:7.0f} {r['peak_joins_per_minute']:8.0f} "
            f"{60 * r['formula_joins_per_second']:11.0f} {r['wait_p99_ms']:7.1f}ms {r['wait_max_ms']:7.1f}ms "
            f"{r['rejected_429']:6d} {r['span_minutes']:7.1f}"
        )
    out = ROOT / "bench" / "results" / "join_storm.json"
    out.write_text(
        json.dumps({"seats": seats, "safe_join_rate_per_minute": safe, "scenarios": results}, indent=2) + "\n"
    )


if __name__ == "__main__":
    main()
