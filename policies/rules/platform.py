"""The in-cluster layer: valid objects, balloons that hold nodes safely, pinned and bounded
containers, and an autoscaler that finds exactly the scale sets and joins them at a safe rate."""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterator, Mapping
from typing import Any

from policies.rules.compute import VM, VMSS, _cloud_init_files
from superkube.agents import scale_governor
from superkube.cluster import autoscaling
from superkube.cluster.cloudinit import JOIN_SCRIPT, join_jitter_seconds
from superkube.cluster.kube import APISERVERS
from superkube.model.policy import Finding, PlanResource, Rule, RuleConfig, StackView
from superkube.model.spec import PREFLIGHT_TAINT_KEY

COMPONENT_LABEL = "app.kubernetes.io/component"

# Containers that may run privileged, each with the reason it must. Keyed by
# "<namespace>/<workload name>/<container>"; a workload name ending in "-*" stands for one per pool.
PRIVILEGED_ALLOWED: Mapping[str, str] = {
    "superkube-system/superkube-gpu-reset-*/reset": (
        "resets the node's GPUs (nvidia-smi --gpu-reset needs root and the devices), only on a node the "
        "health controller drained and labelled for it (superkube.agents.gpu_reset)"
    ),
}


def _allowed(key: str) -> bool:
    """`key` ("<namespace>/<workload>/<container>") is on PRIVILEGED_ALLOWED, itself or by its pool's pattern."""
    if key in PRIVILEGED_ALLOWED:
        return True
    namespace, _, rest = key.partition("/")
    workload, _, container = rest.rpartition("/")
    return any(
        pattern.endswith("-*") and workload.startswith(pattern[:-1]) and workload != pattern[:-2]
        for pattern in (
            p.partition("/")[2].rpartition("/")[0]
            for p in PRIVILEGED_ALLOWED
            if p.startswith(f"{namespace}/") and p.endswith(f"/{container}")
        )
    )


WORKLOAD_TEMPLATE = {
    "Deployment": ("spec", "template", "spec"),
    "DaemonSet": ("spec", "template", "spec"),
    "StatefulSet": ("spec", "template", "spec"),
    "ReplicaSet": ("spec", "template", "spec"),
    "Job": ("spec", "template", "spec"),
    "CronJob": ("spec", "jobTemplate", "spec", "template", "spec"),
    "Pod": ("spec",),
}


def _objects(view: StackView) -> list[PlanResource]:
    return [r for r in view.resources if r.type.startswith("kubernetes:")]


def _dig(value: Any, *path: str) -> Any:
    for key in path:
        if not isinstance(value, Mapping):
            return None
        value = value.get(key)
    return value


def _kind(r: PlanResource) -> str:
    return str(r.props.get("kind") or r.type.rsplit(":", 1)[-1])


def _name(r: PlanResource) -> str:
    meta = r.props.get("metadata") or {}
    ns = f"{meta.get('namespace')}/" if meta.get("namespace") else ""
    return f"{ns}{meta.get('name', r.name)}"


def _pod_spec(r: PlanResource) -> Mapping[str, Any] | None:
    path = WORKLOAD_TEMPLATE.get(_kind(r))
    spec = _dig(r.props, *path) if path else None
    return spec if isinstance(spec, Mapping) else None


def _containers(pod: Mapping[str, Any]) -> Iterator[Mapping[str, Any]]:
    for key in ("initContainers", "containers", "ephemeralContainers"):
        for c in pod.get(key) or []:
            if isinstance(c, Mapping):
                yield c


def _workloads(view: StackView) -> Iterator[tuple[PlanResource, Mapping[str, Any]]]:
    for r in _objects(view):
        pod = _pod_spec(r)
        if pod is not None:
            yield r, pod


def _component(r: PlanResource) -> str | None:
    return _dig(r.props, "metadata", "labels", COMPONENT_LABEL)


# --- rules --------------------------------------------------------------------------------------


def _schema_valid(view: StackView, config: RuleConfig) -> Iterator[Finding]:
    from superkube.cluster import render

    for r in _objects(view):
        obj = {"apiVersion": r.props.get("apiVersion"), "kind": _kind(r), **r.props}
        for problem in render.validate(obj, config.kubernetes_version, _component(r) or "objects"):
            yield Finding(str(problem), r.urn)


def _priority_classes(view: StackView) -> dict[str, int]:
    out = {}
    for r in _objects(view):
        if _kind(r) == "PriorityClass" and isinstance(r.props.get("value"), int | float):
            out[str(_dig(r.props, "metadata", "name"))] = int(r.props["value"])
    return out


