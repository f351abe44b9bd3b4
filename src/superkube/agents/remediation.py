"""Remediation: a node health cordoned for a fatal finding leaves the fleet; its VM is deleted from its
scale set, and the autoscaler brings the capacity back as pods wait for it.

Why a service beside the scale governor and not a pod: deleting a VM needs an Azure identity, and
pods have none (a node's identity would be every pod's on it through the instance metadata). It runs
on the API-server VMs, leading where the autoscaler leads (its Lease, as the governor does), with an
identity of its own (user-assigned) whose custom role may only read the cluster's scale sets and
their instances and delete instances (`Microsoft.Compute/virtualMachineScaleSets/delete/action`),
nothing else (modules/cluster.py).

Every `interval_s` seconds, as the leader:
- a node cordoned by health for a failure (superkube.agents.node_health: unschedulable, with the
  cordon annotation, its kind not maintenance: a VM Azure reboots or redeploys comes back, and is
  never deleted) whose drain since that cordon is done (the controller's
  `superkube.io/health-drained-at`, not older than the cordon) and whose GPU
  reset, where one was worth trying, failed (or did not end within `reset_wait_s`), or whose
  cordon is older than its pool's deadline (`deadline_days`, default 7: pods a budget protects may
  keep a node busy that long), is deleted: its scale-set instance found from its name (a Uniform
  scale set names an instance by the set's computer-name prefix and the instance ID in base 36, six
  digits, upper case, which the kubelet's node name has lower case; the instance's own computerName
  is checked before anything is deleted), then `POST
  .../virtualMachineScaleSets/{set}/delete` with its instance ID (Azure sends the VM a Terminate
  scheduled event first: the scale sets' terminate notification). The node is marked
  `superkube.io/remediation-requested-at` (the settings name it);
- a marked node whose instance is gone (404) has its Node object deleted (nothing else does: no
  cloud controller manager runs);
- never more than `max_per_hour` deletions in an hour (a fleet-wide fault must not empty the fleet),
  counted in the cluster (the ConfigMap kube-system/superkube-remediation: each deletion is written
  there before Azure is asked, so a restart or a new leader counts it; no record, no deletion), and
  never in a pool where more nodes are cordoned for failures than the health breaker lets in (one,
  or `max_cordoned_share` of the pool past preflight where that is more: then a person looks first).

Metrics (`--metrics-port`): `superkube_remediation_deletions_total{result}` (deleted, failed,
refused: the instance was not the node), `superkube_remediation_held_nodes{reason}`,
`superkube_remediation_budget_left`, `superkube_remediation_leader`,
`superkube_remediation_rounds_total{result}`.

Like the governor it is a host program on Debian's python3: this file and the governor's, copied side
by side, and nothing else of superkube; the node facts it reads (annotation keys, the pool label, the
preflight taint) come in its settings, which the inventory writes from the code that names them
(`superkube.cluster.inventory`), so they are named once.
"""

from __future__ import annotations

import json
import logging
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

try:  # in the package; on a host, the governor's file beside this one
    from superkube.agents.scale_governor import (
        NAMESPACE,
        AzureTags,
        KubeReader,
        ServiceError,
        metrics_options,
        read_json,
        serve_metrics,
        service_parser,
    )
except ImportError:  # pragma: no cover (the host's layout, run by the role's test)
    from scale_governor import (
        NAMESPACE,
        AzureTags,
        KubeReader,
        ServiceError,
        metrics_options,
        read_json,
        serve_metrics,
        service_parser,
    )

log = logging.getLogger("superkube.remediation")


