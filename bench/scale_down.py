"""The real cluster-autoscaler's scale-down on the GPU pool with the in-cluster layer's balloons
running: is a cordoned empty node removed, and when; a cordoned node with a pod under a
PodDisruptionBudget; do balloons keep an idle pool's nodes; and a job preempting them.

Run: .venv/bin/python bench/scale_down.py [--watch-minutes 15] [--keep]
     (about 17 minutes; needs scripts/build_autoscaler.py run once; prints a table; writes
     bench/results/scale_down.json)

What runs is bench/autoscaler.py's (`superkube.harness.autoscaler`): the pinned API server, the
controller-manager, the scheduler with the gang_scheduler role's flags on its default plugins, kwok
playing every node, and cluster-autoscaler at the pinned release with the flagship plan's command line
(`autoscaling.flags`) as its own user with the layer's RBAC, its kwok provider in Azure's place. Here:
one node group, the plan's first GPU scale set with its node template, min 0 and max `GROUP_MAX`; two
CPU nodes; the controller-manager also runs the Deployment, ReplicaSet and disruption controllers
(`gang.WORKLOAD_CONTROLLERS`). Applied from the plan: the foundation's namespace and PriorityClasses,
the autoscaler's RBAC, and the GPU pool's balloon Deployment as the layer makes it, at `BALLOONS`
replicas (the pool's size in production). The autoscaler's flags get `--v=4`, which changes only
what it logs: the lines that say why it does or does not remove a node. The timers the plan leaves
at the release's defaults are read from the binary's own --help.

In turn, on one cluster:
1. Balloons: the Deployment is created; the autoscaler adds their nodes (a node that kwok has made
   Ready has its preflight taint lifted at once, as bench/autoscaler.py does). Creation to each bound.
2. Preemption: `WORKERS` worker pods of `superkube job render` on the flagship (8 GPUs each, priority
   0 from the layer's default class) are created at once, each needing a node a balloon holds.
   Creation to each bound (the scheduler's Scheduled events); the balloons' Preempted events; their
   replacements seen Pending; the scale-ups after; the time until every balloon is bound again.
3. Scale-down: the job ends (its pods deleted): its nodes are empty. A Deployment of one small pod
   (2 CPUs) with a PodDisruptionBudget of maxUnavailable 0 is placed on one of them. Then, as the
   health controller treats a node it found fatal, `node_health.cordon_patch` cordons one empty node,
   the budget's node and one balloon node, and their drain evicts what `node_health.evictable` picks
   (the budget refuses its pod; the balloon is not picked: health's drain leaves superkube-system
   alone). One empty node and the other balloon nodes are left as they are. For `--watch-minutes`:
   each node removed or not, when (after the cordon, which follows the emptying by a second or two),
   and the autoscaler's own log lines about it (their times: seconds after the emptying).

Production adds: Azure's provider, whose deletion of a VM takes minutes where kwok's provider deletes
the Node at once (the decision, read from the log, comes at the same time); and the VMs' own
provisioning before the displaced balloons' new nodes join (here they are Ready within a second).
"""

from __future__ import annotations

import argparse
import copy
import json
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Iterable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "src")]

from bench.autoscaler import Preflight, worker_pods  # noqa: E402
from superkube.agents import kubeapi  # noqa: E402
from superkube.agents import node_health as health  # noqa: E402
from superkube.agents import scale_governor as gov  # noqa: E402
from superkube.cluster import autoscaling  # noqa: E402
from superkube.harness import apiserver, kwok  # noqa: E402
from superkube.harness import autoscaler as ca_lab  # noqa: E402
from superkube.harness import gang as gang_lab  # noqa: E402
from superkube.plan import checks, layer  # noqa: E402
from superkube.plan import engine as planning  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "scale_down.json"
GROUP_MAX, BALLOONS, WORKERS, CPU_NODES = 6, 3, 3, 2
JOB_NS, JOB = "research", "scale"  # bench/autoscaler.py's worker pods: scale-worker-<i>
BALLOON = "balloon-gpu"
BALLOON_NS = "superkube-system"
GUARDED = "guarded"
VERBOSITY = "--v=4"
WAIT_S = 600.0
TIMERS = (
    "scale-down-enabled",
    "scale-down-unneeded-time",
    "scale-down-delay-after-add",
    "scale-down-delay-after-delete",
    "scale-down-utilization-threshold",
    "scale-down-gpu-utilization-threshold",
    "unremovable-node-recheck-timeout",
    "expendable-pods-priority-cutoff",
    "new-pod-scale-up-delay",
    "max-scale-down-parallelism",
)
"""The flags that decide scale-down and the balloons' fate: the plan's value, else the release's default."""
ABOUT_A_NODE = ("unremovable", "cannot be removed", "not suitable for removal", "may be removed", "unneeded",
                "Scale-down:", "from delete consideration", "Skipping")  # fmt: skip
