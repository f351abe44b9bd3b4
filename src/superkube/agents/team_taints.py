"""Team taints: keeps every node's `superkube.io/team` taint equal to the team capacity configuration.

Each round it reads the tuples (the mounted ConfigMap, reread every round so an applied change takes
effect without a restart) and goes over the nodes as its watch last saw them (one list at start,
then only changes, kept slim: names, labels, taints; relisted only on 410 Gone), and for each node whose team taint differs from the one
its labels call for (the highest-priority matching tuple's team; none when no tuple matches) sends
one JSON patch: a `test` of the taints it read (of its resourceVersion when it has none), then the
taints with only the team taint changed. A patch the server refuses (a node changed since it was
read, a policy) is logged and counted, and the round goes on to the next node.
Every other taint is left exactly as it was; a node already right gets no request at all, so a
second round with nothing changed writes nothing. Each change is logged and recorded as an Event
on the node; with --dry-run it is logged only.

Metrics on port 9467: `superkube_team_taint_changes_total{action}` (add, change, remove),
`superkube_team_nodes{team}` (nodes per team after the round), `superkube_team_taints_api_up`,
`superkube_team_config_ok` (0 while the configuration cannot be read: the agent then changes nothing),
`superkube_namespace_team{namespace, team}` (1 for each namespace labelled with a team: the store joins
per-namespace figures, such as each pod's network use, to teams with it, so no node reads the fleet's
namespaces; it follows only the labelled ones, with a watch of their own).

Run: python -m superkube.agents.team_taints --config /etc/superkube/teams/teams.yaml
"""

from __future__ import annotations

import logging
import sys
import threading
from collections import Counter as Tally
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge

from superkube.agents.informer import Informer
from superkube.agents.kubeapi import base_parser, connect, event, log_to_stderr, now, refused, serve
from superkube.cluster.kube import TEAM_TAINTS_METRICS_PORT
from superkube.model import teams

COMPONENT = "superkube-team-taints"
log = logging.getLogger(COMPONENT)


def current(node: Mapping[str, Any]) -> list[dict[str, Any]]:
    return list((node.get("spec") or {}).get("taints") or [])


def desired_taints(node: Mapping[str, Any], team: str | None) -> list[dict[str, Any]]:
    """The node's taints with the taint of `team` (its owner; None: no team) in place of any team
    taint it has, every other taint untouched."""
    taints = current(node)
    kept = [t for t in taints if t.get("key") != teams.TEAM_KEY]
    if team is None:
        return kept
    want = teams.taint(team)
    out: list[dict[str, Any]] = []
    placed = False
    for t in taints:  # the team taint keeps its place; any second one goes
        if t.get("key") != teams.TEAM_KEY:
            out.append(t)
        elif not placed:
            out.append(want)
            placed = True
    return out if placed else [*kept, want]


def action(old: Sequence[Mapping[str, Any]], new: Sequence[Mapping[str, Any]]) -> str | None:
    """add, change or remove: what happened to the team taint (None: nothing)."""
    had = [t for t in old if t.get("key") == teams.TEAM_KEY]
    has = [t for t in new if t.get("key") == teams.TEAM_KEY]
    if had == has:
        return None
    if not had:
        return "add"
    return "remove" if not has else "change"


def patch(node: Mapping[str, Any], new: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The JSON patch from `node` as read to taints `new`, refused by the server if the node changed
    since: `test` the taints as read, then replace them. A node with no taints has no `taints` field
    at all (the server leaves an empty list out), so there is nothing to `test`: its
    resourceVersion guards the `add` instead."""
    spec = node.get("spec") or {}
    if "taints" in spec:
        return [
            {"op": "test", "path": "/spec/taints", "value": spec["taints"]},
            {"op": "replace", "path": "/spec/taints", "value": new},
        ]
    version = (node.get("metadata") or {}).get("resourceVersion")
    guard = [{"op": "test", "path": "/metadata/resourceVersion", "value": version}] if version else []
    if "spec" not in node:
        return [*guard, {"op": "add", "path": "/spec", "value": {"taints": new}}]
    return [*guard, {"op": "add", "path": "/spec/taints", "value": new}]


ACTIONS = ("add", "change", "remove")
"""What `action` says happened to a node's team taint."""


@dataclass
class Metrics:
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)

    def __post_init__(self) -> None:
        self.changes = Counter(
            "superkube_team_taint_changes",
            "Team taints added, changed or removed.",
            ["action"],
            registry=self.registry,
        )
        self.nodes = Gauge(
            "superkube_team_nodes", "Nodes per team after the last round.", ["team"], registry=self.registry
        )
        self.api_up = Gauge(
            "superkube_team_taints_api_up",
            "1 when the last round reached the API server.",
            registry=self.registry,
        )
        self.refused = Counter(
            "superkube_team_taint_refused",
            "Node patches the API server refused (by status: 403 a policy, 409/422 a node changed since read).",
            ["code"],
            registry=self.registry,
        )
        self.config_ok = Gauge(
            "superkube_team_config_ok",
            "1 when the teams configuration could be read and applied.",
            registry=self.registry,
        )
        self.namespace_team = Gauge(
            "superkube_namespace_team",
            "1 for each namespace labelled with a team (superkube.io/team): join per-namespace figures "
            "to teams with `* on (namespace) group_left (team)`.",
            ["namespace", "team"],
            registry=self.registry,
        )
        for what in ACTIONS:  # from 0, so the first change shows in increase() (as the other agents do)
            self.changes.labels(what)