@dataclass(frozen=True)
class NodeFacts:
    """What health writes on a node and how a node names its pool (from the settings)."""

    cordoned: str  # node_health.ANNOTATION: the cordon's reason
    cordoned_at: str  # node_health.ANNOTATION_AT
    drained_at: str  # node_health.DRAINED_AT
    requested_at: str  # this service: it asked Azure to delete the node's VM
    pool_label: str
    preflight_taint: str
    kind: str = ""  # node_health.CORDON_KIND: the cordon's kind
    maintenance: str = "maintenance"  # the kind of a maintenance cordon (never deleted)
    verdict: str = ""  # node_health.VERDICT_ANNOTATION: the agent's verdict
    gpu_reset: str = ""  # health.GPU_RESET: the GPU reset's outcome
    reset_hint: str = ""  # health.RESET_HINT: ends a verdict a GPU reset may clear

    def awaiting_reset(self, node: Mapping[str, Any], now: float, wait_s: float) -> bool:
        """A GPU reset of this cordon is due or under way, or cleared the GPUs and the controller is
        about to uncordon the node: not a VM to delete yet, for at most `wait_s` from the drain (or
        from the reset's clearing). A failed reset, or a verdict no reset clears, waits for nothing."""
        notes = node["metadata"].get("annotations") or {}
        cordoned_at = notes.get(self.cordoned_at, "")
        word, _, rest = (notes.get(self.gpu_reset, "") if self.gpu_reset else "").partition(" ")
        if word in ("cleared", "failed") and rest[:20] >= cordoned_at:
            if word == "failed":
                return False
            start = _at(rest[:20])
        else:
            verdict = notes.get(self.verdict, "") if self.verdict else ""
            if not (self.reset_hint and verdict.startswith("fatal") and verdict.endswith(self.reset_hint)):
                return False
            start = _at(notes.get(self.drained_at, ""))
        return start is None or now - start < wait_s

    def pool(self, node: Mapping[str, Any]) -> str:
        return str((node["metadata"].get("labels") or {}).get(self.pool_label, ""))

    def in_preflight(self, node: Mapping[str, Any]) -> bool:
        return any(t.get("key") == self.preflight_taint for t in (node.get("spec") or {}).get("taints") or [])

    def cordoned_by_health(self, node: Mapping[str, Any]) -> bool:
        notes = node["metadata"].get("annotations") or {}
        return self.cordoned in notes and bool((node.get("spec") or {}).get("unschedulable"))

    def for_maintenance(self, node: Mapping[str, Any]) -> bool:
        notes = node["metadata"].get("annotations") or {}
        return bool(self.kind) and notes.get(self.kind) == self.maintenance

    def drained_since_cordon(self, node: Mapping[str, Any]) -> bool:
        """The controller's drained mark, made since the current cordon: a mark left from an earlier
        cordon (a person uncordoned the node and it was cordoned again) is not this drain."""
        notes = node["metadata"].get("annotations") or {}
        drained, cordoned = notes.get(self.drained_at, ""), notes.get(self.cordoned_at, "")
        return bool(drained) and drained >= cordoned


COMPUTE_API = "2024-07-01"
DELETE_ACTION = "Microsoft.Compute/virtualMachineScaleSets/delete/action"
INSTANCE_DIGITS = 6  # a Uniform scale set's computer name: prefix + instance ID in base 36, 6 digits
DAY_S = 86400.0


@dataclass(frozen=True)
class ScaleSet:
    name: str
    prefix: str  # its computer-name prefix
    pool: str


def instance_of(node: str, sets: Sequence[ScaleSet]) -> tuple[ScaleSet, str] | None:
    """(scale set, instance ID) of the node named `node`, from the sets' computer-name prefixes."""
    for s in sorted(sets, key=lambda s: -len(s.prefix)):
        rest = node[len(s.prefix) :]
        if node.startswith(s.prefix) and len(rest) == INSTANCE_DIGITS:
            try:
                return s, str(int(rest, 36))
            except ValueError:
                continue
    return None


def _at(value: str) -> float | None:
    try:
        return datetime.strptime(value, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC).timestamp()
    except (TypeError, ValueError):
        return None


def breaker_open(cordoned: int, eligible: int, share: float) -> bool:
    """superkube.cluster.health.breaker_open, here too (this file ships alone; a test holds them equal)."""
    return cordoned > max(1, int(share * eligible + 1e-9))


HELD = ("maintenance", "breaker", "not-drained", "gpu-reset", "unknown-scale-set", "budget")
"""Why a node cordoned by health is not deleted now: the label of superkube_remediation_held_nodes."""


@dataclass(frozen=True)
class Decision:
    delete: list[str]  # nodes whose instances to delete now
    forget: list[str]  # requested nodes whose instances are gone: delete their Node objects
    held: dict[str, str]  # node -> why not now
    reasons: dict[str, str] = field(default_factory=dict, compare=False)  # node -> its HELD reason


