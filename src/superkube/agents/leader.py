"""Leader election on a coordination.k8s.io/v1 Lease, as client-go's leaderelection does: one holder
at a time; the holder renews the lease every few seconds; another candidate takes it over once it
has seen the same record, unrenewed, for the lease's duration (by its own clock, so clocks need
not agree). Every write carries the resourceVersion it read, so two candidates cannot both win.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

log = logging.getLogger("superkube-leader")


def _micro(at: datetime) -> str:
    return at.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass
class Lease:
    coordination: Any  # kubernetes.client.CoordinationV1Api
    namespace: str
    name: str
    identity: str
    duration_s: int = 15
    _seen: tuple[str, str] | None = field(default=None, init=False)  # (holder, renewTime) last read
    _seen_at: float = field(default=0.0, init=False)  # when that record was first seen (monotonic)
    leading: bool = field(default=False, init=False)
    _renewed_at: float = field(default=0.0, init=False)  # when this candidate last renewed (monotonic)

    def _body(self, transitions: int, acquired: str, version: str | None) -> dict[str, Any]:
        now = _micro(datetime.now(UTC))
        meta: dict[str, Any] = {"name": self.name, "namespace": self.namespace}
        if version:
            meta["resourceVersion"] = version
        return {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": meta,
            "spec": {
                "holderIdentity": self.identity,
                "leaseDurationSeconds": self.duration_s,
                "acquireTime": acquired or now,
                "renewTime": now,
                "leaseTransitions": transitions,
            },
        }

    def try_lead(self) -> bool:
        """Take or renew the lease if this candidate may; True while it leads. A lost race (409) or
        a lease another holds is False; the API server being away raises (the caller backs off)."""
        from kubernetes.client.exceptions import ApiException

        if self.leading and time.monotonic() - self._renewed_at < self.duration_s / 3:
            return True  # renewed a moment ago: callers may ask before every action
        try:
            lease = self.coordination.read_namespaced_lease(self.name, self.namespace, _request_timeout=10)
        except ApiException as e:
            if e.status != 404:
                raise
            try:
                self.coordination.create_namespaced_lease(
                    self.namespace, self._body(0, "", None), _request_timeout=10
                )
            except ApiException as e2:
                if e2.status == 409:
                    return self._lost()
                raise
            return self._won("created")
        spec = lease.spec
        holder = spec.holder_identity or ""
        record = (holder, str(spec.renew_time))
        if record != self._seen:
            self._seen, self._seen_at = record, time.monotonic()
        mine = holder == self.identity
        expired = time.monotonic() - self._seen_at > (spec.lease_duration_seconds or self.duration_s)
        if not (mine or not holder or expired):
            return self._lost()
        transitions = (spec.lease_transitions or 0) + (0 if mine else 1)
        acquired = _micro(spec.acquire_time) if mine and spec.acquire_time else ""
        body = self._body(transitions, acquired, lease.metadata.resource_version)
        try:
            self.coordination.replace_namespaced_lease(self.name, self.namespace, body, _request_timeout=10)
        except ApiException as e:
            if e.status == 409:
                return self._lost()
            raise
        return self._won("renewed" if mine else f"taken over from {holder or 'nobody'}")

    def release(self) -> None:
        """Give the lease up (on a clean stop, e.g. a rolling update), so the other candidate need
        not wait out its duration. Best effort: a failure leaves it to expire."""
        if not self.leading:
            return
        try:
            lease = self.coordination.read_namespaced_lease(self.name, self.namespace, _request_timeout=5)
            if lease.spec.holder_identity == self.identity:
                lease.spec.holder_identity = None
                lease.spec.renew_time = None
                lease.spec.acquire_time = None
                self.coordination.replace_namespaced_lease(
                    self.name, self.namespace, lease, _request_timeout=5
                )
                log.warning("%s released the lease %s/%s", self.identity, self.namespace, self.name)
        except Exception as e:  # best effort
            log.warning("could not release the lease (%s); it expires in %d s", str(e)[:200], self.duration_s)
        self.leading = False

    def _won(self, how: str) -> bool:
        self._renewed_at = time.monotonic()
        if not self.leading:
            log.warning("%s leads (lease %s/%s %s)", self.identity, self.namespace, self.name, how)
        self.leading = True
        return True

    def _lost(self) -> bool:
        if self.leading:
            log.warning("%s no longer leads (lease %s/%s)", self.identity, self.namespace, self.name)
        self.leading = False
        return False
