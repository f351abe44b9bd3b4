"""The scale-up governor: holds cluster-autoscaler's scale-ups to the join rate the API servers take.

Why: cluster-autoscaler has no rate limit of its own. In 1.35 a loop that scaled up starts the next
one at once, so while pods stay pending, batches of `--max-nodes-per-scaleup` follow each other as
fast as a loop runs (`superkube.cluster.autoscaling` has the measurements); none of its flags bounds
the rate. The one bound it always obeys is each node group's max size, and Azure's provider re-reads
that from the scale set's `max` tag at every refresh of its cache (`refreshInterval`, one minute by
default; the lab's kwok provider is built to re-read its template's max-count the same way).

What it does, every `interval` seconds:
- reads the autoscaler's status ConfigMap (`cluster-autoscaler-status`, written every loop): for
  each node group, its target size, the max the autoscaler sees, and its unready and long
  unregistered nodes;
- opens room for `budget(...)` new nodes in all (none while more than `max_unready` nodes are unready
  or long unregistered: joins that do not finish mean the join path is struggling; the autoscaler
  counts a node so only 15 minutes after it registered, or `--max-node-provision-time` after it was
  asked for, so this brake is late by that much);
- gives that room to the groups that want more (the autoscaler is growing them: their target rose
  since the last round, and they have not since sat below the max they see without growing),
  evenly, none past its ceiling (the plan's max); what they cannot take, and all of it when none
  wants more, goes evenly to the others, so a scale-up can start anywhere;
- sets each group's max to its target plus its share, never under its min (`decide`), where that
  changes the max.

The bound: between two refreshes the autoscaler can ask for at most the room it saw, and that room
was opened above targets no larger than the ones it acts from, so it asks for at most `budget` nodes
per refresh. A minute touches at most ceil(60 / refresh) + 1 refreshes, so `budget` is the safe rate
split that many ways: with Azure's one-minute refresh, half the safe rate per refresh.

What the bound assumes, and where it does not hold: targets do not fall between refreshes (a
scale-down, or the autoscaler deleting nodes that never registered, reopens room above the budget
until the next refresh sees the round that closed it); refreshes come at their interval (Azure's
provider also refreshes early after a failed scale-set update, and `vmssCacheTTL` in its cloud
config changes the interval: `refresh_s` must be that value); and a round's writes land together (a
writer of several tags must write the lowered maxes before the raised ones). The tests' simulation
models an autoscaler that keeps to these.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import yaml

log = logging.getLogger("superkube.scale-governor")

STATUS_CONFIGMAP = "cluster-autoscaler-status"
"""The autoscaler's status ConfigMap (`--status-config-map-name`, its default) in its namespace."""
PROVIDER_REFRESH_S = 60
"""How often Azure's provider re-reads a scale set's tags (cluster-autoscaler's `refreshInterval`)."""


@dataclass(frozen=True)
class Group:
    """One node group as the autoscaler's status reports it."""

    name: str
    target: int
    max_seen: int
    registered: int
    unready: int
    long_unregistered: int
    min_size: int = 0


class StatusError(ValueError):
    """The autoscaler's status is not what this release writes."""


def parse_status(text: str) -> list[Group]:
    """The node groups of the status ConfigMap's `status` key (the YAML cluster-autoscaler 1.30 and
    later write: `nodeGroups[].health.{cloudProviderTarget, maxSize, nodeCounts}`)."""
    try:
        doc = yaml.safe_load(text) or {}
        groups = []
        for g in doc.get("nodeGroups") or []:
            health = g["health"]
            counts = health.get("nodeCounts") or {}
            registered = counts.get("registered") or {}
            groups.append(
                Group(
                    name=g["name"],
                    target=int(health["cloudProviderTarget"]),
                    max_seen=int(health["maxSize"]),
                    registered=int(registered.get("total", 0)),
                    unready=int((registered.get("unready") or {}).get("total", 0)),
                    long_unregistered=int(counts.get("longUnregistered", 0)),
                    min_size=int(health.get("minSize", 0)),
                )
            )
    except (yaml.YAMLError, KeyError, TypeError, ValueError, AttributeError) as exc:
        raise StatusError(f"the autoscaler's status does not read as its nodeGroups: {exc}") from None
    return groups


def budget(safe_per_minute: int, refresh_s: float = PROVIDER_REFRESH_S) -> int:
    """New nodes the autoscaler may ask for between two provider refreshes, so that no minute sees
    more than `safe_per_minute`: a minute touches at most ceil(60 / refresh) + 1 refreshes."""
    return safe_per_minute // (math.ceil(60 / refresh_s) + 1)


def stuck(groups: Sequence[Group]) -> int:
    """Nodes that are not joining: registered and unready past the autoscaler's startup time, or
    asked for and not registered within `--max-node-provision-time`."""
    return sum(g.unready + g.long_unregistered for g in groups)