def decide(
    nodes: Sequence[Mapping[str, Any]],
    facts: NodeFacts,
    sets: Sequence[ScaleSet],
    deadlines_days: Mapping[str, float],
    max_cordoned_share: float,
    left_this_hour: int,
    now: float,
    gone: Callable[[str], bool] = lambda node: False,
    reset_wait_s: float = 3600.0,
) -> Decision:
    """This round's deletions, in the order the cordons were made."""
    delete: list[str] = []
    forget: list[str] = []
    held: dict[str, str] = {}
    reasons: dict[str, str] = {}

    def hold(name: str, reason: str, why: str) -> None:
        held[name], reasons[name] = why, reason

    by_pool: dict[str, list[Mapping[str, Any]]] = {}
    for n in nodes:
        by_pool.setdefault(facts.pool(n), []).append(n)
    candidates = []
    for pool, members in by_pool.items():
        eligible = [n for n in members if not facts.in_preflight(n)]
        cordoned = [n for n in eligible if facts.cordoned_by_health(n)]
        ours = [n for n in cordoned if not facts.for_maintenance(n)]
        breaker = bool(eligible) and breaker_open(len(ours), len(eligible), max_cordoned_share)
        for n in cordoned:
            name = n["metadata"]["name"]
            notes = n["metadata"].get("annotations") or {}
            if facts.requested_at in notes:
                if gone(name):
                    forget.append(name)
                continue
            if facts.for_maintenance(n):
                hold(name, "maintenance", "cordoned for Azure's scheduled maintenance: its VM comes back")
                continue
            if breaker:
                hold(name, "breaker",
                     f"pool {pool}: {len(ours)} of {len(eligible)} nodes cordoned by health for failures, past the breaker")  # fmt: skip
                continue
            cordoned_at = _at(notes.get(facts.cordoned_at, ""))
            deadline = deadlines_days.get(pool, 7.0) * DAY_S
            drained = facts.drained_since_cordon(n)
            late = cordoned_at is not None and now - cordoned_at >= deadline
            if not (drained or late):
                hold(name, "not-drained", "not drained since its cordon, and its deadline has not passed")
                continue
            if not late and facts.awaiting_reset(n, now, reset_wait_s):
                hold(
                    name,
                    "gpu-reset",
                    "its GPU reset is due, under way, or cleared it: the node may come back",
                )
                continue
            if instance_of(name, sets) is None:
                hold(name, "unknown-scale-set", "no scale set of this cluster names it")
                continue
            candidates.append((cordoned_at or 0.0, name))
    for _, name in sorted(candidates):
        if len(delete) >= left_this_hour:
            hold(name, "budget", "the hour's deletions are spent")
            continue
        delete.append(name)
    return Decision(delete, forget, held, reasons)


LEDGER = "superkube-remediation"
"""The ConfigMap (in the autoscaler's namespace) that counts the last hour's deletions."""
HOUR_S = 3600.0