def _idle_time_classes(view: StackView, cutoff: int) -> set[str]:
    """PriorityClasses below the autoscaler's cutoff that never preempt: what they run waits for idle
    nodes and anything preempts it, balloons too, so it is no real work balloons could stand in the
    way of (the periodic GPU tests')."""
    return {
        str(_dig(r.props, "metadata", "name"))
        for r in _objects(view)
        if _kind(r) == "PriorityClass"
        and isinstance(r.props.get("value"), int | float)
        and r.props["value"] < cutoff
        and r.props.get("preemptionPolicy") == "Never"
    }


def _autoscaler_args(view: StackView, config: RuleConfig) -> tuple[str | None, list[str]] | None:
    """The autoscaler's command line as the inventory hands it to its host service on the API
    servers (None where the stack runs no autoscaler), and the first API-server VM's URN."""
    raw = config.inventory.get("hostvar_expressions", {}).get("superkube_autoscaler_flags")
    args = json.loads(raw) if raw else []
    if not args:
        return None
    hosts = [vm.urn for vm in view.of_type(VM) if vm.tags.get("superkube-role") == APISERVERS]
    return (hosts[0] if hosts else None), [str(a) for a in args]


def _flag(args: list[str], name: str) -> str | None:
    for arg in args:
        key, eq, value = arg.partition("=")
        if key == f"--{name}" and eq:
            return value
    return None


def _balloons(view: StackView) -> Iterator[tuple[PlanResource, Mapping[str, Any]]]:
    for r, pod in _workloads(view):
        if _component(r) == "balloons":
            yield r, pod


def _balloon_priority(view: StackView, config: RuleConfig) -> Iterator[Finding]:
    found = _autoscaler_args(view, config)
    cutoff_text = _flag(found[1], "expendable-pods-priority-cutoff") if found else None
    cutoff = (
        int(cutoff_text)
        if cutoff_text and cutoff_text.lstrip("-").isdigit()
        else autoscaling.EXPENDABLE_CUTOFF
    )
    classes = _priority_classes(view)
    for r, pod in _balloons(view):
        name = pod.get("priorityClassName")
        if name not in classes:
            yield Finding(
                f"balloon {_name(r)} names PriorityClass {name!r}, which the layer does not create", r.urn
            )
            continue
        value = classes[name]
        others = {n: v for n, v in classes.items() if n != name}
        if value < cutoff:
            yield Finding(
                f"balloon priority {value} is below the autoscaler's expendable cutoff {cutoff}: "
                "the autoscaler would neither add nor keep nodes for balloons",
                r.urn,
            )
        idle = _idle_time_classes(view, cutoff)
        lower = {n: v for n, v in others.items() if v <= value and n not in idle}
        if lower:
            yield Finding(
                f"balloon priority {value} is not below every other PriorityClass ({', '.join(sorted(lower))}): "
                "real work at that priority would not preempt balloons",
                r.urn,
            )


def _tolerates_preflight(toleration: Mapping[str, Any]) -> bool:
    key = toleration.get("key") or ""
    operator = toleration.get("operator") or "Equal"
    if not key:
        return operator == "Exists"  # an empty key with Exists tolerates every taint
    return key == PREFLIGHT_TAINT_KEY


def _balloon_preflight(view: StackView, config: RuleConfig) -> Iterator[Finding]:
    for r, pod in _balloons(view):
        for t in pod.get("tolerations") or []:
            if isinstance(t, Mapping) and _tolerates_preflight(t):
                yield Finding(
                    f"balloon {_name(r)} tolerates the preflight taint ({dict(t)}): it would hold untested GPU nodes",
                    r.urn,
                )


def _resources(view: StackView, config: RuleConfig) -> Iterator[Finding]:
    for r, pod in _workloads(view):
        for c in _containers(pod):
            res = c.get("resources") or {}
            requests, limits = res.get("requests") or {}, res.get("limits") or {}
            missing = [f"requests.{k}" for k in ("cpu", "memory") if k not in requests]
            if "memory" not in limits:
                missing.append("limits.memory")
            for key in requests:
                if "/" in key and limits.get(key) != requests[key]:
                    missing.append(f"limits.{key} equal to its request")
            if missing:
                yield Finding(f"{_name(r)} container {c.get('name')!r} lacks {', '.join(missing)}", r.urn)


