"""The kubelet serving-certificate approver: approves the serving certificates kubelets ask for, and
only for addresses their Node has.

Why: the API servers verify a kubelet's serving certificate against the cluster CA
(`--kubelet-certificate-authority`) before `kubectl logs`, `exec`, `port-forward` and node proxy
reach it. A kubelet's self-signed certificate fails that ("x509: cannot validate certificate for
10.65.0.4 because it doesn't contain any IP SANs"), so kubelets ask for theirs
(`serverTLSBootstrap: true`): a CertificateSigningRequest for the signer
`kubernetes.io/kubelet-serving`, which the controller-manager signs once approved. Kubernetes
approves no such request itself (a node could name any address), so this does, after checking:
- it was asked by a node (`system:node:<name>` in `system:nodes`), for itself: the subject is
  exactly `CN=system:node:<name>, O=system:nodes`;
- usages: `server auth`, with at most `digital signature` and `key encipherment` beside it;
- every IP SAN is one of the Node's InternalIP/ExternalIP addresses and every DNS SAN one of its
  Hostname/InternalDNS/ExternalDNS ones, as the API server holds them; no e-mail or URI SANs, and
  at least one SAN.
A request that fails a check is Denied with the reason (the kubelet asks again later); one whose
Node is not registered yet waits for the next round. It follows requests for that signer with one
watch (`informer`), so its reads grow with requests, not with nodes: a request costs one read of its
Node (only when every other check passed), the write of its decision and an Event on the Node. A
request it cannot read at all is denied, never the end of the process. Two replicas may run: a
decision the other replica made first is a conflict (409), skipped.

What it cannot tell: a Node's addresses are the ones its kubelet reports (no cloud provider sets them
here), so a node that lies about its addresses could have another node's address signed. The API
server already refuses a node's request in another node's name; checking addresses against the
node subnets of the plan is the next step.

Metrics on port 9468: `superkube_serving_certs_total{decision}` (approved, denied),
`superkube_serving_certs_denials_total{reason}` (one of `DENIALS`: which check a denied request
failed, never its text), `superkube_serving_certs_waiting` (requests whose Node is not registered
yet), `superkube_serving_certs_api_up`.

Run: python -m superkube.agents.serving_certs [--interval 10]
"""

from __future__ import annotations

import base64
import logging
import sys
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge

from superkube.agents.informer import Informer
from superkube.agents.kubeapi import base_parser, connect, event, log_to_stderr, now, refused, serve, stamp
from superkube.cluster.kube import KUBELET_SERVING_SIGNER as SIGNER
from superkube.cluster.kube import SERVING_CERTS_METRICS_PORT, SERVING_CERTS_NAME

COMPONENT = SERVING_CERTS_NAME
NODE_USER = "system:node:"
NODES_GROUP = "system:nodes"
USAGES = frozenset({"digital signature", "key encipherment", "server auth"})
NODE_IPS = ("InternalIP", "ExternalIP")
NODE_NAMES = ("Hostname", "InternalDNS", "ExternalDNS")
REASON = "SuperkubeServingCerts"
# Why a request was denied, as the denials counter labels it: a fixed set, one per check
DENIALS = {
    "signer": "another signer",
    "requester": "not asked by a node",
    "usages": "usages other than server auth",
    "unreadable": "a request no certificate library reads",
    "signature": "a signature that does not verify",
    "subject": "a subject other than the node's",
    "san_type": "a SAN other than an IP address or a DNS name",
    "no_address": "no IP address nor DNS name",
    "ip_address": "an IP address the Node does not have",
    "dns_name": "a DNS name the Node does not have",
}

log = logging.getLogger(COMPONENT)


class Wait(Exception):
    """Not decidable yet (the Node is not registered): the next round asks again."""


def node_of(csr: Mapping[str, Any]) -> str:
    """The node a request was made by ('' when not by a node)."""
    spec = csr.get("spec") or {}
    user = str(spec.get("username") or "")
    if not user.startswith(NODE_USER) or NODES_GROUP not in (spec.get("groups") or []):
        return ""
    return user.removeprefix(NODE_USER)


def decided(csr: Mapping[str, Any]) -> bool:
    conditions = (csr.get("status") or {}).get("conditions") or []
    return any(c.get("type") in ("Approved", "Denied") for c in conditions)


def check(csr: Mapping[str, Any], node_of_name: Callable[[str], Mapping[str, Any] | None]) -> str:
    """Why the request may not be approved ('' when it may). Its Node is read (`node_of_name`) only
    for a request that passed every other check. Raises Wait while the Node is not registered."""
    return verdict(csr, node_of_name)[1]


