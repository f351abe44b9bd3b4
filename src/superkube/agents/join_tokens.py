"""The join-token publisher: a short-lived bootstrap token, issued in the cluster and written into
every node scale set's model, so an instance Azure creates joins from its custom data alone.

Each round:
1. it finds the newest token it published that is still valid (Secrets of type
   bootstrap.kubernetes.io/token labelled `superkube.io/join-token=<cluster>`);
2. when there is none, or it has less than `ttl_s - rotate_s` left, it makes a new one, valid for
   `ttl_s` (`superkube.cluster.join.token_secret`);
3. it writes each scale set's custom data (the plan's document plus the bootstrap kubeconfig that
   carries the token) where the platform reads it for new instances: the scale set's model through
   Azure Resource Manager (`ArmModels`, as the identity the API-server hosts carry), or a folder
   (`DirectoryModels`: the lab, whose fabric boots instances from it). A scale set already given
   this token is not written again; the first refusal ends the round, and the next round retries.

On the API-server hosts (the join_tokens role) every host runs it and one acts: the holder of the
Lease `superkube-join-tokens` in superkube's namespace, which it renews each round; another host
takes over once the lease has gone unrenewed for its duration. The documents come from the
ConfigMap `superkube-node-documents` there, which `pulumi up` keeps as the plan says, so a change to
the plan's custom data reaches the models without a converge.

Old tokens are never deleted here: each expires by itself (the API server refuses it, the
controller-manager's tokencleaner deletes its Secret), so an instance created from the previous
model still joins within its token's life. To revoke a token at once, delete its Secret: the next
round finds no valid token, issues a new one and writes every model again.

Metrics (`--metrics-port`; the role passes superkube's port for it):
`superkube_join_tokens_leader` (1 while this host holds the lease),
`superkube_join_tokens_rounds_total{result}` (ok: a round as the publisher that left every model
done; failed: the lease or a write refused), `superkube_join_tokens_issued_total`,
`superkube_join_tokens_publications_total{result}` (model writes: written, refused),
`superkube_join_tokens_last_success_timestamp_seconds` (the end of the last round that left every
model with a valid token) and `superkube_join_tokens_token_expiry_timestamp_seconds` (when the
token those models carry expires). A stuck publisher shows as a last success that grows old, and
then as a models' token near its expiry.

    python -m superkube.agents.join_tokens --config FILE --kubeconfig FILE [--once]

It ships to the hosts as three modules (this one, superkube.agents.scale_governor and
superkube.cluster.join) that import only the standard library, PyYAML and prometheus_client.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import socket
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge

from superkube.agents.scale_governor import (
    ARM,
    IMDS_TOKEN,
    AzureTags,
    KubeReader,
    ServiceError,
    metrics_options,
    read_json,
    serve_metrics,
)
from superkube.cluster import join

log = logging.getLogger("superkube.join_tokens")

VMSS_API_VERSION = "2024-07-01"
"""Compute's API for a scale set's model: a PATCH of `virtualMachineProfile.osProfile.customData`
changes the model; instances made from then on boot with it (running ones are left as they are)."""
CUSTOM_DATA_SUFFIX = ".customdata"


class Models(Protocol):
    def publish(self, scale_set: str, custom_data: str) -> None:
        """Make `custom_data` (base64) what the scale set's new instances boot with."""


class ArmModels:
    """Scale sets' models through Azure Resource Manager, as a user-assigned managed identity."""

    def __init__(self, azure: AzureTags, timeout: float = 30.0) -> None:
        self.azure, self.timeout = azure, timeout

    def publish(self, scale_set: str, custom_data: str) -> None:
        url = f"{self.azure.arm}{self.azure.resource(scale_set)}?api-version={VMSS_API_VERSION}"
        body = {"properties": {"virtualMachineProfile": {"osProfile": {"customData": custom_data}}}}
        req = urllib.request.Request(
            url,
            data=json.dumps(body).encode(),
            method="PATCH",
            headers={"Authorization": f"Bearer {self.azure.token()}", "Content-Type": "application/json"},
        )
        read_json(req, f"writing scale set {scale_set}'s custom data", self.timeout)


