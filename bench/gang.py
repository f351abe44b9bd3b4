"""Gang scheduling, timed: MPIJobs of 8, 64 and 512 whole-node workers through the real MPI Operator
and the real gang scheduler, against the scheduler's default profile on the same nodes.

Run: .venv/bin/python bench/gang.py [--sizes 8,64,512] [--repeat 3]   (about 15 minutes; prints a
     table; writes bench/results/gang.json)

What runs (`superkube.harness.gang`): the pinned etcd and kube-apiserver on loopback; scheduler-plugins'
kube-scheduler with the gang_scheduler role's configuration and flags over the flagship's plan; the
scheduler-plugins controller and the MPI Operator with the in-cluster layer's args and RBAC; the
controller-manager's Job controller (the launcher is a Job); kwok playing 512 of the flagship's GPU
nodes (8 GPUs, the plan's labels, shared capacity) and 4 CPU nodes for the launchers.

Each job is `superkube job render` of a description on the flagship (team research, borrowing the
shared nodes), created on the server; it is timed from its creation to the last of its pods bound,
read from the scheduler's own Scheduled events (microseconds). Then it is deleted, and the next one
starts on empty nodes. The same jobs run again with the role's configuration less Coscheduling (the
scheduler's default plugins, each pod placed on its own), so the two differ only in the plugin. The
operator creates pods at the layer's client rate (50/s, burst 100) in both: "pods bound per second"
is the job's pods over creation -> last bind, in the fastest run. Each size runs `--repeat` times and
the fastest and the slowest are kept: runs vary several-fold, under both profiles.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "src")]

from superkube.cluster import jobs  # noqa: E402
from superkube.harness import apiserver, kwok  # noqa: E402
from superkube.harness import gang as gang_lab  # noqa: E402
from superkube.plan import checks, layer  # noqa: E402
from superkube.plan import engine as planning  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "gang.json"
NAMESPACE = "research"
CPU_NODES = 4
TIMEOUT_S = 600.0


def log(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def wait_for(what: str, check: Any, timeout: float = TIMEOUT_S) -> Any:
    return gang_lab.wait_for(what, check, timeout, every=0.25)


def run_job(api: apiserver.LocalApi, spec: Any, name: str, workers: int) -> dict[str, Any]:
    job = jobs.JobSpec(
        name=name, namespace=NAMESPACE, image="trainer:lab", command=["mpirun", "python", "train.py"],
        workers=workers, team="research", borrow=True,
    )  # fmt: skip
    mpijob = jobs.render(job, spec)
    created = datetime.now(UTC)
    apiserver.kubectl(api, "create", "-f", "-", stdin=json.dumps(mpijob))
    pods = workers + 1
    wait_for(f"{name}: {pods} pods bound", lambda: len(gang_lab.bound(api, NAMESPACE, name)) == pods)
    times = wait_for(
        f"{name}: {pods} Scheduled events",
        lambda: (t := gang_lab.scheduled_times(api, NAMESPACE, name)) and len(t) == pods and t,
    )
    nodes = set(gang_lab.bound(api, NAMESPACE, name).values())
    apiserver.kubectl(api, "delete", "mpijob", name, "-n", NAMESPACE, "--wait=false")
    wait_for(f"{name}: pods gone", lambda: not gang_lab.job_pods(api, NAMESPACE, name, terminating=True))
    to_bound = (times[-1] - created).total_seconds()
    return {
        "workers": workers,
        "pods": pods,
        "nodes_used": len(nodes),
        "create_to_all_bound_s": round(to_bound, 2),
        "first_to_last_bind_s": round((times[-1] - times[0]).total_seconds(), 3),
        "pods_bound_per_s": round(pods / to_bound, 1),
    }


def new_leader(api: apiserver.LocalApi, before: str) -> bool:
    return gang_lab.leader(api, "kube-system", "kube-scheduler") not in ("", before)


def summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One size's runs: the fastest and the slowest creation -> all bound, and each run."""
    fastest = min(runs, key=lambda r: r["create_to_all_bound_s"])
    return {
        "workers": runs[0]["workers"],
        "pods": runs[0]["pods"],
        "create_to_all_bound_s": fastest["create_to_all_bound_s"],
        "create_to_all_bound_max_s": max(r["create_to_all_bound_s"] for r in runs),
        "first_to_last_bind_s": fastest["first_to_last_bind_s"],
        "pods_bound_per_s": fastest["pods_bound_per_s"],
        "runs": runs,
    }


def main() -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--sizes", default="8,64,512")
    p.add_argument("--repeat", type=int, default=3, help="jobs of each size, one after another")
    args = p.parse_args()
    sizes = [int(x) for x in args.sizes.split(",")]
    work = Path(tempfile.mkdtemp(prefix="gang-bench-"))
    plan = planning.run(ROOT, "flagship")
    engine = checks.plan_wiring(plan)
    # what converge applies before the scheduler starts, then the layer's half
    objects = [*gang_lab.prerequisites(engine), *layer.objects(plan)["gang-scheduling"]]
    config, flags = gang_lab.scheduler(engine)
    rows: dict[str, list[dict[str, Any]]] = {}
    try:
        with (
            apiserver.running(work / "api", log) as api,
            gang_lab.running(api, work / "gang", objects, config, flags, log) as gang,
            kwok.running(api.kubeconfig, work / "kwok", log),
        ):
            nodes = [gang_lab.gpu_node(f"any-{i:03d}", "any", plan.spec.teams) for i in range(max(sizes))]
            gang_lab.register(api, nodes + [gang_lab.cpu_node(f"cpu-{i}") for i in range(CPU_NODES)])
            apiserver.kubectl(api, "create", "namespace", NAMESPACE)
            apiserver.kubectl(api, "create", "serviceaccount", "default", "-n", NAMESPACE)
            for profile, text in (("gang", config), ("default", gang_lab.default_profile(config))):
                before = gang_lab.leader(api, "kube-system", "kube-scheduler")
                gang.start_scheduler(text)
                # the scheduler just started leads, not the one it replaced (whose lease may linger)
                wait_for("the new scheduler's lease", lambda b=before: new_leader(api, b))
                rows[profile] = []
                for n in sizes:
                    runs = []
                    for i in range(args.repeat):
                        runs.append(run_job(api, plan.spec, f"{profile}-{n}-{i}", n))
                        log(f"{profile} {n} #{i}: {json.dumps(runs[-1])}")
                        if gang.dead():
                            sys.exit(f"a controller died: {gang.dead()}")
                    rows[profile].append(summary(runs))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    out = {
        "machine": "2 cores",
        "nodes": max(sizes),
        "retry_unschedulable_s": int(flags["pod-max-in-unschedulable-pods-duration"].rstrip("s")),
        "operator_qps": 50,
        "profiles": rows,
    }
    RESULTS.write_text(json.dumps(out, indent=2) + "\n")
    print(
        f"{'workers':>8} {'profile':>8} {'create->bound s: fastest, slowest':>29} {'bind spread s':>14} {'pods/s':>7}"
    )
    for profile, prows in rows.items():
        for r in prows:
            print(
                f"{r['workers']:>8} {profile:>8} {r['create_to_all_bound_s']:>20.2f} "
                f"{r['create_to_all_bound_max_s']:>8.2f} {r['first_to_last_bind_s']:>14.3f} {r['pods_bound_per_s']:>7.1f}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
