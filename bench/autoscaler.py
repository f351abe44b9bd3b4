"""A scale-up of 1,000 GPU nodes by the real cluster-autoscaler: nodes added per minute with the
flagship's scale-up settings and with upstream defaults, in one run.

Run: .venv/bin/python bench/autoscaler.py [--nodes 1000] [--settings flagship,defaults]
     (about 15 minutes; needs scripts/build_autoscaler.py run once; prints a table; writes
     bench/results/autoscaler.json)

What runs (`superkube.harness.autoscaler`): the pinned etcd and kube-apiserver on loopback; the
controller-manager and the scheduler (scheduler-plugins' kube-scheduler with the gang_scheduler
role's flags, on its default plugins: the pods here are no gang); kwok playing every node;
cluster-autoscaler at the pinned release with the flagship plan's command line, as its own user with
the in-cluster layer's RBAC, its kwok provider standing in for Azure with one node group per GPU
scale set of the plan (their tags: min 0, max 937 or 938, the node template). Four CPU nodes stand
for the CPU pool's minimum (the autoscaler does nothing in a cluster without a ready node).

Each setting gets a fresh API server. `--nodes` worker pods of `superkube job render` on the
flagship (8 GPUs each, team research borrowing shared capacity) are created at once; every one needs
a node of its own. A node that kwok has made Ready gets its preflight taint lifted at once (standing
in for the preflight pod passing). The scale-up is timed from the pods' creation until every pod is
bound. Read afterwards: the autoscaler's own "Scale-up: setting group ... size" lines (its
decisions, microseconds), each node's creationTimestamp, and the autoscaler's refused requests from
the audit log. "Busiest minute" is the most nodes created in any 60 s window.

Production adds what the lab has no part of: the VMs' provisioning, and the join jitter
(`autoscaler_join_jitter_seconds`) before each kubelet registers. `with_jitter_per_min` spreads each
measured decision's nodes evenly over that jitter and reports the busiest minute that would reach the
API servers; `model_per_min` is `superkube.cluster.autoscaling.peak_join_rate_per_second` for the
same settings, times 60.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "src")]

from superkube.agents import preflight  # noqa: E402
from superkube.agents import scale_governor as gov  # noqa: E402
from superkube.cluster import autoscaling, jobs  # noqa: E402
from superkube.harness import apiserver, kwok  # noqa: E402
from superkube.harness import autoscaler as ca_lab  # noqa: E402
from superkube.harness import gang as gang_lab  # noqa: E402
from superkube.plan import checks, layer  # noqa: E402
from superkube.plan import engine as planning  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "autoscaler.json"
NAMESPACE = "research"
CPU_NODES = 4
TIMEOUT_S = 1200.0


def log(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def worker_pods(spec: Any, count: int) -> list[dict[str, Any]]:
    """`count` pods from the worker template of `superkube job render` on the plan."""
    job = jobs.JobSpec(name="scale", namespace=NAMESPACE, image="trainer:lab", command=["mpirun", "train"],
                       workers=count, team="research", borrow=True)  # fmt: skip
    template = jobs.render(job, spec)["spec"]["mpiReplicaSpecs"]["Worker"]["template"]
    return [
        {"apiVersion": "v1", "kind": "Pod",
         "metadata": {**template["metadata"], "name": f"scale-worker-{i}", "namespace": NAMESPACE},
         "spec": template["spec"]}
        for i in range(count)
    ]  # fmt: skip


class Preflight(threading.Thread):
    """On every Ready node, the preflight agent's own pass patch (`preflight.pass_patch`: taint and
    label go, the result is recorded), as the preflight pod sends it when its checks pass: here at once."""

    def __init__(self, api: apiserver.LocalApi) -> None:
        super().__init__(daemon=True)
        from kubernetes import client, config

        self.core = client.CoreV1Api(config.new_client_from_config(str(api.kubeconfig)))
        self.stop = threading.Event()
        self.lifted = 0

    def run(self) -> None:
        try:
            self._run()
        except Exception as exc:  # the server went away: the run it belonged to is over
            log(f"preflight stand-in stopped: {exc.__class__.__name__}")

    def _run(self) -> None:
        from kubernetes.client.exceptions import ApiException

        while not self.stop.wait(0.5):
            for item in self.core.list_node().items:
                node = self.core.api_client.sanitize_for_serialization(item)
                if not preflight.pending(node) or not _ready(node):
                    continue
                try:
                    self.core.patch_node(
                        item.metadata.name, preflight.pass_patch(node, "lab: passed at once")
                    )
                except ApiException as exc:
                    if exc.status != 422:  # 422: the node changed since it was read; next round
                        raise
                    continue
                self.lifted += 1


def _ready(node: dict[str, Any]) -> bool:
    conditions = (node.get("status") or {}).get("conditions") or []
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def busiest_minute(times: Sequence[float]) -> int:
    """The most of `times` (seconds) in any 60 s window."""
    ts = sorted(times)
    best, lo = 0, 0
    for hi, t in enumerate(ts):
        while ts[lo] <= t - 60:
            lo += 1
        best = max(best, hi - lo + 1)
    return best


def with_jitter(decisions: Sequence[tuple[float, int]], jitter_s: float) -> float:
    """The busiest minute of joins if each decision's nodes registered evenly over the next
    `jitter_s` seconds (a whole decision within one second when there is no jitter)."""
    if jitter_s < 1:
        return float(busiest_minute([t for t, n in decisions for _ in range(n)]))
    end = max(t for t, _ in decisions) + jitter_s + 60
    best, step = 0.0, 1.0
    start = min(t for t, _ in decisions)
    x = start
    while x <= end:  # the window [x, x + 60): each decision contributes its overlap's share
        joins = sum(n * max(0.0, min(x + 60, t + jitter_s) - max(x, t)) / jitter_s for t, n in decisions)
        best = max(best, joins)
        x += step
    return round(best, 1)


def run_setting(
    plan: Any, name: str, flags: list[str], nodes: int, work: Path, governed: bool
) -> dict[str, Any]:
    spec = plan.spec
    sets = ca_lab.scale_sets(plan, pool="gpu")
    ceilings = {s.name: s.capacity for s in sets}
    room = gov.budget(spec.safe_join_rate_per_minute)
    # governed, the groups start where the governor starts them (the plan's first max tags, here
    # over the GPU pool's sets alone); without it the max tag is each set's capacity
    start = gov.initial_maxes(ceilings, {}, room, {s.name: s.min for s in sets}) if governed else ceilings
    sets = [dataclasses.replace(s, max=start[s.name]) for s in sets]
    config, sched_flags = gang_lab.scheduler(checks.plan_wiring(plan))
    with (
        apiserver.running(work / name / "api", log) as api,
        gang_lab.scheduling(api, work / name / "sched", gang_lab.default_profile(config), sched_flags, log),
        kwok.running(api.kubeconfig, work / name / "kwok", log),
    ):
        objects = [*layer.objects(plan)["autoscaler"], *ca_lab.provider_objects(sets)]
        apiserver.kubectl(api, "apply", "--server-side", "--field-manager=superkube", "-f", "-",
                          stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": objects}))  # fmt: skip
        gang_lab.register(api, [gang_lab.cpu_node(f"cpu-{i}") for i in range(CPU_NODES)])
        apiserver.kubectl(api, "create", "namespace", NAMESPACE)
        apiserver.kubectl(
            api, "create", "serviceaccount", "default", "-n", NAMESPACE
        )  # no controller makes it
        with ca_lab.running(api, work / name / "ca", flags) as ca:
            gang_lab.wait_for(
                "the autoscaler's lease",
                lambda: gang_lab.leader(api, gov.NAMESPACE, gov.LEASE),
                120,
            )
            preflight = Preflight(api)
            preflight.start()
            # the service's own reader, as its own user with the layer's Role for it (applied above)
            reader = gov.KubeReader(api.client_kubeconfig("scale-governor", autoscaling.GOVERNOR_USER))
            governor = gov.Governor(reader.status, ca_lab.KwokMaxSizes(api), ceilings,
                                    spec.safe_join_rate_per_minute, spec.autoscaler_ok_total_unready_count)  # fmt: skip
            governor.last = {s.name: s.max for s in sets}
            thread = threading.Thread(target=governor.run, daemon=True)
            if governed:
                thread.start()
            created = datetime.now(UTC)
            pods = worker_pods(spec, nodes)
            for i in range(0, nodes, 250):
                apiserver.kubectl(api, "create", "-f", "-",
                                  stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": pods[i:i + 250]}))  # fmt: skip
            log(f"{name}: {nodes} pods created")
            deadline, bound, last = time.monotonic() + TIMEOUT_S, 0, -1
            while time.monotonic() < deadline:
                out = apiserver.kubectl(api, "get", "pods", "-n", NAMESPACE, "-o",
                                        "jsonpath={range .items[*]}{.spec.nodeName}{'\\n'}{end}")  # fmt: skip
                bound = sum(1 for line in out.splitlines() if line.strip())
                if bound != last:
                    log(f"{name}: {bound}/{nodes} bound, {preflight.lifted} preflight taints lifted")
                    last = bound
                if bound == nodes or not ca.alive():
                    break
                time.sleep(2)
            done = datetime.now(UTC)
            preflight.stop.set()
            governor.stop.set()
            (work / name / "status.yaml").write_text(reader.status() or "")
            decisions = ca_lab.scale_ups(ca.log(), created.year)
            refused = [r for r in api.requests(autoscaling.USER) if r["code"] == 403]
            dead = "" if ca.alive() else ca.log().strip().splitlines()[-3:]
            # before it stops: the kwok provider deletes its node groups' nodes on the way out
            items = json.loads(apiserver.kubectl(api, "get", "nodes", "-o", "json"))["items"]
    made = [
        (
            datetime.fromisoformat(n["metadata"]["creationTimestamp"].replace("Z", "+00:00")) - created
        ).total_seconds()
        for n in items
        if ca_lab.GROUP_ANNOTATION in n["metadata"].get("annotations", {})
    ]
    steps = [((d.at - created).total_seconds(), d.new - d.old) for d in decisions]
    groups = [d.group for d in decisions]
    per_scaleup = int(_flag(flags, "max-nodes-per-scaleup", "1000"))
    scan = float(_flag(flags, "scan-interval", "10s").rstrip("s"))
    jitter = spec.autoscaler_join_jitter_seconds
    return {
        "setting": name,
        "flags": {ca_lab.flag_name(f): f.partition("=")[2] for f in flags if ca_lab.flag_name(f) in ca_lab.TUNED},
        "pods": nodes,
        "bound": bound,
        "seconds_to_all_bound": round((done - created).total_seconds(), 1) if bound == nodes else None,
        "nodes_created": len(made),
        "first_node_s": round(min(made), 1) if made else None,
        "last_node_s": round(max(made), 1) if made else None,
        "busiest_minute_nodes": busiest_minute(made),
        "per_minute": _per_minute(made),
        "scale_ups": len(decisions),
        "decisions": [{"s": round(t, 2), "group": g, "nodes": n} for (t, n), g in zip(steps, groups, strict=True)],
        "decided_busiest_minute": busiest_minute([t for t, n in steps for _ in range(n)]),
        "safe_join_rate_per_minute": spec.safe_join_rate_per_minute,
        # the model without jitter: a batch of max-nodes-per-scaleup every scan interval
        "model_per_min": min(nodes, per_scaleup * max(1, int(60 // scan))),
        "model_with_jitter_per_min": round(60 * autoscaling.peak_join_rate_per_second(nodes, per_scaleup, scan, jitter), 1),
        "with_jitter_per_min": with_jitter(steps, jitter) if steps else 0.0,
        "jitter_s": jitter,
        "governed": governed,
        "governor_room_per_refresh": room if governed else None,
        "governor_writes": sum(1 for r in governor.rounds if r.changed),
        "governor_held_rounds": sum(r.held for r in governor.rounds),
        "refused_requests": refused[:20],
        "autoscaler_died": dead,
    }  # fmt: skip


def _flag(flags: Sequence[str], name: str, default: str) -> str:
    return next((f.partition("=")[2] for f in flags if ca_lab.flag_name(f) == name), default)


def _per_minute(times: Sequence[float]) -> list[int]:
    if not times:
        return []
    out = [0] * (int(max(times) // 60) + 1)
    for t in times:
        out[max(0, int(t // 60))] += 1
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--nodes", type=int, default=1000)
    p.add_argument("--settings", default="flagship,defaults,governed")
    p.add_argument("--keep", action="store_true", help="keep the runs' folders (logs) and say where")
    args = p.parse_args()
    ca_lab.binary()  # says how to build it, before anything starts
    plan = planning.run(ROOT, "flagship")
    flags = autoscaling.flags(plan.spec, plan.cluster)
    settings = {"flagship": flags, "defaults": ca_lab.upstream_defaults(flags), "governed": flags}
    work = Path(tempfile.mkdtemp(prefix="autoscaler-bench-"))
    rows = []
    try:
        for name in args.settings.split(","):
            rows.append(
                run_setting(plan, name, settings[name], args.nodes, work, governed=name == "governed")
            )
            log(json.dumps({k: v for k, v in rows[-1].items() if k not in ("decisions", "per_minute")}))
    finally:
        if args.keep:
            log(f"logs kept in {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    RESULTS.write_text(
        json.dumps({"machine": "2 cores", "version": autoscaling.VERSION, "runs": rows}, indent=2) + "\n"
    )
    print(f"{'setting':>9} {'to all bound s':>15} {'scale-ups':>9} {'busiest min':>11} {'model':>6} "
          f"{'safe':>5} {'w/ jitter':>9} {'model w/ jitter':>15}")  # fmt: skip
    for r in rows:
        print(f"{r['setting']:>9} {r['seconds_to_all_bound'] or 'unfinished':>15} {r['scale_ups']:>9} "
              f"{r['busiest_minute_nodes']:>11} {r['model_per_min']:>6} {r['safe_join_rate_per_minute']:>5} "
              f"{r['with_jitter_per_min']:>9} {r['model_with_jitter_per_min']:>15}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
