"""A join storm against the real API server, with and without the superkube-node-join priority level.

Run: .venv/bin/python bench/join_flow.py [--joins 2000] [--concurrency 200] [--scale 32]
     (about 12 minutes; prints a table; writes bench/results/join_flow.json)

What runs: the pinned etcd and kube-apiserver (`superkube.harness.apiserver`), with the production role's
authentication, authorization and admission, and kube-controller-manager from the same build running
its csrapproving and csrsigning controllers, each as its own service account, at the role's client
rate. The kube_apiserver role's bootstrap objects (its bootstrap.yaml.j2 as a converge renders it
over the flagship's plan) give the joining nodes their bootstrap token, the node-bootstrapper role
and auto-approval. As in production, every node joins with the one token (so every bootstrap
request is one user, one APF flow); `--per-node-tokens` gives each node its own.

A join (`superkube.harness.joins`) is what a kubelet sends on first start: as the token it creates a CSR
and watches it until it is approved and signed; then, as `system:node:<name>` with the issued
certificate, it creates its Node and its Lease. A request answered 429 is retried after Retry-After
and counted. `--concurrency` joins run at once until all `--joins` have run.

Beside the storm a steady client, an ordinary user (its own client certificate, no group of the
built-in schemas, so the built-in `global-default` level, as people and CI tools are) lists the 50 pods
of its namespace and writes a ConfigMap there, back to back, from its own process.

Rounds, in one run: idle (the steady client alone) -> storm with the built-in levels only -> idle ->
the layer's FlowSchemas and PriorityLevelConfiguration applied (`modules.platform.flowcontrol`, the
flagship's level) -> storm -> the same joins paced at `--paced` a second -> the level at the former
default, 10 shares and 64 queues of 100 -> idle -> storm. Each round's steady p99 is compared with the idle round before
it. After each storm the server's own APF metrics say how many requests each level dispatched and
how long the join level's requests waited and ran.

The server's concurrency limit is the role's (--max-requests-inflight 3000 + --max-mutating 1000)
divided by `--scale`, and the control plane (etcd, kube-apiserver, kube-controller-manager) runs on
one core, the clients on the others: the joining kubelets and the user are other machines in a
cluster. APF divides the limit by the same shares at any size, so with the limit scaled to the core
the levels' seats stand to it as a production server's seats stand to its cores. The seats each
level gets are printed.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "src")]

from modules.platform import flowcontrol  # noqa: E402
from superkube.cluster import kube  # noqa: E402
from superkube.harness import apiserver, joins  # noqa: E402
from superkube.plan import checks  # noqa: E402
from superkube.plan import engine as planning  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "join_flow.json"
NAMESPACE, STEADY_USER, STEADY_PODS = "steady", "steady-user", 50
IDLE_S = 20


def role_inputs(stack: str) -> tuple[list[dict[str, Any]], dict[str, int], int]:
    """The kube_apiserver role's bootstrap objects and in-flight limits over the stack's plan (one
    API-server host's view), the controller-manager role's client rate, and the stack's join-level
    shares."""
    plan = planning.run(ROOT, stack)
    engine = checks.plan_wiring(plan)
    host = next(h for h in engine.hosts if h.group == "apiservers")
    limits = engine.render(
        "kube_apiserver",
        host,
        ["kube_apiserver_max_requests_inflight", "kube_apiserver_max_mutating_requests_inflight"],
    )
    qps = engine.render(
        "kube_controller_manager",
        host,
        ["kube_controller_manager_api_qps", "kube_controller_manager_api_burst"],
    )
    limits.update(qps)
    return (
        joins.role_objects(engine),
        {k: int(v) for k, v in limits.items()},
        plan.spec.apf_node_join_shares,
    )


def create(api: apiserver.LocalApi, objects: list[dict[str, Any]]) -> None:
    for i in range(0, len(objects), 500):
        doc = {"apiVersion": "v1", "kind": "List", "items": objects[i : i + 500]}
        apiserver.kubectl(api, "create", "-f", "-", "-o", "name", stdin=json.dumps(doc))


def steady_setup(api: apiserver.LocalApi) -> Path:
    """The steady user's namespace, rights, pods and ConfigMap; its kubeconfig's directory."""
    rules = [
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]},
        {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "update"]},
    ]
    objects: list[dict[str, Any]] = [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "default", "namespace": NAMESPACE}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
         "metadata": {"name": "steady", "namespace": NAMESPACE}, "rules": rules},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
         "metadata": {"name": "steady", "namespace": NAMESPACE},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "steady"},
         "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": STEADY_USER}]},
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "steady", "namespace": NAMESPACE},
         "data": {"n": "0"}},
    ]  # fmt: skip
    objects += [
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": f"work-{i:03d}", "namespace": NAMESPACE, "labels": {"app": "work"}},
            "spec": {
                "automountServiceAccountToken": False,
                "containers": [{"name": "main", "image": "registry.invalid/work:1"}],
            },
        }
        for i in range(STEADY_PODS)
    ]
    apiserver.kubectl(api, "create", "namespace", NAMESPACE)
    create(api, objects)
    api.client_kubeconfig(STEADY_USER, STEADY_USER)
    return api.dir / "pki"


def start_steady(api: apiserver.LocalApi, seconds: float, out: Path) -> subprocess.Popen[bytes]:
    pk = api.dir / "pki"
    argv = [sys.executable, "-m", "superkube.harness.joins", "steady", api.url, str(pk / "ca.crt"),
            str(pk / f"{STEADY_USER}.crt"), str(pk / f"{STEADY_USER}.key"), NAMESPACE, str(seconds), str(out)]  # fmt: skip
    return subprocess.Popen(
        argv,
        env={"PYTHONPATH": str(ROOT / "src"), "PATH": "/usr/bin:/bin"},
        preexec_fn=apiserver.die_with_parent,
    )


def latencies(out: Path, since: float, until: float) -> dict[str, Any]:
    rows = [json.loads(line) for line in out.read_text().splitlines() if line.strip()]
    window = [r for r in rows if since <= r["t"] <= until]
    ms = sorted(r["ms"] for r in window)
    if not ms:
        raise SystemExit(f"join_flow: the steady client made no request in its window; see {out}")
    return {
        "requests": len(ms),
        "errors": sum(1 for r in window if r["status"] not in (200, 201)),
        "p50_ms": ms[len(ms) // 2],
        "p99_ms": ms[min(len(ms) - 1, math.ceil(0.99 * len(ms)) - 1)],
        "max_ms": ms[-1],
    }


def idle_round(api: apiserver.LocalApi, work: Path, name: str) -> dict[str, Any]:
    out = work / f"{name}.jsonl"
    began = time.time()
    start_steady(api, IDLE_S, out).wait()
    return latencies(out, began + 2, time.time())  # the first requests open its connection


def storm_round(
    api: apiserver.LocalApi,
    work: Path,
    name: str,
    tokens: list[joins.Token],
    concurrency: int,
    levels: dict[str, str],
    rate: float = 0.0,
) -> dict[str, Any]:
    out = work / f"{name}.jsonl"
    steady = start_steady(api, 3600, out)
    try:
        time.sleep(3)
        nodes = [f"{name}-{i:05d}" for i in range(len(tokens))]
        began_wall, began = time.time(), time.monotonic()

        def progress(done: int, total: int) -> None:
            if done % 250 == 0 or done == total:
                print(f"  {name}: {done}/{total} joined, {time.monotonic() - began:.0f} s", file=sys.stderr)

        cpu_before, apf_before = cpu_by_process(api, steady.pid), apf_metrics(api)
        ca = api.dir / "pki" / "ca.crt"
        results = joins.storm(api.url, ca, tokens, nodes, concurrency, progress, rate)
        ended_wall, span = time.time(), time.monotonic() - began
        cpu = {k: v - cpu_before[k] for k, v in cpu_by_process(api, steady.pid).items()}
        apf = apf_delta(apf_before, apf_metrics(api))
    finally:
        steady.terminate()
        steady.wait()
    joined = sorted(r.finished - r.started for r in results if r.ok)
    classified: dict[str, dict[str, int]] = {}
    for r in results:
        for s in r.steps:
            at = classified.setdefault(s.step, {})
            level = levels.get(s.priority_level, s.priority_level or "none")
            at[level] = at.get(level, 0) + 1
    errors = sorted({r.error for r in results if not r.ok})
    return {
        "steady": latencies(out, began_wall, ended_wall),
        "joins": len(results),
        "joined": len(joined),
        "failed": len(results) - len(joined),
        "errors": errors[:5],
        "throttled_429": sum(r.throttled for r in results),
        "joins_throttled": sum(1 for r in results if r.throttled),
        "storm_s": span,
        "joins_per_s": len(joined) / span,
        "join_p50_s": joined[len(joined) // 2] if joined else None,
        "join_p99_s": joined[min(len(joined) - 1, math.ceil(0.99 * len(joined)) - 1)] if joined else None,
        "classified": classified,
        "cpu_s": cpu,
        "apf": apf,
    }


def cpu_s(pid: int) -> float:
    """CPU seconds (user + system) a process has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cpu_by_process(api: apiserver.LocalApi, steady: int) -> dict[str, float]:
    named = {Path(str(p.args[0])).name: p.pid for p in api.processes}
    return {**{n: cpu_s(pid) for n, pid in named.items()}, "steady client": cpu_s(steady),
            "joins (this process)": cpu_s(os.getpid())}  # fmt: skip


def apf_metrics(api: apiserver.LocalApi) -> dict[tuple[str, str], float]:
    """The server's APF counters by (metric, priority level): requests dispatched, and the sums and
    counts of the wait and execution histograms."""
    wanted = {
        "apiserver_flowcontrol_dispatched_requests_total",
        "apiserver_flowcontrol_request_wait_duration_seconds_sum",
        "apiserver_flowcontrol_request_wait_duration_seconds_count",
        "apiserver_flowcontrol_request_execution_seconds_sum",
        "apiserver_flowcontrol_request_execution_seconds_count",
    }
    return joins.apf_metrics(apiserver.kubectl(api, "get", "--raw", "/metrics"), sorted(wanted))


def apf_delta(before: dict[tuple[str, str], float], after: dict[tuple[str, str], float]) -> dict[str, Any]:
    """Requests each level dispatched in between, and the mean wait and execution of each."""
    diff = {k: v - before.get(k, 0.0) for k, v in after.items()}
    levels = sorted({level for (name, level) in diff if name.endswith("dispatched_requests_total")})
    out: dict[str, Any] = {}
    for level in levels:
        dispatched = diff.get(("apiserver_flowcontrol_dispatched_requests_total", level), 0.0)
        if dispatched < 1:
            continue
        row: dict[str, float] = {"dispatched": dispatched}
        for kind in ("wait_duration", "execution"):
            prefix = f"apiserver_flowcontrol_request_{kind}_seconds"
            count = diff.get((f"{prefix}_count", level), 0.0)
            if count:
                row[f"mean_{kind.split('_')[0]}_ms"] = 1000 * diff.get((f"{prefix}_sum", level), 0.0) / count
        out[level] = row
    return out


def level_names(api: apiserver.LocalApi) -> dict[str, str]:
    items = json.loads(apiserver.kubectl(api, "get", "prioritylevelconfigurations", "-o", "json"))["items"]
    return {i["metadata"]["uid"]: i["metadata"]["name"] for i in items}


def main() -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--joins", type=int, default=2000)
    p.add_argument("--concurrency", type=int, default=200)
    p.add_argument("--scale", type=int, default=32, help="divide the role's in-flight limits by this")
    p.add_argument("--stack", default="flagship")
    p.add_argument(
        "--per-node-tokens", action="store_true", help="a bootstrap token per node, not one for all"
    )
    p.add_argument(
        "--paced", default="2,10,20,30", help="joins a second of the paced rounds (with the level)"
    )
    p.add_argument("--paced-s", type=float, default=30, help="seconds each paced round sends joins")
    p.add_argument("--compare-shares", type=int, default=10, help="shares of the last round's level")
    p.add_argument("--compare-queues", type=int, default=64, help="queues of the last round's level")
    p.add_argument(
        "--compare-queue-length", type=int, default=100, help="queue length of the last round's level"
    )
    args = p.parse_args()
    say = lambda line: print(line, file=sys.stderr)  # noqa: E731
    say(f"rendering the kube_apiserver role over the {args.stack} plan")
    rendered, limits, shares = role_inputs(args.stack)
    reads = max(1, limits["kube_apiserver_max_requests_inflight"] // args.scale)
    writes = max(1, limits["kube_apiserver_max_mutating_requests_inflight"] // args.scale)
    total = reads + writes
    every = {**kube.APF_BUILTIN_SHARES, flowcontrol.LEVEL: shares}  # the levels once the layer's is in
    seats = {name: math.ceil(total * s / sum(every.values())) for name, s in every.items()}
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        sys.exit("join_flow: needs two CPUs, one for the control plane and one for its clients")
    # the control plane on one core, the clients (the joining kubelets, the steady user, kubectl) on
    # the others: in a cluster they are other machines, and their CPU is not the server's
    server_cpus, client_cpus = {cores[0]}, set(cores[1:])
    level = flowcontrol.NodeJoinFlowArgs(shares=shares)
    compare = flowcontrol.NodeJoinFlowArgs(
        shares=args.compare_shares, queues=args.compare_queues, hand_size=min(6, args.compare_queues),
        queue_length_limit=args.compare_queue_length,
    )  # fmt: skip
    paced = [float(r) for r in args.paced.split(",") if r]
    storms = [args.joins, args.joins, *(math.ceil(r * args.paced_s) for r in paced), args.joins]
    work = Path(tempfile.mkdtemp(prefix="join-flow-"))
    flags = [f"--max-requests-inflight={reads}", f"--max-mutating-requests-inflight={writes}"]
    os.sched_setaffinity(0, server_cpus)  # what the control plane starts with: GOMAXPROCS follows it
    try:
        with apiserver.running(work / "api", say, flags) as api:
            qps = [f"--kube-api-qps={limits['kube_controller_manager_api_qps']}",
                   f"--kube-api-burst={limits['kube_controller_manager_api_burst']}"]  # fmt: skip
            api.start_controller_manager(["csrapproving", "csrsigning"], qps)
            os.sched_setaffinity(0, client_cpus)
            tokens = joins.new_tokens(sum(storms) if args.per_node_tokens else 1)
            say(f"creating {len(tokens)} bootstrap token(s) and the steady client's namespace")
            create(api, joins.bootstrap_objects(rendered, tokens))
            steady_setup(api)

            def next_tokens(n: int) -> list[joins.Token]:
                if not args.per_node_tokens:
                    return tokens * n
                taken = tokens[:n]
                del tokens[:n]
                return taken

            rounds: dict[str, Any] = {}
            use = functools.partial(joins.use_flow_control, functools.partial(apiserver.kubectl, api))
            # (idle round, storm round, what the storm is, the join level applied before, joins a second)
            phases: list[tuple[str, str, str, flowcontrol.NodeJoinFlowArgs | None, float]] = [
                ("idle_builtin", "storm_builtin", "built-in levels only", None, 0.0),
                ("idle_join_level", "storm_join_level", "with superkube-node-join", level, 0.0),
                *(("", f"paced_{r:g}_per_s", f"paced at {r:g} a second", None, r) for r in paced),
                (
                    "idle_compare",
                    "storm_compare",
                    f"the join level at {compare.shares} shares, {compare.queues} queues of {compare.queue_length_limit}",
                    compare,
                    0.0,
                ),
            ]
            for idle, storm, what, apply, rate in phases:
                if apply:
                    use(flowcontrol.manifests(apply))
                if idle:
                    say(f"idle round ({what})")
                    rounds[idle] = idle_round(api, work, idle.replace("_", "-"))
                n = math.ceil(rate * args.paced_s) if rate else args.joins
                say(f"storm of {n} joins, {args.concurrency} at once, {what}")
                rounds[storm] = storm_round(
                    api,
                    work,
                    storm.replace("_", "-"),
                    next_tokens(n),
                    args.concurrency,
                    level_names(api),
                    rate,
                )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    figures: dict[str, Any] = {
        "joins": args.joins,
        "concurrency": args.concurrency,
        "scale": args.scale,
        "tokens": "per node" if args.per_node_tokens else "one for all nodes, as in production",
        "level": dataclasses.asdict(level),
        "compare_level": dataclasses.asdict(compare),
        "max_requests_inflight": reads,
        "max_mutating_requests_inflight": writes,
        "seats": seats,
        "rounds": rounds,
    }
    idle_before = "idle_builtin"
    for name, r in rounds.items():
        if name.startswith("idle_"):
            idle_before = name
        else:
            figures[f"p99_ratio_{name}"] = r["steady"]["p99_ms"] / rounds[idle_before]["p99_ms"]
    RESULTS.write_text(json.dumps(figures, indent=2) + "\n")
    print(f"server limit {reads} + {writes} (the role's / {args.scale}); seats: "
          + ", ".join(f"{k} {v}" for k, v in seats.items()))  # fmt: skip
    print(f"{'round':<18} {'steady p50':>10} {'p99':>8} {'errors':>6} {'joins':>6} {'429s':>6} {'failed':>6} "
          f"{'span s':>7} {'joins/s':>7} {'join p99 s':>10}")  # fmt: skip
    for name, r in rounds.items():
        st = r.get("steady", r)
        line = f"{name:<18} {st['p50_ms']:>8.1f}ms {st['p99_ms']:>6.1f}ms {st['errors']:>6}"
        if "joins" in r:
            line += (f" {r['joined']:>6} {r['throttled_429']:>6} {r['failed']:>6} {r['storm_s']:>7.1f} "
                     f"{r['joins_per_s']:>7.1f} {r['join_p99_s']:>10.1f}")  # fmt: skip
        print(line)
    print("steady p99 / the idle round before: " + ", ".join(
        f"{k.removeprefix('p99_ratio_')} {v:.2f}x" for k, v in figures.items() if k.startswith("p99_ratio_")
    ) + " (target <= 2x)")  # fmt: skip
    for name in [r for r in rounds if r.startswith("storm_")]:
        print(f"{name} classified: {json.dumps(rounds[name]['classified'])}")
        print(f"{name} CPU seconds: " + ", ".join(f"{k} {v:.1f}" for k, v in rounds[name]["cpu_s"].items()))
        print(f"{name} APF: " + json.dumps({k: {m: round(v, 1) for m, v in row.items()}
                                              for k, row in rounds[name]["apf"].items()}))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