class DirectoryModels:
    """Scale sets' models as files, `<folder>/<scale set>.customdata`, written whole (a reader never
    sees half of one), readable by root alone."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def path(self, scale_set: str) -> Path:
        return self.folder / f"{scale_set}{CUSTOM_DATA_SUFFIX}"

    def publish(self, scale_set: str, custom_data: str) -> None:
        self.folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        target = self.path(scale_set)
        part = target.with_name(target.name + ".part")
        fd = os.open(part, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(custom_data)
        part.replace(target)


@dataclass(frozen=True)
class PublisherConfig:
    """The publisher's settings (JSON), from the stack."""

    cluster: str
    server: str
    """The API servers' URL as a new node reaches it (the internal load balancer)."""
    ca_file: str
    """The cluster CA's certificate (PEM) on this host."""
    documents: dict[str, str] | None = None
    """Scale set name -> the plan's #cloud-config document for it (without credentials); None: read
    them each round from `documents_from`."""
    documents_from: str = ""
    """`<namespace>/<name>` of the ConfigMap holding the documents (the in-cluster layer's)."""
    ttl_s: float = join.DEFAULT_TTL_S
    rotate_s: float = join.DEFAULT_ROTATE_S
    interval_s: float = 60.0
    refresh_s: float = 600.0
    """Write every model again this often even with no new token: a `pulumi up` that updates a scale
    set for another reason sends the plan's document (without the token) along with it."""
    lease_s: float = 0.0
    """Hold the publisher's Lease for this long (renewed each round; 0: no lease, this one acts).
    Another host takes over a lease left unrenewed this long."""
    group: str = join.JOIN_GROUP
    directory: str = ""
    """Write models as files here (the lab) instead of through Azure Resource Manager."""
    scope: str = ""
    """The resource group holding the scale sets (Resource Manager only)."""
    client_id: str = ""
    """The identity that may write them (Resource Manager only)."""
    arm: str = ARM
    imds: str = IMDS_TOKEN

    @classmethod
    def load(cls, path: Path) -> PublisherConfig:
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise ServiceError(f"{path}: cannot read it as JSON: {exc}") from None
        fields = set(cls.__dataclass_fields__)
        needed = {"cluster", "server", "ca_file"}
        if not isinstance(data, dict) or not needed <= data.keys() <= fields:
            raise ServiceError(
                f"{path}: want a JSON object with {sorted(needed)} and at most {sorted(fields)}"
            )
        try:
            config = cls(**data)
            join.check_lifetime(float(config.ttl_s), float(config.rotate_s), float(config.interval_s))
            if float(config.refresh_s) < float(config.interval_s):
                raise ValueError(
                    f"refresh_s {config.refresh_s} must be at least interval_s {config.interval_s}"
                )
            if config.lease_s and float(config.lease_s) < 2 * float(config.interval_s):
                raise ValueError(
                    f"lease_s {config.lease_s} must be 0 (no lease) or at least two rounds "
                    f"({2 * float(config.interval_s):.0f} s): a holder renews it once a round"
                )
        except (TypeError, ValueError) as exc:
            raise ServiceError(f"{path}: {exc}") from None
        if (config.documents is None) == (not config.documents_from):
            raise ServiceError(
                f"{path}: give `documents` or `documents_from` (<namespace>/<ConfigMap>), one of them"
            )
        if config.documents is not None:
            check_documents(config.documents, str(path))
        elif config.documents_from.count("/") != 1:
            raise ServiceError(
                f"{path}: documents_from {config.documents_from!r}: give <namespace>/<ConfigMap>"
            )
        if not config.directory and not (config.scope.startswith("/subscriptions/") and config.client_id):
            raise ServiceError(
                f"{path}: give `directory`, or the resource group's ID as `scope` and the identity's `client_id`"
            )
        return config


def check_documents(documents: object, where: str) -> dict[str, str]:
    """`documents` as a publisher takes them: each scale set's #cloud-config document."""
    if (
        not isinstance(documents, dict)
        or not documents
        or not all(isinstance(d, str) and d.startswith("#cloud-config\n") for d in documents.values())
    ):
        raise ServiceError(f"{where}: documents must map each scale set to its #cloud-config document")
    return documents