def verdict(
    csr: Mapping[str, Any], node_of_name: Callable[[str], Mapping[str, Any] | None]
) -> tuple[str, str]:
    """`check`'s answer with the check that failed, a key of DENIALS: ('', '') when it may be approved."""
    from cryptography import x509
    from cryptography.x509.oid import NameOID

    spec = csr.get("spec") or {}
    if spec.get("signerName") != SIGNER:
        return "signer", f"its signer is {spec.get('signerName')!r}, not {SIGNER}"
    name = node_of(csr)
    if not name:
        return (
            "requester",
            f"it was asked by {spec.get('username')!r}, not by a node ({NODE_USER}<name> in {NODES_GROUP})",
        )
    usages = set(spec.get("usages") or [])
    if "server auth" not in usages or usages - USAGES:
        return "usages", (
            f"its usages {sorted(usages)} are not server auth with at most {sorted(USAGES - {'server auth'})}"
        )
    try:  # whatever a request holds, reading it is a denial at worst, never the approver's end
        request = x509.load_pem_x509_csr(base64.b64decode(spec.get("request") or ""))
        signed = request.is_signature_valid
        subject = [(a.oid, a.value) for a in request.subject]
        try:
            sans = request.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        except x509.ExtensionNotFound:
            return "no_address", "it names no address (no subjectAltName)"
        ips = {str(ip) for ip in sans.get_values_for_type(x509.IPAddress)}
        dns = set(sans.get_values_for_type(x509.DNSName))
        others = len(sans) != len(ips) + len(dns)
    except Exception as e:  # not PEM, an algorithm or extension this library refuses, a duplicate
        return "unreadable", f"its request cannot be read ({type(e).__name__}: {str(e)[:120]})"
    if not signed:
        return "signature", "its request's signature does not verify"
    want = {(NameOID.COMMON_NAME, f"{NODE_USER}{name}"), (NameOID.ORGANIZATION_NAME, NODES_GROUP)}
    if len(subject) != 2 or set(subject) != want:
        return (
            "subject",
            f"its subject {request.subject.rfc4514_string()!r} is not CN={NODE_USER}{name},O={NODES_GROUP}",
        )
    if others:
        return "san_type", "it names something other than IP addresses and DNS names"
    if not ips and not dns:
        return "no_address", "it names no address"
    node = node_of_name(name)
    if node is None:
        raise Wait(f"node {name} is not registered yet")
    addresses = (node.get("status") or {}).get("addresses") or []
    node_ips = {a.get("address") for a in addresses if a.get("type") in NODE_IPS}
    node_names = {a.get("address") for a in addresses if a.get("type") in NODE_NAMES}
    if ips - node_ips:
        return (
            "ip_address",
            f"IP {', '.join(sorted(ips - node_ips))} is not one of node {name}'s ({', '.join(sorted(node_ips)) or 'none'})",
        )
    if dns - node_names:
        return (
            "dns_name",
            f"DNS name {', '.join(sorted(dns - node_names))} is not one of node {name}'s ({', '.join(sorted(node_names)) or 'none'})",
        )
    return "", ""


def decision(csr: Mapping[str, Any], kind: str, message: str) -> dict[str, Any]:
    """The request with an Approved or Denied condition added: the body of its approval write, which
    the server refuses (409) if the request changed since it was read."""
    body = {k: v for k, v in csr.items() if k in ("apiVersion", "kind", "metadata", "spec")}
    body.setdefault("apiVersion", "certificates.k8s.io/v1")
    body.setdefault("kind", "CertificateSigningRequest")
    conditions = list((csr.get("status") or {}).get("conditions") or [])
    conditions.append({"type": kind, "status": "True", "reason": REASON, "message": message,
                       "lastUpdateTime": stamp(now())})  # fmt: skip
    return {**body, "status": {**(csr.get("status") or {}), "conditions": conditions}}


@dataclass
class Metrics:
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)

    def __post_init__(self) -> None:
        self.decisions = Counter("superkube_serving_certs", "Kubelet serving-certificate requests decided.",
                                 ["decision"], registry=self.registry)  # fmt: skip
        self.denials = Counter("superkube_serving_certs_denials",
                               "Requests denied, by the check they failed (a fixed set of reasons).",
                               ["reason"], registry=self.registry)  # fmt: skip
        for reason in DENIALS:  # every series from the start, so the first denial of each counts
            self.denials.labels(reason)
        self.waiting = Gauge("superkube_serving_certs_waiting",
                             "Requests whose Node is not registered yet.", registry=self.registry)  # fmt: skip
        self.api_up = Gauge("superkube_serving_certs_api_up", "1 when the last round reached the API server.",
                            registry=self.registry)  # fmt: skip