@dataclass
class Reconciler:
    config: Path
    kube: Any  # Kube, or anything with its methods
    dry_run: bool = False
    metrics: Metrics = field(default_factory=Metrics)

    def round(self) -> dict[str, int]:
        """One pass over every node; returns the changes made (or, dry-run, that would be) by action."""
        try:
            tuples = teams.load_file(self.config)
        except teams.TeamsError as e:
            self.metrics.config_ok.set(0)
            log.error("%s; changing nothing until it is fixed", e)
            return {}
        self.metrics.config_ok.set(1)
        nodes = self.kube.all_nodes()
        self.metrics.api_up.set(1)
        done: Tally[str] = Tally()
        owners: Tally[str] = Tally()
        for node in nodes:
            name = node["metadata"]["name"]
            owner = teams.owner(tuples, (node.get("metadata") or {}).get("labels") or {})
            owners[owner or "none"] += 1
            old, new = current(node), desired_taints(node, owner)
            what = action(old, new)
            if what is None:
                continue
            done[what] += 1
            message = f"team taint {what}: {_taint_of(old)} -> {_taint_of(new)}"
            if self.dry_run:
                log.warning("dry-run: would %s the team taint of %s (%s)", what, name, message)
                continue
            log.warning("%s: %s", name, message)
            try:
                self.kube.patch_node(name, patch(node, new))
            except Exception as exc:  # a refusal is this node's, not the round's: the others go on
                answer = refused(exc)
                if not answer:
                    raise
                self.metrics.refused.labels(answer.split()[0]).inc()
                log.error("%s: the API server refused the team taint %s (%s); next round", name, what, answer)
                done[what] -= 1
                continue
            self.metrics.changes.labels(what).inc()
            self.kube.create_event(event(node, COMPONENT, "Normal", "TeamTaint", message, now()))
        self.metrics.nodes.clear()
        for team, count in owners.items():
            self.metrics.nodes.labels(team).set(count)
        self.metrics.namespace_team.clear()
        for name, team in sorted(self.kube.namespace_teams().items()):
            self.metrics.namespace_team.labels(name, team).set(1)
        return dict(+done)  # without the nodes whose patch was refused


def _taint_of(taints: Sequence[Mapping[str, Any]]) -> str:
    mine = [t for t in taints if t.get("key") == teams.TEAM_KEY]
    return ",".join(f"{t['key']}={t.get('value', '')}:{t['effect']}" for t in mine) or "none"


def slim(node: Mapping[str, Any]) -> dict[str, Any]:
    """What the reconciler keeps of a Node: its name, labels, taints (the field only if the node has
    it) and resourceVersion, which its patches need; not the ~13 KB of status."""
    meta = node.get("metadata") or {}
    spec = node.get("spec") or {}
    kept_meta = {k: meta[k] for k in ("name", "uid", "labels", "resourceVersion") if k in meta}
    return {"metadata": kept_meta, "spec": {"taints": spec["taints"]} if "taints" in spec else {}}


def slim_namespace(namespace: Mapping[str, Any]) -> dict[str, Any]:
    """What the reconciler keeps of a Namespace: its name and team."""
    meta = namespace.get("metadata") or {}
    team = (meta.get("labels") or {}).get(teams.TEAM_KEY, "")
    return {"metadata": {"name": meta.get("name", ""), "labels": {teams.TEAM_KEY: team}}}


class WatchedNodes:
    """The client, with the node list served by a watch (list once, then changes), and the namespaces
    labelled with a team by another."""

    def __init__(self, kube: Any, stop: threading.Event) -> None:
        self.kube, self.stop = kube, stop
        self.watch = Informer(kube.core.list_node, slim=slim)
        self.namespaces = Informer(
            kube.core.list_namespace, slim=slim_namespace, label_selector=teams.TEAM_KEY
        )

    def all_nodes(self) -> list[dict[str, Any]]:
        self.watch.ensure(self.stop)
        return list(self.watch.items().values())

    def namespace_teams(self) -> dict[str, str]:
        """{namespace: team} of the namespaces labelled with a team."""
        self.namespaces.ensure(self.stop)
        return {
            name: ns["metadata"]["labels"][teams.TEAM_KEY]
            for name, ns in self.namespaces.items().items()
            if ns["metadata"]["labels"].get(teams.TEAM_KEY)
        }

    def patch_node(self, name: str, body: Any) -> None:
        self.kube.patch_node(name, body)

    def create_event(self, body: Any) -> None:
        self.kube.create_event(body)


def main(argv: list[str] | None = None) -> int:
    p = base_parser("team_taints", (__doc__ or "").splitlines()[0], TEAM_TAINTS_METRICS_PORT, interval=30.0)
    p.add_argument("--config", type=Path, required=True, help="the teams file (the mounted ConfigMap)")
    args = p.parse_args(argv)
    log_to_stderr(COMPONENT)
    try:
        teams.load_file(args.config)  # a bad file at start is the operator's mistake: say so and stop
    except teams.TeamsError as e:
        print(f"{COMPONENT}: {e}", file=sys.stderr)
        return 2
    metrics = Metrics()
    kube = connect(COMPONENT, args, metrics.registry)
    if kube is None:
        return 2
    stop = threading.Event()
    reconciler = Reconciler(args.config, WatchedNodes(kube, stop), args.dry_run, metrics)

    def one_round() -> bool:
        reconciler.round()
        return False

    try:
        serve(one_round, metrics.api_up, log, args.interval, args.max_backoff, args.rounds)
    finally:
        reconciler.kube.watch.close()
        reconciler.kube.namespaces.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