class Lease:
    """One publisher per cluster: a coordination.k8s.io/v1 Lease held by the host whose round renews
    it. A candidate takes it over once it has seen the same record, unrenewed, for the lease's
    duration by its own clock (clocks need not agree); every write carries the resourceVersion it
    read, so two candidates cannot both win."""

    def __init__(
        self,
        kube: KubeReader,
        namespace: str,
        identity: str,
        duration_s: float,
        name: str = join.PUBLISHER,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.kube, self.identity, self.duration_s, self.clock = kube, identity, duration_s, clock
        self.collection = f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases"
        self.path = f"{self.collection}/{name}"
        self.name, self.namespace = name, namespace
        self._seen: tuple[Any, Any] | None = None
        self._seen_at = 0.0

    def _spec(self, held: Mapping[str, Any], taking: bool) -> dict[str, Any]:
        at = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        spec = {**held, "holderIdentity": self.identity, "leaseDurationSeconds": int(self.duration_s),
                "renewTime": at}  # fmt: skip
        if taking:
            spec["acquireTime"] = at
            spec["leaseTransitions"] = int(held.get("leaseTransitions") or 0) + (1 if held else 0)
        return spec

    def hold(self) -> bool:
        """Take or renew the lease; whether this host holds it now."""
        lease = self.kube.get(self.path)
        try:
            if lease is None:  # the in-cluster layer makes it; a user allowed to may make it here
                body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                        "metadata": {"name": self.name, "namespace": self.namespace},
                        "spec": self._spec({}, taking=True)}  # fmt: skip
                self.kube.create(self.collection, body)
                return True
            held = lease.get("spec") or {}
            holder = held.get("holderIdentity")
            if holder and holder != self.identity:
                record = (holder, held.get("renewTime"))
                if record != self._seen:
                    self._seen, self._seen_at = record, self.clock()
                    return False
                # the holder's own duration, as it wrote it: hosts mid-converge may differ in theirs
                if self.clock() - self._seen_at < float(held.get("leaseDurationSeconds") or self.duration_s):
                    return False
            lease["spec"] = self._spec(held, taking=holder != self.identity)
            self.kube.replace(self.path, lease)
            return True
        except ServiceError as exc:
            if "HTTP 409" in str(exc):  # another host wrote first: it holds the lease
                return False
            if lease is None and "HTTP 403" in str(exc):
                raise ServiceError(
                    f"Lease {self.namespace}/{self.name} is missing and this user may not make it: "
                    "`pulumi up` the in-cluster layer (its join-tokens component makes it)"
                ) from None
            raise


class Metrics:
    """What an alert needs from a publisher: whether it acts, its rounds and writes, and how old
    and how near its expiry the token in the models is."""

    ROUND_RESULTS = ("ok", "failed")
    PUBLICATION_RESULTS = ("written", "refused")

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.leader = Gauge("superkube_join_tokens_leader",
                            "1 while this host holds the publisher's lease (or runs without one).", registry=r)  # fmt: skip
        self.rounds = Counter("superkube_join_tokens_rounds",
                              "Rounds by result: ok (as the publisher, every model done), failed.", ["result"],
                              registry=r)  # fmt: skip
        self.issued = Counter("superkube_join_tokens_issued", "Join tokens issued.", registry=r)
        self.publications = Counter("superkube_join_tokens_publications",
                                    "Scale-set model writes, by result (written, refused).", ["result"],
                                    registry=r)  # fmt: skip
        self.last_success = Gauge("superkube_join_tokens_last_success_timestamp_seconds",
                                  "When a round last left every scale set's model with a valid token (Unix time).",
                                  registry=r)  # fmt: skip
        self.expiry = Gauge("superkube_join_tokens_token_expiry_timestamp_seconds",
                            "When the token every model carries expires (Unix time), as of the last good round.",
                            registry=r)  # fmt: skip
        for result in self.ROUND_RESULTS:  # every series from the start, so the first failure counts
            self.rounds.labels(result)
        for result in self.PUBLICATION_RESULTS:
            self.publications.labels(result)

    def value(self, name: str, **labels: str) -> float | None:
        """A sample's value now (None when there is none)."""
        return self.registry.get_sample_value(name, labels)


