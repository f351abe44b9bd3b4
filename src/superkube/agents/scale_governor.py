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

Metrics (`--metrics-port`; the role passes superkube's port for it):
`superkube_scale_governor_leader` (1 while this host's autoscaler leads, so this governor acts),
`superkube_scale_governor_room_nodes{scale_set}` (the room above its target the latest round left
each scale set), `superkube_scale_governor_budget_nodes`, `superkube_scale_governor_held` (1 while
nodes not joining hold the room at none), `superkube_scale_governor_writes_total{result}` (max
writes: written, refused) and `superkube_scale_governor_rounds_total{result}` (ok, failed).
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import socket
import ssl
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections import deque
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import yaml

if TYPE_CHECKING:  # the metrics client is loaded where the service runs, not where its names are read
    from prometheus_client import CollectorRegistry

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


class Metrics:
    """What an alert needs from a governor: whether it acts, the room it grants, its writes."""

    WRITE_RESULTS = ("written", "refused")
    ROUND_RESULTS = ("ok", "failed")

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge

        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.leader = Gauge("superkube_scale_governor_leader",
                            "1 while the autoscaler on this host holds the lead, so this governor acts.",
                            registry=r)  # fmt: skip
        self.room = Gauge("superkube_scale_governor_room_nodes",
                          "New nodes the latest round's max leaves room for above the target, by scale set.",
                          ["scale_set"], registry=r)  # fmt: skip
        self.budget = Gauge("superkube_scale_governor_budget_nodes",
                            "New nodes a round may open room for in all (the safe rate per refresh).",
                            registry=r)  # fmt: skip
        self.held = Gauge("superkube_scale_governor_held",
                          "1 while the latest round opened no room: too many nodes are not joining.",
                          registry=r)  # fmt: skip
        self.writes = Counter("superkube_scale_governor_writes", "Max-size writes, by result (written, refused).",
                              ["result"], registry=r)  # fmt: skip
        self.rounds = Counter("superkube_scale_governor_rounds",
                              "Rounds this governor ran while it acted, by result (ok, failed).",
                              ["result"], registry=r)  # fmt: skip
        for result in self.WRITE_RESULTS:  # every series from the start, so the first refusal counts
            self.writes.labels(result)
        for result in self.ROUND_RESULTS:
            self.rounds.labels(result)

    def value(self, name: str, **labels: str) -> float | None:
        """A sample's value now (None when there is none): for the tests and the benchmark."""
        return self.registry.get_sample_value(name, labels)


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
        clock: Callable[[], float] = time.monotonic,
        metrics: Metrics | None = None,
    ) -> None:
        self.read_status = read_status
        self.sizes = sizes
        self.ceilings = dict(ceilings)
        self.room = budget(safe_per_minute, refresh_s)
        self.max_unready = max_unready
        self.refresh_s = refresh_s
        self.interval = interval
        self.clock = clock
        self.stop = threading.Event()
        self.rounds: deque[Round] = deque(maxlen=10_000)  # the latest, for the benchmark and logs
        self.last: dict[str, int] = {}  # what this governor wrote and saw land
        self.written_at: dict[str, float] = {}
        self.targets: dict[str, int] = {}
        self.wanting: set[str] = set()
        self.fresh = True  # no round has written yet: write every max once
        self.missing_logged = False
        self.metrics = metrics or Metrics()
        self.metrics.budget.set(self.room)

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
        missing = sorted(set(self.ceilings) - set(seen))
        if missing and not self.missing_logged:
            log.warning(
                "the autoscaler reports no node group named %s: those scale sets are not governed", missing
            )
            self.missing_logged = True
        now = self.clock()
        for n, m in list(self.last.items()):
            # a write the autoscaler should have seen by now and does not: another writer (a
            # `pulumi up` updating the scale set, a person) set the tag since; write ours again
            if (
                n in seen
                and seen[n] != m
                and now - self.written_at.get(n, now) > self.refresh_s + 2 * self.interval
            ):
                log.warning(
                    "scale set %s: the autoscaler sees max %d, not the %d written; writing it again",
                    n,
                    seen[n],
                    m,
                )
                del self.last[n]
        # a governor that has just started or taken the lead writes every max once: what the status
        # shows may be older than what the last holder wrote
        before = {n: None if self.fresh else self.last.get(n, seen.get(n)) for n in maxes}
        changed = {n: m for n, m in maxes.items() if before[n] != m}

        # lowered first: a writer that stops half-way, or a refresh that reads between two writes,
        # then sees less room than the round meant, never more
        def raised(item: tuple[str, int]) -> bool:
            was = self.last.get(item[0], seen.get(item[0]))
            return was is None or item[1] > was

        changed = dict(sorted(changed.items(), key=raised))
        for n, m in changed.items():  # one at a time: a refusal leaves `last` true to what landed
            try:
                self.sizes.set_max({n: m})
            except Exception:
                self.metrics.writes.labels("refused").inc()
                raise
            self.metrics.writes.labels("written").inc()
            self.last[n], self.written_at[n] = m, now
        self.fresh = False
        r = Round(
            self.room,
            stuck([g for g in groups if g.name in self.ceilings]) > self.max_unready,
            maxes,
            changed,
        )
        self.rounds.append(r)
        targets = {g.name: g.target for g in groups}
        for n, m in maxes.items():
            self.metrics.room.labels(n).set(m - targets[n])
        self.metrics.held.set(1 if r.held else 0)
        if changed:
            log.info("max sizes set: %s%s", changed, " (held: nodes are not joining)" if r.held else "")
        return r

    def forget(self) -> None:
        """Drop what earlier rounds saw: another host's governor acted since (`serve`)."""
        self.last, self.written_at, self.targets, self.wanting = {}, {}, {}, set()
        self.fresh = True
        self.metrics.room.clear()  # the room is the acting governor's to say
        self.metrics.held.set(0)

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                if self.once() is not None:
                    self.metrics.rounds.labels("ok").inc()
            except StatusError as exc:
                self.metrics.rounds.labels("failed").inc()
                log.error("%s; nothing changed this round", exc)
            except Exception as exc:  # the API or the provider refused: try again next round
                self.metrics.rounds.labels("failed").inc()
                log.warning(
                    "round stopped, later writes left to the next: %s: %s", exc.__class__.__name__, exc
                )
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


# The host service. It runs beside cluster-autoscaler on the API-server VMs (role scale_governor),
# as one file with nothing but python3, PyYAML and prometheus_client (Debian's python3-yaml and
# python3-prometheus-client), like the iptables exporter:
# it reads through the API server on its host as its own user, and writes Azure's tags as the
# autoscaler's user-assigned identity. Every API-server host runs it; only the one whose autoscaler
# holds the leader lease acts, so the governor always stands beside the autoscaler that acts.

LEASE = "cluster-autoscaler"
"""The autoscaler's leader-election Lease (`--leader-elect-resource-name`, its default); 1.35 names
its holder by the host name alone (main.go: `os.Hostname()`)."""
NAMESPACE = "kube-system"
"""Where the autoscaler keeps its status ConfigMap and its lease (`--namespace`, its default)."""
ARM = "https://management.azure.com"
TAGS_API_VERSION = "2021-04-01"
"""Azure Resource Manager's Tags API: a PATCH with `operation: Merge` changes only the tags it names."""
IMDS_TOKEN = "http://169.254.169.254/metadata/identity/oauth2/token"
IMDS_API_VERSION = "2018-02-01"


class ServiceError(RuntimeError):
    """Something the operator must fix (a config, a kubeconfig, a refused identity): one line."""


def read_json(req: urllib.request.Request, what: str, timeout: float, context: Any = None) -> Any:
    try:
        with urllib.request.urlopen(req, timeout=timeout, context=context) as resp:
            body = resp.read()
    except urllib.error.HTTPError as exc:
        detail = exc.read()[:300].decode(errors="replace").strip()
        raise ServiceError(f"{what}: HTTP {exc.code} {detail}") from None
    except (urllib.error.URLError, OSError) as exc:
        raise ServiceError(f"{what}: {getattr(exc, 'reason', exc)}") from None
    return json.loads(body) if body else None


class KubeReader:
    """GETs through the API server with a kubeconfig's client certificate (file paths, as the role
    writes it): the status ConfigMap's text and the autoscaler's lease holder."""

    def __init__(self, kubeconfig: Path, timeout: float = 10.0) -> None:
        try:
            config = yaml.safe_load(kubeconfig.read_text())
            context = next(c["context"] for c in config["contexts"] if c["name"] == config["current-context"])
            cluster = next(c["cluster"] for c in config["clusters"] if c["name"] == context["cluster"])
            user = next(u["user"] for u in config["users"] if u["name"] == context["user"])
            base = kubeconfig.parent
            self.server = cluster["server"].rstrip("/")
            self.tls = ssl.create_default_context(cafile=str(base / cluster["certificate-authority"]))
            self.tls.load_cert_chain(str(base / user["client-certificate"]), str(base / user["client-key"]))
        except (OSError, yaml.YAMLError, KeyError, TypeError, StopIteration, ssl.SSLError) as exc:
            raise ServiceError(
                f"{kubeconfig}: not a kubeconfig with a server, a CA file and a client certificate and key "
                f"file for its current context ({exc.__class__.__name__}: {exc})"
            ) from None
        self.timeout = timeout

    def get(self, path: str) -> Any:
        """The object at `path`, or None where the API server has none (404)."""
        req = urllib.request.Request(self.server + path, headers={"Accept": "application/json"})
        try:
            return read_json(req, f"GET {path}", self.timeout, self.tls)
        except ServiceError as exc:
            if "HTTP 404" in str(exc):
                return None
            raise

    def create(self, path: str, body: Mapping[str, Any]) -> Any:
        """POST `body` to the collection at `path`; the object the API server made."""
        return self._send("POST", path, body)

    def replace(self, path: str, body: Mapping[str, Any]) -> Any:
        """PUT `body` (with the resourceVersion it was read at) over the object at `path`: HTTP 409
        when someone wrote it since."""
        return self._send("PUT", path, body)

    def _send(self, method: str, path: str, body: Mapping[str, Any]) -> Any:
        req = urllib.request.Request(
            self.server + path,
            data=json.dumps(body).encode(),
            method=method,
            headers={"Accept": "application/json", "Content-Type": "application/json"},
        )
        return read_json(req, f"{method} {path}", self.timeout, self.tls)

    def status(self) -> str | None:
        cm = self.get(f"/api/v1/namespaces/{NAMESPACE}/configmaps/{STATUS_CONFIGMAP}")
        return ((cm or {}).get("data") or {}).get("status") or None

    def leader(self) -> str | None:
        lease = self.get(f"/apis/coordination.k8s.io/v1/namespaces/{NAMESPACE}/leases/{LEASE}")
        return ((lease or {}).get("spec") or {}).get("holderIdentity") or None


class AzureTags:
    """The scale sets' `max` tags, through Azure Resource Manager's Tags API as a user-assigned
    managed identity (its token from the VM's instance metadata service). One merge per changed set,
    in the order given (`Governor.once` puts the lowered first); the first refusal stops the round,
    so no raise is written after a lower that failed."""

    def __init__(
        self,
        scope: str,
        client_id: str,
        arm: str = ARM,
        imds: str = IMDS_TOKEN,
        timeout: float = 10.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.scope, self.client_id, self.arm, self.imds = scope.rstrip("/"), client_id, arm.rstrip("/"), imds
        self.timeout, self.clock = timeout, clock
        self._token: tuple[str, float] | None = None  # (token, expires at)

    def token(self) -> str:
        if self._token is None or self.clock() > self._token[1] - 300:
            query = urllib.parse.urlencode(
                {"api-version": IMDS_API_VERSION, "resource": self.arm + "/", "client_id": self.client_id}
            )
            req = urllib.request.Request(f"{self.imds}?{query}", headers={"Metadata": "true"})
            body = read_json(req, f"the managed identity {self.client_id}'s token", self.timeout)
            try:
                self._token = (str(body["access_token"]), float(body["expires_on"]))
            except (KeyError, TypeError, ValueError):
                raise ServiceError("the instance metadata service answered without a token") from None
        return self._token[0]

    def resource(self, name: str) -> str:
        return f"{self.scope}/providers/Microsoft.Compute/virtualMachineScaleSets/{urllib.parse.quote(name)}"

    def set_max(self, sizes: Mapping[str, int]) -> None:
        for name, size in sizes.items():
            url = f"{self.arm}{self.resource(name)}/providers/Microsoft.Resources/tags/default?api-version={TAGS_API_VERSION}"
            body = {"operation": "Merge", "properties": {"tags": {"max": str(size)}}}
            req = urllib.request.Request(
                url,
                data=json.dumps(body).encode(),
                method="PATCH",
                headers={"Authorization": f"Bearer {self.token()}", "Content-Type": "application/json"},
            )
            read_json(req, f"setting max {size} on scale set {name}", self.timeout)


@dataclass(frozen=True)
class ServiceConfig:
    """The service's settings, written by the role from the stack (`superkube.cluster.inventory`)."""

    scope: str
    client_id: str
    ceilings: dict[str, int]
    safe_join_rate_per_minute: int
    max_unready: int
    refresh_s: float = PROVIDER_REFRESH_S
    interval_s: float = 10.0
    arm: str = ARM
    """Resource Manager's endpoint (another for a sovereign cloud)."""
    imds: str = IMDS_TOKEN
    """The instance metadata service's token endpoint."""

    @classmethod
    def load(cls, path: Path) -> ServiceConfig:
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise ServiceError(f"{path}: cannot read it as JSON: {exc}") from None
        fields = set(cls.__dataclass_fields__)
        if not isinstance(data, dict) or not {"scope", "client_id", "ceilings"} <= data.keys() <= fields:
            raise ServiceError(
                f"{path}: want a JSON object with the keys {sorted(fields)}; got {data!r:.200}"
            )
        try:
            config = cls(**data)
            counts = (config.max_unready, config.safe_join_rate_per_minute, *config.ceilings.values())
            ok = (
                config.scope.startswith("/subscriptions/")
                and "/resourceGroups/" in config.scope
                and bool(config.ceilings)
                and all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in counts)
                and config.refresh_s > 0
                and config.interval_s > 0
            )
            ok = ok and budget(config.safe_join_rate_per_minute, config.refresh_s) >= 1
        except (TypeError, ValueError, AttributeError) as exc:
            raise ServiceError(f"{path}: {exc}") from None
        if not ok:
            least = (
                math.ceil(60 / config.refresh_s) + 1
                if isinstance(config.refresh_s, int | float) and config.refresh_s > 0
                else 2
            )
            raise ServiceError(
                f"{path}: scope must be a resource group's ID, ceilings a map of scale set to a count >= 0, "
                f"max_unready a count >= 0, refresh_s and interval_s > 0 and the safe rate at least {least} a "
                f"minute (a node per refresh); got scope {config.scope!r}, ceilings {config.ceilings!r:.100}, "
                f"max_unready {config.max_unready!r}, safe {config.safe_join_rate_per_minute!r}, refresh "
                f"{config.refresh_s!r}, interval {config.interval_s!r}"
            )
        return config


def serve(governor: Governor, kube: KubeReader, host: str) -> Callable[[], str | None]:
    """The status reader a host's governor runs on: the status while this host's autoscaler leads,
    None (a round that does nothing, and forgets what it saw) while another's does."""
    leading = False

    def read() -> str | None:
        nonlocal leading
        try:
            now = kube.leader() == host
        except Exception:  # this host's API server cannot say: the governor does not act this round
            governor.metrics.leader.set(0)
            raise
        governor.metrics.leader.set(1 if now else 0)
        if now != leading:
            log.info("the autoscaler on this host %s the lead", "took" if now else "does not hold")
            governor.forget()
            leading = now
        return kube.status() if now else None

    return read


def service_parser(prog: str, description: str) -> argparse.ArgumentParser:
    """The options of a host service on the API-server hosts (this one, and remediation beside it)."""
    p = argparse.ArgumentParser(prog=prog, description=description)
    p.add_argument(
        "--config", type=Path, required=True, help="the service's JSON settings (the role writes them)"
    )
    p.add_argument("--kubeconfig", type=Path, required=True, help="the service's own kubeconfig")
    p.add_argument(
        "--host",
        default=socket.gethostname(),
        help="the autoscaler's lease identity here (default: the host name)",
    )
    p.add_argument("--check", action="store_true", help="load the settings and the kubeconfig, then exit")
    return p


def metrics_options(p: argparse.ArgumentParser) -> None:
    """Where a host service serves its /metrics (this one, and the join-token publisher)."""
    p.add_argument(
        "--metrics-port",
        type=int,
        default=None,
        help="serve /metrics on this port (the role passes superkube's port for it; default: none)",
    )
    p.add_argument("--metrics-address", default="0.0.0.0", help="the address to serve /metrics on")


def serve_metrics(args: argparse.Namespace, registry: CollectorRegistry, prog: str) -> bool:
    """Serve `registry` where the options say (nowhere without --metrics-port); False, after one
    line on stderr, when the port cannot be had (exit 1: a restart may find it free)."""
    if args.metrics_port is None:
        return True
    from prometheus_client import start_http_server

    try:
        start_http_server(args.metrics_port, addr=args.metrics_address, registry=registry)
    except OSError as exc:
        print(
            f"{prog}: cannot serve metrics on {args.metrics_address}:{args.metrics_port}: {exc}",
            file=sys.stderr,
        )
        return False
    return True


def main(argv: Sequence[str] | None = None) -> int:
    p = service_parser(
        "superkube-scale-governor",
        "Hold cluster-autoscaler's scale-ups to the safe join rate by setting each scale set's max tag.",
    )
    metrics_options(p)
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    try:
        config = ServiceConfig.load(args.config)
        kube = KubeReader(args.kubeconfig)
    except ServiceError as exc:
        print(f"superkube-scale-governor: {exc}", file=sys.stderr)
        return 2
    if args.check:
        return 0
    metrics = Metrics()
    if not serve_metrics(args, metrics.registry, "superkube-scale-governor"):
        return 1
    governor = Governor(
        lambda: None,
        AzureTags(config.scope, config.client_id, config.arm, config.imds),
        config.ceilings,
        config.safe_join_rate_per_minute,
        config.max_unready,
        config.refresh_s,
        config.interval_s,
        metrics=metrics,
    )
    governor.read_status = serve(governor, kube, args.host)
    log.info(
        "governing %d scale sets at %d nodes per refresh (%gs), as %s", len(config.ceilings), governor.room,
        config.refresh_s, args.host,
    )  # fmt: skip
    governor.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
