"""A join storm against the real API server, with and without the superkube-node-join priority level.

Run: .venv/bin/python bench/join_flow.py [--joins 2000] [--concurrency 200] [--scale 32]
     (about 10 minutes; prints a table; writes bench/results/join_flow.json)

What runs: the pinned etcd and kube-apiserver (`superkube.lab.apiserver`), with the production role's
authentication, authorization and admission, and kube-controller-manager from the same build running
its csrapproving and csrsigning controllers, each as its own service account. The kube_apiserver role's
bootstrap objects (its bootstrap.yaml.j2 as a converge renders it over the flagship's plan) give every
joining identity its own real bootstrap token, the node-bootstrapper role and auto-approval.

A join (`superkube.lab.joins`) is what a kubelet sends on first start: as its token it creates a CSR
and watches it until it is approved and signed; then, as `system:node:<name>` with the issued
certificate, it creates its Node and its Lease. A request answered 429 is retried after Retry-After
and counted. `--concurrency` joins run at once until all `--joins` have run.

Beside the storm a steady client, an ordinary user (its own client certificate, no group of the
built-in schemas, so the built-in `global-default` level, as people and CI tools are) lists the 50 pods
of its namespace and writes a ConfigMap there, back to back, from its own process.

Rounds, in one run: idle (the steady client alone) -> storm with the built-in levels only -> idle ->
the layer's FlowSchemas and PriorityLevelConfiguration applied (`modules.platform.flowcontrol`, the
flagship's shares) -> storm. Each storm's steady p99 is compared with the idle round just before it.

The server's concurrency limit is the role's (--max-requests-inflight 3000 + --max-mutating 1000)
divided by `--scale`: one two-core lab server stands for one of five API-server VMs, and APF divides
the limit by the same shares at any size, so with the limit scaled to the cores the levels' seats bind
as they do in production. The seats each level gets are printed.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "src")]

from modules.platform import flowcontrol  # noqa: E402
from superkube.cluster import kube, wiring  # noqa: E402
from superkube.lab import apiserver, joins  # noqa: E402
from superkube.plan import engine as planning  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "join_flow.json"
NAMESPACE, STEADY_USER, STEADY_PODS = "steady", "steady-user", 50
IDLE_S = 20


def role_inputs(stack: str) -> tuple[list[dict[str, Any]], dict[str, int], int]:
    """The kube_apiserver role's bootstrap objects and in-flight limits over the stack's plan (one
    API-server host's view), the controller-manager role's client rate, and the stack's join-level
    shares."""
    plan = planning.run(ROOT, stack)
    engine = wiring.for_plan(plan)
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
    argv = [sys.executable, "-m", "superkube.lab.joins", "steady", api.url, str(pk / "ca.crt"),
            str(pk / f"{STEADY_USER}.crt"), str(pk / f"{STEADY_USER}.key"), NAMESPACE, str(seconds), str(out)]  # fmt: skip
    return subprocess.Popen(argv, env={"PYTHONPATH": str(ROOT / "src"), "PATH": "/usr/bin:/bin"})


def latencies(out: Path, since: float, until: float) -> dict[str, Any]:
    rows = [json.loads(line) for line in out.read_text().splitlines() if line.strip()]
    window = [r for r in rows if since <= r["t"] <= until]
    ms = sorted(r["ms"] for r in window)
    if not ms:
        return {"requests": 0}
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
    time.sleep(3)
    nodes = [f"{name}-{i:05d}" for i in range(len(tokens))]
    began_wall, began = time.time(), time.monotonic()

    def progress(done: int, total: int) -> None:
        if done % 250 == 0 or done == total:
            print(f"  {name}: {done}/{total} joined, {time.monotonic() - began:.0f} s", file=sys.stderr)

    cpu_before = cpu_by_process(api, steady.pid)
    ca = api.dir / "pki" / "ca.crt"
    results = joins.storm(api.url, ca, tokens, nodes, concurrency, progress, rate)
    ended_wall, span = time.time(), time.monotonic() - began
    cpu = {k: v - cpu_before[k] for k, v in cpu_by_process(api, steady.pid).items()}
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
    }


def cpu_s(pid: int) -> float:
    """CPU seconds (user + system) a process has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cpu_by_process(api: apiserver.LocalApi, steady: int) -> dict[str, float]:
    named = {Path(str(p.args[0])).name: p.pid for p in api.processes}
    return {**{n: cpu_s(pid) for n, pid in named.items()}, "steady client": cpu_s(steady),
            "joins (this process)": cpu_s(os.getpid())}  # fmt: skip


def pin(pid: int, cpus: set[int]) -> None:
    """Every thread of a running process onto `cpus` (threads it starts later inherit it)."""
    for task in Path(f"/proc/{pid}/task").iterdir():
        os.sched_setaffinity(int(task.name), cpus)


def level_names(api: apiserver.LocalApi) -> dict[str, str]:
    items = json.loads(apiserver.kubectl(api, "get", "prioritylevelconfigurations", "-o", "json"))["items"]
    return {i["metadata"]["uid"]: i["metadata"]["name"] for i in items}


def main() -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--joins", type=int, default=2000)
    p.add_argument("--concurrency", type=int, default=200)
    p.add_argument("--scale", type=int, default=32, help="divide the role's in-flight limits by this")
    p.add_argument("--stack", default="flagship")
    p.add_argument("--shares", type=int, help="the join level's shares (default: the stack's)")
    p.add_argument("--queues", type=int, help="the join level's queues (default: the layer's)")
    p.add_argument(
        "--queue-length-limit", type=int, help="the join level's queue length (default: the layer's)"
    )
    p.add_argument("--level-only", action="store_true", help="skip the rounds without the join level")
    p.add_argument(
        "--paced", default="2,10,20,30", help="joins a second of the paced rounds (with the level)"
    )
    p.add_argument("--paced-s", type=float, default=30, help="seconds each paced round sends joins")
    args = p.parse_args()
    say = lambda line: print(line, file=sys.stderr)  # noqa: E731
    say(f"rendering the kube_apiserver role over the {args.stack} plan")
    rendered, limits, shares = role_inputs(args.stack)
    shares = args.shares or shares
    reads = max(1, limits["kube_apiserver_max_requests_inflight"] // args.scale)
    writes = max(1, limits["kube_apiserver_max_mutating_requests_inflight"] // args.scale)
    total = reads + writes
    every = {**kube.APF_BUILTIN_SHARES, flowcontrol.LEVEL: shares}  # the levels once the layer's is in
    seats = {name: math.ceil(total * s / sum(every.values())) for name, s in every.items()}
    # the clients (the joining kubelets, the steady user, kubectl) on the last core, the control plane
    # on the others: in a cluster the joining nodes and the user are other machines, and a client's
    # CPU taken from the server would be counted against APF
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        sys.exit("join_flow: needs two CPUs, one for the control plane and one for its clients")
    server_cpus, client_cpus = set(cores[:-1]), {cores[-1]}
    os.sched_setaffinity(0, client_cpus)
    work = Path(tempfile.mkdtemp(prefix="join-flow-"))
    flags = [f"--max-requests-inflight={reads}", f"--max-mutating-requests-inflight={writes}"]
    with apiserver.running(work / "api", say, flags) as api:
        api.start_controller_manager(
            ["csrapproving", "csrsigning"],
            [
                f"--kube-api-qps={limits['kube_controller_manager_api_qps']}",
                f"--kube-api-burst={limits['kube_controller_manager_api_burst']}",
            ],
        )
        for process in api.processes:
            pin(process.pid, server_cpus)
        paced = [float(r) for r in args.paced.split(",") if r]
        tokens = joins.new_tokens(2 * args.joins + sum(math.ceil(r * args.paced_s) for r in paced))
        say(f"creating {len(tokens)} bootstrap tokens and the steady client's namespace")
        create(api, joins.bootstrap_objects(rendered, tokens))
        steady_setup(api)
        rounds: dict[str, Any] = {}
        if not args.level_only:
            say("idle round (built-in levels only)")
            rounds["idle_builtin"] = idle_round(api, work, "idle-builtin")
            say(f"storm of {args.joins} joins, {args.concurrency} at once, built-in levels only")
            rounds["storm_builtin"] = storm_round(
                api, work, "builtin", tokens[: args.joins], args.concurrency, level_names(api)
            )
        tuned = {"queues": args.queues, "queue_length_limit": args.queue_length_limit}
        level = flowcontrol.NodeJoinFlowArgs(shares=shares, **{k: v for k, v in tuned.items() if v})
        manifests = flowcontrol.manifests(level)
        apiserver.kubectl(
            api,
            "apply",
            "-f",
            "-",
            stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": manifests}),
        )
        time.sleep(2)  # the server's APF controller picks the new objects up
        say("idle round (with superkube-node-join)")
        rounds["idle_join_level"] = idle_round(api, work, "idle-join-level")
        say(f"storm of {args.joins} joins, {args.concurrency} at once, with superkube-node-join")
        rounds["storm_join_level"] = storm_round(
            api, work, "joinlevel", tokens[args.joins : 2 * args.joins], args.concurrency, level_names(api)
        )
        left = tokens[2 * args.joins :]
        for rate in paced:
            n = math.ceil(rate * args.paced_s)
            say(f"paced: {n} joins, {rate:g} a second, with superkube-node-join")
            rounds[f"paced_{rate:g}_per_s"] = storm_round(
                api, work, f"paced{rate:g}", left[:n], args.concurrency, level_names(api), rate
            )
            left = left[n:]
    figures = {
        "joins": args.joins,
        "concurrency": args.concurrency,
        "scale": args.scale,
        "level": dataclasses.asdict(level),
        "max_requests_inflight": reads,
        "max_mutating_requests_inflight": writes,
        "seats": seats,
        "rounds": rounds,
    }
    for name, r in rounds.items():
        if "joins" in r:
            idle = rounds["idle_builtin" if name == "storm_builtin" else "idle_join_level"]
            figures[f"p99_ratio_{name}"] = r["steady"]["p99_ms"] / idle["p99_ms"]
    RESULTS.write_text(json.dumps(figures, indent=2) + "\n")
    print(f"server limit {reads} + {writes} (the role's / {args.scale}); seats: "
          + ", ".join(f"{k} {v}" for k, v in seats.items()))  # fmt: skip
    print(
        f"{'round':<18} {'steady p50':>10} {'p99':>8} {'errors':>6} {'joins':>6} {'429s':>6} {'span s':>7} {'joins/s':>7} {'join p99 s':>10}"
    )
    for name, r in rounds.items():
        s = r.get("steady", r)
        line = f"{name:<18} {s['p50_ms']:>8.1f}ms {s['p99_ms']:>6.1f}ms {s['errors']:>6}"
        if "joins" in r:
            line += f" {r['joined']:>6} {r['throttled_429']:>6} {r['storm_s']:>7.1f} {r['joins_per_s']:>7.1f} {r['join_p99_s']:>10.1f}"
        print(line)
    print("steady p99 under the storm / idle: " + ", ".join(
        f"{k.removeprefix('p99_ratio_')} {v:.2f}x" for k, v in figures.items() if k.startswith("p99_ratio_")
    ) + " (target <= 2x)")  # fmt: skip
    for name in [r for r in rounds if r.startswith("storm_")]:
        print(f"{name} classified: {json.dumps(rounds[name]['classified'])}")
        print(f"{name} CPU seconds: " + ", ".join(f"{k} {v:.1f}" for k, v in rounds[name]["cpu_s"].items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