def _privileged(view: StackView, config: RuleConfig) -> Iterator[Finding]:
    for r, pod in _workloads(view):
        for c in _containers(pod):
            sc = c.get("securityContext") or {}
            added = {str(a).upper() for a in _dig(sc, "capabilities", "add") or []}
            why = []
            if sc.get("privileged") is True:
                why.append("privileged")
            if added & {"ALL", "SYS_ADMIN", "CAP_SYS_ADMIN", "NET_ADMIN", "CAP_NET_ADMIN"}:
                why.append(f"adds {', '.join(sorted(added))}")
            if why and not _allowed(f"{_name(r)}/{c.get('name')}"):
                yield Finding(
                    f"{_name(r)} container {c.get('name')!r} is {' and '.join(why)} and not on the allow-list",
                    r.urn,
                )


def _image_pinned(view: StackView, config: RuleConfig) -> Iterator[Finding]:
    for r, pod in _workloads(view):
        for c in _containers(pod):
            image = str(c.get("image") or "")
            last = image.rsplit("/", 1)[-1]
            if "@sha256:" in image:
                continue
            tag = last.partition(":")[2]
            if not tag or tag == "latest":
                yield Finding(f"{_name(r)} container {c.get('name')!r} image {image!r} is not pinned", r.urn)


def _autoscaled_sets(view: StackView) -> list[PlanResource]:
    return [s for s in view.of_type(VMSS) if autoscaling.is_autoscaled(s.tags)]


def _autoscaler_discovery(view: StackView, config: RuleConfig) -> Iterator[Finding]:
    found = _autoscaler_args(view, config)
    if found is None:
        return
    host, args = found
    unknown = autoscaling.unknown_flags(args)
    if unknown:
        yield Finding(f"not flags of cluster-autoscaler {autoscaling.VERSION}: {', '.join(unknown)}", host)
    spec = _flag(args, "node-group-auto-discovery")
    wanted = autoscaling.parse_auto_discovery(spec or "")
    if not wanted:
        yield Finding(f"--node-group-auto-discovery is {spec!r}, not a label:<tag>=<value> filter", host)
        return
    sets = view.of_type(VMSS)
    matched = [s for s in sets if all(s.tags.get(k) == v for k, v in wanted.items())]
    if not matched:
        yield Finding(
            f"the autoscaler's discovery filter {wanted} matches none of the plan's scale sets",
            host,
        )
    for s in sets:
        if s not in matched and autoscaling.is_autoscaled(s.tags):
            yield Finding(
                f"scale set is tagged for autoscaling but the autoscaler's filter {wanted} does not match its tags",
                s.urn,
            )


def _governor_settings(config: RuleConfig) -> dict[str, Any]:
    """The scale-up governor's settings as the inventory hands them to its host service (empty: none)."""
    raw = config.inventory.get("hostvar_expressions", {}).get("superkube_scale_governor")
    settings = json.loads(raw) if raw else {}
    return settings if isinstance(settings, dict) else {}


def _governed_join_rate(
    view: StackView, config: RuleConfig, settings: Mapping[str, Any], host: str | None
) -> Iterator[Finding]:
    """With the governor, a minute sees at most its room per refresh times the refreshes a minute
    touches, which its budget keeps under the safe rate it is given. So: that rate is the stack's,
    the room is at least a node, every autoscaled set is governed within its capacity, and the sets'
    first max tags open no more than one refresh's room."""
    safe = settings.get("safe_join_rate_per_minute")
    if not isinstance(safe, int) or safe > config.safe_join_rate_per_minute:
        yield Finding(
            f"the scale-up governor holds joins to {safe!r}/minute, not the stack's safe "
            f"{config.safe_join_rate_per_minute:,}/minute",
            host,
        )
        return
    room = scale_governor.budget(safe)
    if room < 1:
        yield Finding(
            f"at a safe {safe}/minute the scale-up governor opens no room per {scale_governor.PROVIDER_REFRESH_S}s "
            "refresh: no pool could ever grow",
            host,
        )
        return
    ceilings = settings.get("ceilings") or {}
    opened = 0
    for s in _autoscaled_sets(view):
        name = s.props.get("vmScaleSetName", s.name)
        tags = s.tags
        if name not in ceilings:
            yield Finding(
                f"scale set {name} is autoscaled but not governed: its scale-ups have no rate bound", s.urn
            )
            continue
        if ceilings[name] > s.capacity:
            yield Finding(
                f"the governor may grow scale set {name} to {ceilings[name]}, past its capacity {s.capacity}",
                s.urn,
            )
        low, high = tags.get("min", "0"), tags.get("max", "")
        if low.isdigit() and high.isdigit():
            opened += max(0, int(high) - int(low))
        else:
            yield Finding(f"scale set {name} has min {low!r} / max {high!r} tags that are not counts", s.urn)
    if opened > room:
        yield Finding(
            f"the scale sets' first max tags open {opened:,} nodes above their mins, more than the governor's "
            f"{room:,} per refresh: the autoscaler's first look may ask for all of them at once",
            host,
        )