def decide(
    groups: Sequence[Group],
    ceilings: Mapping[str, int],
    room: int,
    max_unready: int,
    wanting: Collection[str] | None = None,
) -> dict[str, int]:
    """Each governed group's max for this round (groups not in `ceilings` are not governed).

    The room goes first to the groups that want more: those named in `wanting` (the `Governor` names
    the ones the autoscaler is growing), or without it those filled to the max the autoscaler sees;
    evenly, water-filling under each ceiling. What they cannot take goes evenly to the other groups
    below their ceilings. No room while more than `max_unready` nodes are `stuck` (the
    autoscaler's own `--ok-total-unready-count` is the natural bound). A max is never set below the
    group's target or its min."""
    governed = [g for g in groups if g.name in ceilings]
    if stuck(governed) > max_unready:
        room = 0
    share = {g.name: 0 for g in governed}

    def fill(takers: list[Group], left: int) -> int:
        open_ = sorted(takers, key=lambda g: (ceilings[g.name] - g.target, g.name))
        while left > 0 and open_:
            each = max(1, left // len(open_))
            still = []
            for g in open_:
                if left == 0:
                    break
                give = min(each, left, ceilings[g.name] - g.target - share[g.name])
                share[g.name] += give
                left -= give
                if g.target + share[g.name] < ceilings[g.name]:
                    still.append(g)
            open_ = still
        return left

    below = [g for g in governed if g.target < ceilings[g.name]]
    first = [g for g in below if (g.target >= g.max_seen if wanting is None else g.name in wanting)]
    left = fill(first, room)
    fill([g for g in below if g not in first], left)
    return {
        g.name: max(g.target, g.min_size, min(ceilings[g.name], g.target + share[g.name])) for g in governed
    }


class MaxSizes(Protocol):
    """Where a group's max is set: Azure's scale-set tags, or the lab's kwok templates."""

    def set_max(self, sizes: Mapping[str, int]) -> None: ...


@dataclass
class Round:
    """What one round saw and did (for logs, metrics and the benchmark)."""

    room: int
    held: bool
    maxes: dict[str, int]
    changed: dict[str, int]


class Governor:
    """The loop: read the status, decide, write what changed. `read_status` returns the ConfigMap's
    `status` text (None while the autoscaler has not written it yet)."""

    def __init__(
        self,
        read_status: Callable[[], str | None],
        sizes: MaxSizes,
        ceilings: Mapping[str, int],
        safe_per_minute: int,
        max_unready: int,
        refresh_s: float = PROVIDER_REFRESH_S,
        interval: float = 10.0,
    ) -> None:
        self.read_status = read_status
        self.sizes = sizes
        self.ceilings = dict(ceilings)
        self.room = budget(safe_per_minute, refresh_s)
        self.max_unready = max_unready
        self.interval = interval
        self.stop = threading.Event()
        self.rounds: list[Round] = []
        self.last: dict[str, int] = {}
        self.targets: dict[str, int] = {}
        self.wanting: set[str] = set()

    def plan(self, groups: Sequence[Group]) -> dict[str, int]:
        """This round's maxes. A group wants more while the autoscaler grows it (its target rose since
        the last round), and stops when it sits below the max it sees without growing."""
        for g in groups:
            if g.target > self.targets.get(g.name, g.target):
                self.wanting.add(g.name)
            elif g.target < g.max_seen:
                self.wanting.discard(g.name)
        self.targets = {g.name: g.target for g in groups}
        return decide(groups, self.ceilings, self.room, self.max_unready, self.wanting)

    def once(self) -> Round | None:
        text = self.read_status()
        if text is None:
            return None
        groups = parse_status(text)
        maxes = self.plan(groups)
        seen = {g.name: g.max_seen for g in groups}
        changed = {n: m for n, m in maxes.items() if self.last.get(n, seen.get(n)) != m}
        if changed:
            self.sizes.set_max(changed)
            self.last.update(changed)
        r = Round(
            self.room,
            stuck([g for g in groups if g.name in self.ceilings]) > self.max_unready,
            maxes,
            changed,
        )
        self.rounds.append(r)
        if changed:
            log.info("max sizes set: %s%s", changed, " (held: nodes are not joining)" if r.held else "")
        return r

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                self.once()
            except StatusError as exc:
                log.error("%s; nothing changed this round", exc)
            except Exception as exc:  # the API or the provider refused: try again next round
                log.warning("round failed, nothing changed: %s: %s", exc.__class__.__name__, exc)
            self.stop.wait(self.interval)


def initial_maxes(
    ceilings: Mapping[str, int],
    targets: Mapping[str, int],
    room: int,
    floors: Mapping[str, int] | None = None,
) -> dict[str, int]:
    """The max each group starts from before the autoscaler has reported: its current size plus an
    even share of one round's room (never under its min, `floors`), so the first refresh cannot see
    a group's whole ceiling."""
    names = sorted(ceilings)
    out = {}
    for i, name in enumerate(names):
        share = room // len(names) + (1 if i < room % len(names) else 0)
        out[name] = max((floors or {}).get(name, 0), min(ceilings[name], targets.get(name, 0) + share))
    return out