UNREMOVABLE = ("NoReason", "ScaleDownDisabledAnnotation", "ScaleDownUnreadyDisabled", "NotAutoscaled",
               "NotUnneededLongEnough", "NotUnreadyLongEnough", "NodeGroupMinSizeReached",
               "NodeGroupMaxDeletionCountReached", "AtomicScaleDownFailed", "MinimalResourceLimitExceeded",
               "CurrentlyBeingDeleted", "NotUnderutilized", "NotUnneededOtherReason", "RecentlyUnremovable",
               "NoPlaceToMovePods", "BlockedByPod", "UnexpectedError", "NoNodeInfo")  # fmt: skip
"""The release's `simulator.UnremovableReason`s in order: its metrics label a reason by its number."""
_KLOG = re.compile(r"^[IWE](\d{2})(\d{2}) (\d{2}:\d{2}:\d{2}\.\d{6})\s+\d+ \S+\] (.*)$")


def log(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def now() -> datetime:
    return datetime.now(UTC)


def since(start: datetime, at: datetime | None) -> float | None:
    return None if at is None else round((at - start).total_seconds(), 1)


def parse_time(value: str) -> datetime:
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


def defaults(binary: Path, flags: Sequence[str]) -> dict[str, str]:
    """Each of `TIMERS` as it runs: the plan's value, else the default the binary's --help states."""
    helped = subprocess.run([str(binary), "--help"], capture_output=True, text=True, timeout=60)
    text = helped.stdout + helped.stderr
    out = {}
    for name in TIMERS:
        given = [f.partition("=")[2] for f in flags if ca_lab.flag_name(f) == name]
        m = re.search(rf"--{re.escape(name)}(?: \S+)? .*?\(default ([^)]*)\)", text)
        out[name] = given[0] if given else (m.group(1) if m else "?")
    return out


def klog_lines(text: str, year: int) -> Iterable[tuple[datetime, str]]:
    for line in text.splitlines():
        m = _KLOG.match(line.rstrip())
        if m:
            month, day, clock, message = m.groups()
            at = datetime.strptime(f"{year}-{month}-{day} {clock}", "%Y-%m-%d %H:%M:%S.%f")
            yield at.replace(tzinfo=UTC), message


def about(text: str, year: int, node: str, start: datetime) -> list[dict[str, Any]]:
    """What the autoscaler logged about `node` from `start` on: each kind of line (numbers aside) once,
    its last wording (and its first, where that differs), how often, first and last (seconds after
    `start`)."""
    kinds: dict[str, dict[str, Any]] = {}
    for at, message in klog_lines(text, year):
        if (
            at < start
            or node not in message
            or message.startswith("Event(")
            or not any(k in message for k in ABOUT_A_NODE)
        ):
            continue
        key = re.sub(r"\d+(\.\d+)?", "#", message.replace(node, "NODE"))
        kind = kinds.setdefault(key, {"first_line": message[:400], "count": 0, "first_s": since(start, at)})
        kind.update(line=message[:400], count=kind["count"] + 1, last_s=since(start, at))
    for kind in kinds.values():  # the first wording only where it differs from the last
        if kind["first_line"] == kind["line"]:
            del kind["first_line"]
    return sorted(kinds.values(), key=lambda k: k["first_s"])


def matching(text: str, year: int, start: datetime, *words: str) -> list[dict[str, Any]]:
    """The log's lines from `start` on holding one of `words`: each wording (numbers aside) once, with
    when it first came and how often."""
    seen: dict[str, dict[str, Any]] = {}
    for at, message in klog_lines(text, year):
        if at >= start and any(w in message for w in words):
            key = re.sub(r"\d+(\.\d+)?", "#", message)
            seen.setdefault(key, {"line": message[:400], "first_s": since(start, at), "count": 0})[
                "count"
            ] += 1
    return list(seen.values())


def cooldown(text: str, year: int, start: datetime) -> list[dict[str, Any]]:
    """When the autoscaler's scale-down cooldown turned on or off, from its "Scale down status" lines."""
    out: list[dict[str, Any]] = []
    for at, message in klog_lines(text, year):
        m = re.search(r"lastScaleUpTime=(\S+ \S+) .*scaleDownInCooldown=(true|false)", message)
        if m and at >= start and (not out or out[-1]["in_cooldown"] != (m.group(2) == "true")):
            out.append(
                {"s": since(start, at), "in_cooldown": m.group(2) == "true", "last_scale_up": m.group(1)}
            )
    return out


class Nodes(threading.Thread):
    """The GPU nodes, polled every second: when each was first and last seen, and when each first
    carried the autoscaler's ToBeDeleted taint."""

    def __init__(self, kube: kubeapi.Kube) -> None:
        super().__init__(daemon=True)
        self.kube = kube
        self.stop = threading.Event()
        self.created: dict[str, datetime] = {}
        self.gone: dict[str, datetime] = {}
        self.tainted: dict[str, datetime] = {}

    def run(self) -> None:
        while not self.stop.wait(1.0):
            try:
                nodes = self.kube.nodes("superkube.io/pool=gpu")
            except Exception as exc:  # the server went away: the run is over
                log(f"node watch stopped: {exc.__class__.__name__}")
                return
            at, names = now(), set()
            for n in nodes:
                name = n["metadata"]["name"]
                names.add(name)
                self.created.setdefault(name, parse_time(n["metadata"]["creationTimestamp"]))
                taints = (n.get("spec") or {}).get("taints") or []
                if any(t["key"] == "ToBeDeletedByClusterAutoscaler" for t in taints):
                    self.tainted.setdefault(name, at)
            for name in self.created:
                if name not in names:
                    self.gone.setdefault(name, at)


class Run:
    def __init__(self, api: apiserver.LocalApi, ca: ca_lab.Autoscaler, year: int) -> None:
        self.api, self.ca, self.year = api, ca, year
        self.kube = kubeapi.Kube(str(api.kubeconfig))

    def kubectl(self, *args: str, stdin: Any = None) -> str:
        return apiserver.kubectl(self.api, *args, stdin=None if stdin is None else json.dumps(stdin))

    def create(self, objects: Sequence[dict[str, Any]]) -> None:
        self.kubectl("create", "-f", "-", stdin={"apiVersion": "v1", "kind": "List", "items": list(objects)})

    def pods(self, namespace: str, selector: str) -> list[dict[str, Any]]:
        items = self.kube.core.list_namespaced_pod(namespace, label_selector=selector).items
        return [self.kube.api.sanitize_for_serialization(p) for p in items]

    def bound(self, namespace: str, selector: str) -> dict[str, str]:
        """pod -> node, of the pods not being deleted that are bound."""
        return {p["metadata"]["name"]: p["spec"]["nodeName"] for p in self.pods(namespace, selector)
                if p["spec"].get("nodeName") and not p["metadata"].get("deletionTimestamp")}  # fmt: skip

    def events(self, namespace: str, reason: str) -> list[dict[str, Any]]:
        out = json.loads(self.kubectl("get", "events.events.k8s.io", "-n", namespace, "-o", "json"))["items"]
        return [e for e in out if e.get("reason") == reason]

    def scheduled(self, namespace: str) -> dict[str, datetime]:
        """pod -> when the scheduler bound it (its Scheduled event, microseconds)."""
        return {
            e["regarding"]["name"]: parse_time(e["eventTime"]) for e in self.events(namespace, "Scheduled")
        }

    def wait(self, what: str, check: Callable[[], Any], timeout: float = WAIT_S) -> Any:
        def alive_and(check: Callable[[], Any]) -> Any:
            if not self.ca.alive():
                raise SystemExit(f"cluster-autoscaler exited: {self.ca.log().strip().splitlines()[-3:]}")
            return check()

        return gang_lab.wait_for(what, lambda: alive_and(check), timeout, every=1.0)

    def scale_ups(self, start: datetime) -> list[dict[str, Any]]:
        return [{"s": since(start, d.at), "group": d.group, "from": d.old, "to": d.new}
                for d in ca_lab.scale_ups(self.ca.log(), self.year) if d.at >= start]  # fmt: skip


def balloons(r: Run, plan: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """Phase 1: the GPU pool's balloon Deployment at `BALLOONS` replicas; the nodes it makes the
    autoscaler add."""
    (deployment,) = [
        copy.deepcopy(o) for o in layer.objects(plan)["balloons"] if o["metadata"]["name"] == BALLOON
    ]
    deployment["spec"]["replicas"] = BALLOONS
    start = now()
    r.create([deployment])
    log(f"balloons: {BALLOON} created with {BALLOONS} replicas")
    selector = f"app.kubernetes.io/name={BALLOON}"
    r.wait("every balloon bound", lambda: len(r.bound(BALLOON_NS, selector)) == BALLOONS)
    when = r.scheduled(BALLOON_NS)
    held = r.bound(BALLOON_NS, selector)
    log(f"balloons: bound on {sorted(held.values())}")
    return deployment, {
        "replicas": BALLOONS,
        "priority_class": deployment["spec"]["template"]["spec"]["priorityClassName"],
        "requests": deployment["spec"]["template"]["spec"]["containers"][0]["resources"]["requests"],
        "scale_ups": r.scale_ups(start),
        "bound_s": sorted(since(start, when.get(p)) or 0.0 for p in held),
        "nodes": sorted(held.values()),
        # a pod below the cutoff would be "Ignoring in scale up" instead
        "autoscaler_on_balloons": matching(
            r.ca.log(), r.year, start, "is unschedulable", "Ignoring in scale up"
        ),
    }


def preempt(r: Run, plan: Any) -> tuple[dict[str, str], dict[str, Any]]:
    """Phase 2: the job's worker pods, each needing a balloon's node."""
    selector = f"app.kubernetes.io/name={BALLOON}"
    before = r.bound(BALLOON_NS, selector)
    pods = worker_pods(plan.spec, WORKERS)
    start = now()
    r.create(pods)
    log(f"preemption: {WORKERS} worker pods created")
    job_selector = f"scheduling.x-k8s.io/pod-group={JOB}"
    most_pending = 0

    def all_bound() -> bool:
        nonlocal most_pending
        balloons_now = [p for p in r.pods(BALLOON_NS, selector) if not p["metadata"].get("deletionTimestamp")]
        most_pending = max(most_pending, sum(1 for p in balloons_now if not p["spec"].get("nodeName")))
        return len(r.bound(JOB_NS, job_selector)) == WORKERS

    r.wait("every worker bound", all_bound)
    jobs_bound = now()
    placed = r.bound(JOB_NS, job_selector)
    log(f"preemption: workers bound on {sorted(placed.values())}")
    r.wait(
        "every balloon bound again", lambda: all_bound() and len(r.bound(BALLOON_NS, selector)) == BALLOONS
    )
    when = r.scheduled(JOB_NS)
    again = r.bound(BALLOON_NS, selector)
    balloon_when = r.scheduled(BALLOON_NS)
    replaced = {p: n for p, n in again.items() if p not in before}
    preempted = [
        {"pod": e["regarding"]["name"], "s": since(start, parse_time(e.get("eventTime") or e["deprecatedLastTimestamp"])),
         "note": e.get("note", "")}
        for e in r.events(BALLOON_NS, "Preempted")
    ]  # fmt: skip
    log(f"preemption: {len(preempted)} balloons preempted; balloons bound again on {sorted(again.values())}")
    return (
        placed,
        {
            "workers": WORKERS,
            "worker_priority": r.pods(JOB_NS, job_selector)[0]["spec"].get("priority"),
            "bound_s": {p: since(start, when.get(p)) for p in sorted(placed)},
            "on_balloon_nodes": set(placed.values()) <= set(before.values()),
            "preempted": preempted,
            "replacements_pending_at_most": most_pending,
            "replacements": {
                p: {"node": n, "bound_s": since(start, balloon_when.get(p))}
                for p, n in sorted(replaced.items())
            },
            "scale_ups": r.scale_ups(start),
            "all_workers_bound_s": since(start, jobs_bound),
            "autoscaler_on_pods": matching(
                r.ca.log(), r.year, start, "is unschedulable", "Ignoring in scale up"
            ),
        },
    )


def guarded(job_nodes: Sequence[str]) -> list[dict[str, Any]]:
    """One small pod (2 CPUs: no room beside a balloon) under a budget that allows no disruption,
    preferring the job's middle node."""
    labels = {"app": GUARDED}
    affinity = {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
        {"weight": 100, "preference": {"matchFields": [
            {"key": "metadata.name", "operator": "In", "values": [job_nodes[len(job_nodes) // 2]]}]}}]}}  # fmt: skip
    return [
        {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": GUARDED, "namespace": JOB_NS},
         "spec": {"replicas": 1, "selector": {"matchLabels": labels},
                  "template": {"metadata": {"labels": labels},
                               "spec": {"nodeSelector": {"superkube.io/pool": "gpu"}, "affinity": affinity,
                                        "tolerations": [{"key": "superkube.io/team", "operator": "Exists",
                                                         "effect": "NoSchedule"}],
                                        "automountServiceAccountToken": False,
                                        "containers": [{"name": "server", "image": "server:lab",
                                                        "resources": {"requests": {"cpu": "2", "memory": "4Gi"}}}]}}}},
        {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": GUARDED, "namespace": JOB_NS},
         "spec": {"maxUnavailable": 0, "selector": {"matchLabels": labels}}},
    ]  # fmt: skip


def scale_down(r: Run, nodes: Nodes, job: dict[str, str], watch_s: float) -> dict[str, Any]:
    """Phase 3: the job ends, a budget's pod takes one of its nodes, three nodes are cordoned and
    drained as the health controller does, and what the autoscaler removes is watched."""
    job_nodes = sorted(set(job.values()))
    r.kubectl("delete", "pods", "-n", JOB_NS, "-l", f"scheduling.x-k8s.io/pod-group={JOB}", "--wait=true")
    emptied = now()
    log(f"scale-down: the job's pods are gone; {job_nodes} empty")
    r.create(guarded(job_nodes))
    (g_node,) = r.wait("the budget's pod bound", lambda: list(r.bound(JOB_NS, f"app={GUARDED}").values()))

    def budget() -> dict[str, Any] | None:
        status = json.loads(r.kubectl("get", "pdb", GUARDED, "-n", JOB_NS, "-o", "json")).get("status") or {}
        return status if status.get("expectedPods") == 1 else None

    pdb = r.wait("the budget's status", budget)
    empty_cordoned, empty_left = [n for n in job_nodes if n != g_node][:2]
    balloon_nodes = sorted(set(r.bound(BALLOON_NS, f"app.kubernetes.io/name={BALLOON}").values()))
    balloon_cordoned = balloon_nodes[0]
    roles = {
        empty_cordoned: "empty, cordoned",
        empty_left: "empty, not cordoned",
        g_node: "cordoned, a pod under a budget of maxUnavailable 0",
        balloon_cordoned: "cordoned, its balloon left on it",
        **{n: "a balloon on it (idle pool)" for n in balloon_nodes[1:]},
    }
    cordoned_at = now()
    drained = []
    for name in (empty_cordoned, g_node, balloon_cordoned):
        r.kube.patch_node(name, health.cordon_patch("lab: a fatal finding", cordoned_at))
    for name in (empty_cordoned, g_node, balloon_cordoned):
        pods = r.kube.pods_on(name)
        picked = health.evictable(pods)
        for ref in picked:
            done = "evicted" if r.kube.evict(ref) else "refused: a disruption budget (429)"
            drained.append({"node": name, "pod": f"{ref.namespace}/{ref.name}", "drain": done})
        left = {f"{p['metadata']['namespace']}/{p['metadata']['name']}" for p in pods}
        left -= {f"{x.namespace}/{x.name}" for x in picked}
        drained += [{"node": name, "pod": p, "drain": "left: not evictable"} for p in sorted(left)]
    log(f"scale-down: cordoned {empty_cordoned}, {g_node}, {balloon_cordoned}; drain: {drained}")
    log(f"scale-down: watching for {watch_s / 60:.0f} minutes")
    deadline = time.monotonic() + watch_s
    while time.monotonic() < deadline:
        if not r.ca.alive():
            raise SystemExit(f"cluster-autoscaler exited: {r.ca.log().strip().splitlines()[-3:]}")
        time.sleep(5)
    text = r.ca.log()
    ups = ca_lab.scale_ups(text, r.year)
    removals = {m.group(1): at for at, message in klog_lines(text, r.year)
                if (m := re.search(r"Scale-down: removing (?:empty )?node \"?([^\s\",]+)", message))}  # fmt: skip
    out = {}
    for name, role in roles.items():
        out[name] = {
            "role": role,
            "removed": name in nodes.gone,
            "decided_s_after_cordon": since(cordoned_at, removals.get(name)),
            "gone_s_after_cordon": since(cordoned_at, nodes.gone.get(name)),
            "gone_s_after_empty": since(emptied, nodes.gone.get(name)) if name in job_nodes else None,
            "to_be_deleted_taint_s_after_cordon": since(cordoned_at, nodes.tainted.get(name)),
            "node_age_at_cordon_s": since(nodes.created[name], cordoned_at),
            "autoscaler_said": about(text, r.year, name, emptied),
        }
    return {
        "emptied_s_before_cordon": since(emptied, cordoned_at),
        "budget_status": {k: pdb.get(k) for k in ("currentHealthy", "desiredHealthy", "disruptionsAllowed", "expectedPods")},
        "drain": drained,
        "watched_s": round(watch_s),
        "last_scale_up_s_before_cordon": since(ups[-1].at, cordoned_at) if ups else None,
        "added_during_watch": sorted(n for n, at in nodes.created.items() if at > cordoned_at),
        "gpu_nodes_at_end": sorted(set(nodes.created) - set(nodes.gone)),
        "nodes": out,
        "cooldown": cooldown(text, r.year, emptied),
    }  # fmt: skip


def metrics(ca: ca_lab.Autoscaler) -> list[str]:
    wanted = ("cluster_autoscaler_unneeded_nodes_count", "cluster_autoscaler_unremovable_nodes_count",
              "cluster_autoscaler_nodes_count", "cluster_autoscaler_scaled_down_nodes_total")  # fmt: skip
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{ca.metrics_port}/metrics", timeout=10) as resp:
            text = resp.read().decode()
    except OSError as exc:
        return [f"unread: {exc}"]
    named = lambda m: f'reason="{UNREMOVABLE[int(m.group(1))]}"'  # noqa: E731
    return [re.sub(r'reason="(\d+)"', named, line) for line in text.splitlines() if line.startswith(wanted)]


def run(plan: Any, flags: list[str], work: Path, watch_s: float) -> dict[str, Any]:
    sets = ca_lab.scale_sets(plan, pool="gpu")[:1]
    sets = [ca_lab.ScaleSet(s.name, 0, GROUP_MAX, s.labels, s.taints, s.resources, GROUP_MAX) for s in sets]
    objects = layer.objects(plan)
    config, sched_flags = gang_lab.scheduler(checks.plan_wiring(plan))
    controllers = (*gang_lab.CONTROLLER_MANAGER, *gang_lab.WORKLOAD_CONTROLLERS)
    with (
        apiserver.running(work / "api", log) as api,
        gang_lab.scheduling(api, work / "sched", gang_lab.default_profile(config), sched_flags, log, controllers),
        kwok.running(api.kubeconfig, work / "kwok", log),
    ):  # fmt: skip
        applied = [*objects["foundation"], *objects["autoscaler"], *ca_lab.provider_objects(sets)]
        apiserver.kubectl(api, "apply", "--server-side", "--field-manager=superkube", "-f", "-",
                          stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": applied}))  # fmt: skip
        gang_lab.register(api, [gang_lab.cpu_node(f"cpu-{i}") for i in range(CPU_NODES)])
        apiserver.kubectl(api, "create", "namespace", JOB_NS)
        for ns in (JOB_NS, BALLOON_NS):  # no controller makes them
            apiserver.kubectl(api, "create", "serviceaccount", "default", "-n", ns)
        with ca_lab.running(api, work / "ca", flags) as ca:
            gang_lab.wait_for(
                "the autoscaler's lease", lambda: gang_lab.leader(api, gov.NAMESPACE, gov.LEASE), 120
            )
            r = Run(api, ca, now().year)
            preflight = Preflight(api)
            preflight.start()
            nodes = Nodes(r.kube)
            nodes.start()
            try:
                _, filled = balloons(r, plan)
                job, preempted = preempt(r, plan)
                down = scale_down(r, nodes, job, watch_s)
            finally:
                preflight.stop.set()
                nodes.stop.set()
            seen = metrics(ca)
            (work / "cluster-autoscaler.log").write_text(ca.log())
    classes = {
        o["metadata"]["name"]: o["value"] for o in objects["foundation"] if o["kind"] == "PriorityClass"
    }
    return {"priority_classes": classes, "balloons": filled, "preemption": preempted, "scale_down": down,
            "metrics_at_end": seen}  # fmt: skip


def main() -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--watch-minutes", type=float, default=15.0,
                   help="how long to watch after the cordon (past the unneeded time, 10 min by default)")  # fmt: skip
    p.add_argument("--keep", action="store_true", help="keep the run's folder (logs) and say where")
    args = p.parse_args()
    binary = ca_lab.binary()  # says how to build it, before anything starts
    started = time.monotonic()
    plan = planning.run(ROOT, "flagship")
    flags = [*autoscaling.flags(plan.spec, plan.cluster), VERBOSITY]
    timers = defaults(binary, flags)
    work = Path(tempfile.mkdtemp(prefix="scale-down-bench-"))
    try:
        result = run(plan, flags, work, args.watch_minutes * 60)
    finally:
        if args.keep:
            log(f"logs kept in {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    doc = {
        "machine": "2 cores",
        "version": autoscaling.VERSION,
        "built_from": f"kubernetes/autoscaler tag cluster-autoscaler-{autoscaling.VERSION}",
        "flags": flags,
        "lab_provider": "kwok (--cloud-provider=kwok, no auto-discovery): superkube.harness.autoscaler",
        "in_effect": timers,
        "node_group": {"min": 0, "max": GROUP_MAX},
        **result,
        "wall_s": round(time.monotonic() - started),
    }
    RESULTS.write_text(json.dumps(doc, indent=2) + "\n")
    b, q, d = result["balloons"], result["preemption"], result["scale_down"]
    print(f"in effect: {', '.join(f'{k}={v}' for k, v in timers.items())}")
    print(f"balloons ({b['priority_class']} {result['priority_classes'][b['priority_class']]}): "
          f"{len(b['scale_ups'])} scale-ups, bound after {b['bound_s']} s")  # fmt: skip
    print(f"job ({WORKERS} workers, priority {q['worker_priority']}): bound after "
          f"{sorted(q['bound_s'].values())} s on the balloons' nodes: {q['on_balloon_nodes']}; "
          f"{len(q['preempted'])} balloons preempted, up to {q['replacements_pending_at_most']} Pending, "
          f"scale-ups {[(s['s'], s['to']) for s in q['scale_ups']]}, rebound after "
          f"{sorted(v['bound_s'] or -1 for v in q['replacements'].values())} s")  # fmt: skip
    print(f"{'node':>26} {'role':>52} {'removed':>7} {'decided s':>9} {'gone s':>7}  last reason")
    for name, n in d["nodes"].items():
        said = (
            max(n["autoscaler_said"], key=lambda k: (k["last_s"], k["first_s"]))["line"]
            if n["autoscaler_said"]
            else ""
        )
        print(f"{name:>26} {n['role']:>52} {n['removed']!s:>7} {n['decided_s_after_cordon'] or '-':>9} "
              f"{n['gone_s_after_cordon'] or '-':>7}  {said[:120]}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