class Ledger:
    """The deletions of the last hour, kept in the cluster so that the hour's limit holds across a
    restart and a change of leader: `data.deletions` is a JSON list of [stamp, node]. Written before
    each deletion, with the resourceVersion it was read at (two writers: one fails, and deletes
    nothing this round)."""

    def __init__(self, kube: Any, namespace: str = NAMESPACE, name: str = LEDGER) -> None:
        self.kube, self.namespace, self.name = kube, namespace, name

    @property
    def path(self) -> str:
        return f"/api/v1/namespaces/{self.namespace}/configmaps/{self.name}"

    def _read(self) -> tuple[Mapping[str, Any] | None, list[list[str]]]:
        cm = self.kube.get(self.path)
        if cm is None:
            return None, []
        try:
            entries = json.loads(((cm.get("data") or {}).get("deletions")) or "[]")
            ok = isinstance(entries, list) and all(
                isinstance(e, list) and len(e) == 2 and _at(str(e[0])) is not None for e in entries
            )
        except ValueError:
            ok = False
        if not ok:
            raise ServiceError(f"{self.path}: data.deletions is not a list of [time, node]: fix or delete it")
        return cm, entries

    def recent(self, now: float) -> list[float]:
        """When each deletion of the last hour was asked for."""
        _, entries = self._read()
        times = [_at(str(e[0])) for e in entries]
        return sorted(t for t in times if t is not None and now - t < HOUR_S)

    def record(self, node: str, now: float, limit: int) -> None:
        """Count one deletion (and drop those older than an hour); ServiceError if it was not written,
        or if the hour already holds `limit` (a second leader's, read since: the write is checked
        against what it was read at, so two writers cannot both pass the limit)."""
        cm, entries = self._read()
        stamp = datetime.fromtimestamp(now, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        kept = [e for e in entries if now - (_at(str(e[0])) or 0.0) < HOUR_S]
        if len(kept) >= limit:
            raise ServiceError(f"{self.path}: {len(kept)} deletions in the last hour already (limit {limit})")
        kept.append([stamp, node])
        data = {"deletions": json.dumps(kept)}
        if cm is None:
            body = {"apiVersion": "v1", "kind": "ConfigMap",
                    "metadata": {"name": self.name, "namespace": self.namespace}, "data": data}  # fmt: skip
            self.kube.create(f"/api/v1/namespaces/{self.namespace}/configmaps", body)
        else:
            self.kube.replace(self.path, {**cm, "data": {**(cm.get("data") or {}), **data}})


class Metrics:
    """What an operator and the alerts need from remediation."""

    RESULTS = ("deleted", "failed", "refused", "gone")

    def __init__(self) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge

        self.registry = r = CollectorRegistry()
        self.deletions = Counter("superkube_remediation_deletions",
                                 "Instance deletions, by result (deleted, failed; refused: the instance was not "
                                 "the node; gone: it was gone already).", ["result"], registry=r)  # fmt: skip
        self.held = Gauge("superkube_remediation_held_nodes",
                          "Nodes cordoned by health not deleted this round, by reason (remediation.HELD).",
                          ["reason"], registry=r)  # fmt: skip
        self.budget = Gauge("superkube_remediation_budget_left",
                            "Deletions left in the last hour's limit (counted in the cluster).", registry=r)  # fmt: skip
        self.leader = Gauge("superkube_remediation_leader",
                            "1 while the autoscaler on this host leads, so this remediation acts.", registry=r)  # fmt: skip
        self.rounds = Counter("superkube_remediation_rounds", "Rounds run as the leader, by result (ok, failed).",
                              ["result"], registry=r)  # fmt: skip
        for result in self.RESULTS:
            self.deletions.labels(result)
        for reason in HELD:
            self.held.labels(reason)
        for result in ("ok", "failed"):
            self.rounds.labels(result)


class Instances(Protocol):
    """Where instances are read and deleted: Azure's Compute API, or a test's stand-in."""

    def computer_name(self, scale_set: str, instance_id: str) -> str | None: ...

    def delete(self, scale_set: str, instance_id: str) -> None: ...


class AzureInstances(AzureTags):
    """The scale sets' instances through Resource Manager, as the service's managed identity."""

    def _request(self, method: str, path: str, what: str, body: Any = None) -> Any:
        url = f"{self.arm}{path}?api-version={COMPUTE_API}"
        data = json.dumps(body).encode() if body is not None else None
        headers = {"Authorization": f"Bearer {self.token()}", "Content-Type": "application/json"}
        return read_json(
            urllib.request.Request(url, data=data, method=method, headers=headers), what, self.timeout
        )

    def computer_name(self, scale_set: str, instance_id: str) -> str | None:
        path = f"{self.resource(scale_set)}/virtualMachines/{urllib.parse.quote(instance_id)}"
        try:
            vm = self._request("GET", path, f"reading instance {instance_id} of {scale_set}")
        except ServiceError as exc:
            if "HTTP 404" in str(exc):
                return None
            raise
        return str(((vm or {}).get("properties") or {}).get("osProfile", {}).get("computerName", "")) or None

    def delete(self, scale_set: str, instance_id: str, wait_s: float = 1800) -> None:
        """Delete the instance and wait for Azure's operation to end (its `Azure-AsyncOperation`, else
        its `Location`, at the pace `Retry-After` sets); ServiceError if it failed or outlived `wait_s`."""
        what = f"deleting instance {instance_id} of {scale_set}"
        url = f"{self.arm}{self.resource(scale_set)}/delete?api-version={COMPUTE_API}"
        status, headers, _ = self._send("POST", url, what, {"instanceIds": [instance_id]})
        deadline = time.monotonic() + wait_s
        follow = headers.get("Azure-AsyncOperation") or headers.get("Location")
        while status == 202 and follow:
            if time.monotonic() > deadline:
                raise ServiceError(f"{what}: not done after {wait_s:.0f} s")
            time.sleep(min(float(headers.get("Retry-After") or 5), 30))
            status, headers, body = self._send("GET", follow, what)
            state = (body or {}).get("status") if isinstance(body, dict) else None
            if state in ("Failed", "Canceled"):
                raise ServiceError(f"{what}: {state}: {json.dumps((body or {}).get('error'))[:300]}")
            if state == "Succeeded":
                return
            if state is None and status != 202:
                return  # a Location answered with the result

    def _send(self, method: str, url: str, what: str, body: Any = None) -> tuple[int, Any, Any]:
        data = json.dumps(body).encode() if body is not None else None
        headers = {"Authorization": f"Bearer {self.token()}", "Content-Type": "application/json"}
        req = urllib.request.Request(url, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                raw = resp.read()
                return resp.status, resp.headers, json.loads(raw) if raw else None
        except urllib.error.HTTPError as exc:
            detail = exc.read()[:300].decode(errors="replace").strip()
            raise ServiceError(f"{what}: HTTP {exc.code} {detail}") from None
        except (urllib.error.URLError, OSError, ValueError) as exc:
            raise ServiceError(f"{what}: {getattr(exc, 'reason', exc)}") from None


@dataclass
class Remediation:
    kube: Any  # NodeWriter, or anything with get/patch/delete/create/replace
    instances: Instances
    facts: NodeFacts
    sets: Sequence[ScaleSet]
    deadlines_days: Mapping[str, float]
    max_per_hour: int
    max_cordoned_share: float
    clock: Callable[[], float] = time.time
    reset_wait_s: float = 3600.0
    metrics: Metrics | None = None
    lead: Callable[[], bool] = lambda: True
    """still the leader (checked before each deletion: a round may outlive the lease)"""
    ledger: Ledger = field(init=False)

    def __post_init__(self) -> None:
        self.ledger = Ledger(self.kube)

    def once(self) -> Decision:
        now = self.clock()
        left = self.max_per_hour - len(self.ledger.recent(now))
        nodes = (self.kube.get("/api/v1/nodes") or {}).get("items") or []

        def gone(name: str) -> bool:
            found = instance_of(name, self.sets)
            return found is not None and self.instances.computer_name(found[0].name, found[1]) is None

        decision = decide(nodes, self.facts, self.sets, self.deadlines_days, self.max_cordoned_share,
                          left, now, gone, self.reset_wait_s)  # fmt: skip
        for name in decision.delete:
            found = instance_of(name, self.sets)
            assert found is not None
            scale_set, instance_id = found
            listed = next(n for n in nodes if n["metadata"]["name"] == name)
            if not self.lead():
                log.warning("no longer the leader; the round stops before deleting %s", name)
                break
            if not self._still_due(listed):
                continue
            actual = self.instances.computer_name(scale_set.name, instance_id)
            stamp = datetime.fromtimestamp(now, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
            mark = {"metadata": {"annotations": {self.facts.requested_at: stamp}}}
            if actual is None:  # gone already (a person, or a round whose mark failed): clean up after it
                log.warning("%s: instance %s of %s is gone already; its Node goes next round", name,
                            instance_id, scale_set.name)  # fmt: skip
                self.kube.patch(f"/api/v1/nodes/{name}", mark)
                self._count("gone")
                continue
            # never delete a VM on a guess (Azure writes the base-36 digits upper case; the kubelet
            # registers the host name lower case)
            if actual.lower() != name.lower():
                log.error("%s: instance %s of %s is %s, not this node; not deleting", name, instance_id,
                          scale_set.name, actual)  # fmt: skip
                self._count("refused")
                continue
            # counted before it is asked: a crash after it over-counts, never under
            self.ledger.record(name, now, self.max_per_hour)
            left -= 1
            notes = listed["metadata"].get("annotations") or {}
            log.warning("%s: deleting instance %s of %s (%s)", name, instance_id, scale_set.name,
                        notes.get(self.facts.cordoned, ""))  # fmt: skip
            try:
                self.instances.delete(scale_set.name, instance_id)
            except ServiceError:
                self._count("failed")
                raise
            self._count("deleted")
            self.kube.patch(f"/api/v1/nodes/{name}", mark)
        for name in decision.forget:
            self.kube.delete(f"/api/v1/nodes/{name}")
            log.warning("%s: its instance is gone; Node deleted", name)
        for name, why in decision.held.items():
            log.info("%s: held: %s", name, why)
        if self.metrics is not None:
            for reason in HELD:
                self.metrics.held.labels(reason).set(sum(1 for r in decision.reasons.values() if r == reason))
            self.metrics.budget.set(max(left, 0))
        return decision

    def _still_due(self, listed: Mapping[str, Any]) -> bool:
        """The node as it is now (a deletion may have waited minutes since the list) is still the
        same cordon for a failure, not yet asked for: a node uncordoned since (its GPU reset cleared
        it, a person) or cordoned anew is decided again next round."""
        name = listed["metadata"]["name"]
        fresh = self.kube.get(f"/api/v1/nodes/{name}")
        if fresh is None:
            return False
        notes = fresh["metadata"].get("annotations") or {}
        before = listed["metadata"].get("annotations") or {}
        same = (
            self.facts.cordoned_by_health(fresh)
            and not self.facts.for_maintenance(fresh)
            and notes.get(self.facts.cordoned_at) == before.get(self.facts.cordoned_at)
            and self.facts.requested_at not in notes
        )
        if not same:
            log.warning("%s: changed since this round's list; decided again next round", name)
        return bool(same)

    def _count(self, result: str) -> None:
        if self.metrics is not None:
            self.metrics.deletions.labels(result).inc()


class NodeWriter(KubeReader):
    """The governor's reader with the two writes remediation makes: a merge patch and a delete."""

    def patch(self, path: str, body: Mapping[str, Any]) -> Any:
        req = urllib.request.Request(
            self.server + path, data=json.dumps(body).encode(), method="PATCH",
            headers={"Accept": "application/json", "Content-Type": "application/merge-patch+json"},
        )  # fmt: skip
        return read_json(req, f"PATCH {path}", self.timeout, self.tls)

    def delete(self, path: str) -> Any:
        req = urllib.request.Request(
            self.server + path, method="DELETE", headers={"Accept": "application/json"}
        )
        try:
            return read_json(req, f"DELETE {path}", self.timeout, self.tls)
        except ServiceError as exc:
            if "HTTP 404" in str(exc):
                return None
            raise


@dataclass(frozen=True)
class ServiceConfig:
    """The service's settings, written by the role from the stack."""

    scope: str
    client_id: str
    scale_sets: list[dict[str, str]]
    deadline_days: dict[str, float]
    node_facts: dict[str, str]
    max_per_hour: int = 10
    max_cordoned_share: float = 0.05
    interval_s: float = 60.0
    reset_wait_s: float = 3600.0
    arm: str = "https://management.azure.com"
    imds: str = "http://169.254.169.254/metadata/identity/oauth2/token"

    @classmethod
    def load(cls, path: Path) -> ServiceConfig:
        try:
            data = json.loads(path.read_text())
            config = cls(**data)
            sets = [ScaleSet(**s) for s in config.scale_sets]
            NodeFacts(**config.node_facts)
        except (OSError, ValueError, TypeError) as exc:
            raise ServiceError(f"{path}: not the remediation service's settings ({exc})") from None
        ok = (
            config.scope.startswith("/subscriptions/") and "/resourceGroups/" in config.scope and bool(sets)
            and config.max_per_hour >= 1 and 0 < config.max_cordoned_share <= 1 and config.interval_s > 0
            and all(d > 0 for d in config.deadline_days.values())
        )  # fmt: skip
        if not ok:
            raise ServiceError(
                f"{path}: scope must be a resource group's ID, scale_sets at least one, max_per_hour >= 1, "
                f"max_cordoned_share in (0, 1], interval_s and each deadline > 0"
            )
        return config

    def sets(self) -> list[ScaleSet]:
        return [ScaleSet(**s) for s in self.scale_sets]


def main(argv: Sequence[str] | None = None) -> int:
    p = service_parser("superkube-remediation", (__doc__ or "").splitlines()[0])
    metrics_options(p)
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    try:
        config = ServiceConfig.load(args.config)
        kube = NodeWriter(args.kubeconfig)
    except ServiceError as exc:
        print(f"superkube-remediation: {exc}", file=sys.stderr)
        return 2
    if args.check:
        return 0
    metrics = Metrics()
    if not serve_metrics(args, metrics.registry, "superkube-remediation"):
        return 1
    remediation = Remediation(
        kube, AzureInstances(config.scope, config.client_id, config.arm, config.imds),
        NodeFacts(**config.node_facts), config.sets(),
        config.deadline_days, config.max_per_hour, config.max_cordoned_share,
        reset_wait_s=config.reset_wait_s, metrics=metrics,
    )  # fmt: skip
    remediation.lead = lambda: kube.leader() == args.host
    while True:
        try:
            leading = kube.leader() == args.host
            metrics.leader.set(1 if leading else 0)
            if leading:
                remediation.once()
                metrics.rounds.labels("ok").inc()
        except ServiceError as exc:
            metrics.rounds.labels("failed").inc()
            log.error("%s; next round in %.0f s", exc, config.interval_s)
        time.sleep(config.interval_s)


if __name__ == "__main__":
    sys.exit(main())