@dataclass(frozen=True)
class Published:
    token: join.Token
    expires: datetime
    issued: bool  # made in this round
    written: tuple[str, ...]  # scale sets whose model this round wrote


class Publisher:
    def __init__(
        self,
        config: PublisherConfig,
        kube: KubeReader,
        models: Models,
        clock: Callable[[], datetime] = join.now,
        metrics: Metrics | None = None,
    ) -> None:
        self.config, self.kube, self.models, self.clock = config, kube, models, clock
        self.metrics = metrics or Metrics()
        self.ca_pem = Path(config.ca_file).read_text()
        # scale set -> ((its model's token id, its document's digest), written at)
        self.given: dict[str, tuple[tuple[str, str], datetime]] = {}

    def current(self) -> tuple[join.Token, datetime] | None:
        """This cluster's newest published token with time left, and its expiration."""
        query = urllib.parse.urlencode(
            {
                "fieldSelector": f"type={join.TOKEN_TYPE}",
                "labelSelector": f"{join.PUBLISHED_LABEL}={self.config.cluster}",
            }
        )
        listed = self.kube.get(f"/api/v1/namespaces/{join.TOKEN_NAMESPACE}/secrets?{query}") or {}
        valid = []
        for secret in listed.get("items") or []:
            try:
                expires, token = join.expiration(secret), join.secret_token(secret)
            except (KeyError, TypeError, ValueError):  # not one this publisher made whole: not used
                log.warning(
                    "ignoring token Secret %s: not a whole bootstrap token",
                    secret.get("metadata", {}).get("name"),
                )
                continue
            if expires is not None and expires > self.clock():
                valid.append((expires, token))
        if not valid:
            return None
        expires, token = max(valid, key=lambda v: v[0])
        return token, expires

    def issue(self) -> tuple[join.Token, datetime]:
        token = join.new_token()
        expires = join.later(self.clock(), self.config.ttl_s)
        body = join.token_secret(token, expires, self.config.cluster, self.config.group)
        self.kube.create(f"/api/v1/namespaces/{join.TOKEN_NAMESPACE}/secrets", body)
        self.metrics.issued.inc()
        log.info("issued join token %s, valid until %s", token.id, join.stamp(expires))
        return token, expires

    def custom_data(self, scale_set: str, token: join.Token, documents: Mapping[str, str]) -> str:
        kubeconfig = join.bootstrap_kubeconfig(self.config.server, self.ca_pem, token, self.config.cluster)
        return join.encode(join.with_credentials(documents[scale_set], kubeconfig))

    def documents(self) -> dict[str, str]:
        """Each scale set's plan document: the settings', or the in-cluster layer's ConfigMap now."""
        if self.config.documents is not None:
            return self.config.documents
        namespace, name = self.config.documents_from.split("/")
        found = self.kube.get(f"/api/v1/namespaces/{namespace}/configmaps/{name}")
        if found is None:
            raise ServiceError(
                f"ConfigMap {self.config.documents_from} is missing: `pulumi up` the in-cluster layer first"
            )
        return check_documents(found.get("data") or {}, f"ConfigMap {self.config.documents_from}")

    def once(self, leading: Callable[[], bool] = lambda: True) -> Published:
        """One round. `leading` is asked before the token is issued and before each model is written
        (a renewal of the lease): a host that lost the lease mid-round stops writing."""

        def still() -> None:
            if not leading():
                raise ServiceError("another host took the publisher's lease during this round")

        documents = self.documents()
        found = self.current()
        fresh = found is not None and (found[1] - self.clock()).total_seconds() > (
            self.config.ttl_s - self.config.rotate_s
        )
        if not fresh:
            still()
        token, expires = found if found is not None and fresh else self.issue()
        written, refused = [], []
        now = self.clock()
        for scale_set, document in documents.items():
            held = self.given.get(scale_set)
            given = (token.id, hashlib.sha256(document.encode()).hexdigest())
            if held and held[0] == given and (now - held[1]).total_seconds() < self.config.refresh_s:
                continue
            still()
            try:  # one scale set refused does not keep the others on an older token
                self.models.publish(scale_set, self.custom_data(scale_set, token, documents))
            except (ServiceError, OSError) as exc:
                self.metrics.publications.labels("refused").inc()
                refused.append(f"{scale_set}: {exc}")
                continue
            self.metrics.publications.labels("written").inc()
            self.given[scale_set] = (given, now)
            written.append(scale_set)
            log.info("scale set %s: new instances join with token %s", scale_set, token.id)
        if refused:
            raise ServiceError(
                f"token {token.id} not written to {len(refused)} scale sets: " + "; ".join(refused)
            )
        self.metrics.expiry.set(expires.timestamp())
        self.metrics.last_success.set(self.clock().timestamp())
        return Published(token, expires, not (found is not None and fresh), tuple(written))

    def run(self, rounds: int | None = None, lease: Lease | None = None) -> None:
        done = 0
        leading = lease is None
        while rounds is None or done < rounds:
            now = False
            try:
                now = lease.hold() if lease is not None else True
                self.metrics.leader.set(1 if now else 0)
                if now != leading:
                    log.info("this host %s the publisher's lease", "took" if now else "does not hold")
                    self.given.clear()  # a new holder writes every model: the last one may have missed some
                    leading = now
                if leading:
                    self.once(lease.hold if lease is not None else lambda: True)
                    self.metrics.rounds.labels("ok").inc()
            except (ServiceError, OSError, ValueError) as exc:
                self.metrics.rounds.labels("failed").inc()
                if not now:  # the lease could not be read or renewed: this host does not act
                    self.metrics.leader.set(0)
                log.warning("round failed, retrying in %.0fs: %s", self.config.interval_s, exc)
            done += 1
            if rounds is None or done < rounds:
                time.sleep(self.config.interval_s)