def _join_rate(view: StackView, config: RuleConfig) -> Iterator[Finding]:
    found = _autoscaler_args(view, config)
    if found is None:
        return
    host, args = found
    governor = _governor_settings(config)
    if governor:
        yield from _governed_join_rate(view, config, governor, host)
        return
    per_scaleup = _flag(args, "max-nodes-per-scaleup") or "1000"
    if not per_scaleup.isdigit():
        yield Finding(f"cannot read --max-nodes-per-scaleup {per_scaleup!r}", host)
        return
    pools: dict[str, list[PlanResource]] = defaultdict(list)
    for s in _autoscaled_sets(view):
        pools[s.tags.get("superkube-pool", s.name)].append(s)
    for pool, sets in sorted(pools.items()):
        nodes = sum(s.capacity for s in sets)
        jitters = [join_jitter_seconds((_cloud_init_files(s) or {}).get(JOIN_SCRIPT, "")) or 0 for s in sets]
        jitter = min(jitters) if jitters else 0
        # without the governor nothing spaces the batches: a loop that scaled up starts the next at
        # once (measured, superkube.cluster.autoscaling), so the scan interval is no bound; take a
        # loop to be a second
        peak = 60 * autoscaling.peak_join_rate_per_second(nodes, int(per_scaleup), 1, jitter)
        if peak > config.safe_join_rate_per_minute:
            yield Finding(
                f"a full scale-up of pool {pool} ({nodes:,} nodes) joins at up to {peak:,.0f} nodes/minute "
                f"(--max-nodes-per-scaleup {per_scaleup} in back-to-back loops, join jitter {jitter}s) > the "
                f"safe {config.safe_join_rate_per_minute:,}/minute without the scale-up governor",
                sets[0].urn,
            )


RULES = [
    Rule(
        "platform-objects-schema-valid",
        "high",
        "Every Kubernetes object of the in-cluster layer is valid against the official schema of the cluster's version (strict), or its CRD's.",
        "Run `superkube render --stack <cluster>` to see each invalid field; fix the component that builds it.",
        _schema_valid,
    ),
    Rule(
        "platform-balloon-priority-window",
        "high",
        "Balloon pods' priority is at or above the autoscaler's expendable cutoff and below every other PriorityClass.",
        "Keep FoundationArgs.balloon_priority between --expendable-pods-priority-cutoff (-10) and the lowest other class.",
        _balloon_priority,
    ),
    Rule(
        "platform-balloon-no-preflight-toleration",
        "critical",
        "Balloon pods never tolerate the preflight taint, so only tested GPU nodes are held.",
        "Drop the toleration of superkube.io/preflight (or a key-less Exists toleration) from the balloon pods.",
        _balloon_preflight,
    ),
    Rule(
        "platform-container-resources",
        "medium",
        "Every container requests CPU and memory and limits memory; extended resources (GPUs) have limits equal to requests.",
        "Set resources.requests.cpu/memory and resources.limits.memory on the container.",
        _resources,
    ),
    Rule(
        "platform-container-privileged",
        "critical",
        "No container runs privileged or adds admin capabilities unless it is on the allow-list with a reason.",
        "Drop privileged/capabilities.add, or add the container to PRIVILEGED_ALLOWED in policies/rules/platform.py with its reason.",
        _privileged,
    ),
    Rule(
        "platform-image-pinned",
        "high",
        "Every container image is pinned by a tag other than latest, or by digest.",
        "Write the image as registry/name:version or registry/name@sha256:<digest>.",
        _image_pinned,
    ),
    Rule(
        "platform-autoscaler-discovery",
        "high",
        "cluster-autoscaler's flags are its release's, and its discovery filter matches exactly the scale sets tagged for it.",
        "Keep the autoscaler and the node pools on superkube.cluster.autoscaling.discovery_tags; set superkube:autoscaler_enabled true.",
        _autoscaler_discovery,
    ),
    Rule(
        "platform-autoscaler-join-rate",
        "high",
        "A full-pool scale-up cannot send nodes to the API servers faster than the stack's safe join rate.",
        "Set superkube:autoscaler_governor true and keep the scale sets' max tags as the plan makes them "
        "(modules.cluster.governed_maxes); or raise safe_join_rate_per_minute with load-test evidence.",
        _join_rate,
    ),
]