class Client:
    """The approver's calls: requests for the kubelet-serving signer (from a watch), a Node, an
    approval write, an Event."""

    def __init__(self, kube: Any, stop: threading.Event) -> None:
        from kubernetes import client

        self.kube, self.stop = kube, stop
        self.certificates = client.CertificatesV1Api(kube.api)
        self.watch = Informer(self.certificates.list_certificate_signing_request,
                              field_selector=f"spec.signerName={SIGNER}")  # fmt: skip

    def requests(self) -> list[dict[str, Any]]:
        self.watch.ensure(self.stop)
        return list(self.watch.items().values())

    def node(self, name: str) -> dict[str, Any] | None:
        from kubernetes.client.exceptions import ApiException

        try:
            return dict(self.kube.node(name))
        except ApiException as e:
            if e.status == 404:
                return None
            raise

    def decide(self, name: str, body: dict[str, Any]) -> None:
        plain: Any = body  # the client serialises plain dicts as they are
        self.certificates.replace_certificate_signing_request_approval(name, plain, _request_timeout=10)

    def create_event(self, body: dict[str, Any]) -> None:
        self.kube.create_event(body)


@dataclass
class Approver:
    client: Any  # Client, or anything with its methods
    dry_run: bool = False
    metrics: Metrics = field(default_factory=Metrics)

    def round(self) -> dict[str, int]:
        """Decide every undecided request; the count of each decision made (or, dry-run, that would be)."""
        done: dict[str, int] = {}
        waiting = 0
        nodes: dict[str, Mapping[str, Any] | None] = {}  # read this round, each at most once

        def lookup(node_name: str) -> Mapping[str, Any] | None:
            if node_name not in nodes:
                nodes[node_name] = self.client.node(node_name)
            return nodes[node_name]

        for csr in self.client.requests():
            if decided(csr):
                continue
            name = (csr.get("metadata") or {}).get("name", "")
            node_name = node_of(csr)
            try:
                reason, why = verdict(csr, lookup)
            except Wait as e:
                waiting += 1
                log.info("%s: %s; next round", name, e)
                continue
            node = nodes.get(node_name)
            kind = "Denied" if why else "Approved"
            message = f"denied: {why}" if why else f"approved: the addresses of node {node_name}"
            if self.dry_run:
                log.warning("dry-run: would mark %s %s (%s)", name, kind, message)
                done[kind.lower()] = done.get(kind.lower(), 0) + 1
                continue
            try:
                self.client.decide(name, decision(csr, kind, message))
            except Exception as exc:  # a conflict is another replica's decision; other refusals are said
                answer = refused(exc)
                if not answer:
                    raise
                if not answer.startswith("409"):
                    log.error("%s: the API server refused the %s (%s)", name, kind.lower(), answer)
                continue
            (log.warning if why else log.info)("%s (node %s): %s", name, node_name or "?", message)
            self.metrics.decisions.labels(kind.lower()).inc()
            if reason:
                self.metrics.denials.labels(reason).inc()
            done[kind.lower()] = done.get(kind.lower(), 0) + 1
            if node is not None:
                self.client.create_event(event(node, COMPONENT, "Warning" if why else "Normal",
                                               f"ServingCertificate{kind}", f"{name}: {message}", now()))  # fmt: skip
        self.metrics.waiting.set(waiting)
        self.metrics.api_up.set(1)
        return done


def main(argv: list[str] | None = None) -> int:
    p = base_parser(
        "serving_certs", (__doc__ or "").splitlines()[0], SERVING_CERTS_METRICS_PORT, interval=10.0
    )
    args = p.parse_args(argv)
    log_to_stderr(COMPONENT)
    metrics = Metrics()
    kube = connect(COMPONENT, args, metrics.registry)
    if kube is None:
        return 2
    stop = threading.Event()
    approver = Approver(Client(kube, stop), args.dry_run, metrics)

    def one_round() -> bool:
        approver.round()
        return False

    try:
        serve(one_round, metrics.api_up, log, args.interval, args.max_backoff, args.rounds)
    finally:
        stop.set()
        approver.client.watch.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