def models_of(config: PublisherConfig) -> Models:
    if config.directory:
        return DirectoryModels(Path(config.directory))
    return ArmModels(AzureTags(config.scope, config.client_id, config.arm, config.imds))


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="superkube-join-tokens",
        description="Issue short-lived join tokens and write them into the node scale sets' custom data.",
    )
    p.add_argument("--config", type=Path, required=True, help="the publisher's JSON settings")
    p.add_argument(
        "--kubeconfig", type=Path, required=True, help="a kubeconfig that may create token Secrets"
    )
    p.add_argument("--once", action="store_true", help="one round, then exit (non-zero if it failed)")
    p.add_argument("--json", action="store_true", help="with --once: print what the round did as JSON")
    p.add_argument(
        "--identity",
        default=socket.gethostname(),
        help="this host's name in the lease (default: the host name)",
    )
    p.add_argument("--check", action="store_true", help="load the settings and the kubeconfig, then exit")
    metrics_options(p)
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s", stream=sys.stderr)
    try:
        config = PublisherConfig.load(args.config)
        publisher = Publisher(config, KubeReader(args.kubeconfig), models_of(config))
    except (ServiceError, OSError) as exc:
        print(f"superkube-join-tokens: {exc}", file=sys.stderr)
        return 2
    if args.check:
        return 0
    if not args.once:
        if not serve_metrics(args, publisher.metrics.registry, "superkube-join-tokens"):
            return 1
        lease = None
        if config.lease_s:
            namespace = (
                config.documents_from.split("/")[0] if config.documents_from else join.PUBLISHER_NAMESPACE
            )
            lease = Lease(publisher.kube, namespace, args.identity, config.lease_s)
        publisher.run(lease=lease)
        return 0
    try:
        done = publisher.once()
    except ServiceError as exc:
        print(f"superkube-join-tokens: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(summary(done)))
    return 0


def summary(done: Published) -> dict[str, Any]:
    return {
        "token_id": done.token.id,
        "expires": join.stamp(done.expires.astimezone(UTC)),
        "issued": done.issued,
        "written": list(done.written),
    }


def documents_of(custom_data: Mapping[str, str]) -> dict[str, str]:
    """Scale set -> plan document, from each scale set's planned custom data (base64)."""
    import base64

    return {name: base64.b64decode(data).decode() for name, data in custom_data.items()}


if __name__ == "__main__":
    sys.exit(main())
