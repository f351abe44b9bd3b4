"""Kubelets' TLS bootstrap, played as a client: one join or thousands at once, against a real API server.

A join is what a kubelet sends when it first starts with a bootstrap kubeconfig:
1. as its bootstrap token (user `system:bootstrap:<id>`, group `system:bootstrappers`), it creates a
   CertificateSigningRequest for `system:node:<name>` in `system:nodes` (signer
   `kubernetes.io/kube-apiserver-client-kubelet`; usages digital signature and client auth, as the
   kubelet asks for its ECDSA key);
2. it watches that request until the controller-manager's csrapproving and csrsigning controllers
   have approved and signed it;
3. as the node, with the issued certificate on a new connection, it creates its Node
4. and its Lease in `kube-node-lease`.
A request answered 429 (API Priority and Fairness rejected it: its queue was full) is sent again
after the server's Retry-After, as client-go does, up to MAX_429 times, and counted; a request is
sent again on a new connection after a connection error only when it is idempotent (GET, PUT), as
client-go does. Every response's flow schema and priority level (APF's `X-Kubernetes-PF-*`
headers) is kept, so a caller sees how each step was classified.

In production every node of a cluster joins with the same bootstrap token (the kube_apiserver
role's one Secret), so every bootstrap request is one user and, with the join schemas'
`ByUser` distinguisher, one APF flow; pass the same Token for every node to send that. Distinct
tokens make one flow per node.

The steady client (`steady`, run as its own process so the joins' threads do not hold its
interpreter) is an ordinary user beside the storm: it lists the pods of a namespace and writes a
ConfigMap there, back to back, on one kept-alive connection, and records each request's latency.

    python -m superkube.harness.joins steady URL CA CERT KEY NAMESPACE SECONDS OUT.jsonl
"""

from __future__ import annotations

import base64
import concurrent.futures
import http.client
import json
import ssl
import sys
import tempfile
import time
import urllib.parse
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from superkube.agents.serving_certs import NODES_GROUP
from superkube.cluster.join import Token, new_token

KUBELET_CLIENT_SIGNER = "kubernetes.io/kube-apiserver-client-kubelet"
CSR_PATH = "/apis/certificates.k8s.io/v1/certificatesigningrequests"
LEASE_NAMESPACE = "kube-node-lease"
FLOW_SCHEMA_HEADER = "X-Kubernetes-PF-FlowSchema-UID"
PRIORITY_LEVEL_HEADER = "X-Kubernetes-PF-PriorityLevel-UID"
SIGNED_TIMEOUT_S = 120
"""how long one join waits for its certificate before it counts as failed"""
MAX_429 = 10  # client-go's default retries of a request the server throttled


def new_tokens(n: int) -> list[Token]:
    """`n` bootstrap tokens with distinct ids, from the system's randomness."""
    tokens: dict[str, Token] = {}
    while len(tokens) < n:
        t = new_token()
        tokens.setdefault(t.id, t)
    return list(tokens.values())


def role_objects(engine: Any) -> list[dict[str, Any]]:
    """The kube_apiserver role's bootstrap.yaml.j2 as a converge renders it on the plan's first API
    server (`engine`: a `superkube.cluster.wiring.Wiring`), with a placeholder token for
    `bootstrap_objects` to replace."""
    import yaml

    host = next(h for h in engine.hosts if h.group == "apiservers")
    text = engine.template(
        "kube_apiserver", host, "bootstrap.yaml.j2", kube_apiserver_bootstrap_token=new_tokens(1)[0].value
    )
    return list(yaml.safe_load_all(text))


def bootstrap_objects(rendered: Sequence[dict[str, Any]], tokens: Sequence[Token]) -> list[dict[str, Any]]:
    """The kube_apiserver role's bootstrap objects (`rendered`: its bootstrap.yaml.j2 as a converge
    writes it) for many tokens: its token Secret once per token, its bindings once. Rendering the
    role's template per token would take minutes for thousands; only the token's own fields differ."""
    (secret,) = [d for d in rendered if d["kind"] == "Secret"]
    out = [d for d in rendered if d["kind"] != "Secret"]
    for t in tokens:
        data = {**secret["data"], "token-id": _b64(t.id), "token-secret": _b64(t.secret)}
        out.append(
            {**secret, "metadata": {**secret["metadata"], "name": f"bootstrap-token-{t.id}"}, "data": data}
        )
    return out


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


@dataclass
class Step:
    """One request of a join: which step, its final HTTP status, and how APF classified it."""

    step: str
    status: int
    flow_schema: str
    priority_level: str
    throttled: int = 0  # 429s answered before this final status

    @classmethod
    def of(cls, step: str, response: http.client.HTTPResponse, throttled: int) -> Step:
        return cls(
            step,
            response.status,
            response.getheader(FLOW_SCHEMA_HEADER) or "",
            response.getheader(PRIORITY_LEVEL_HEADER) or "",
            throttled,
        )


@dataclass
class JoinResult:
    node: str
    started: float  # time.monotonic()
    finished: float = 0.0
    steps: list[Step] = field(default_factory=list)
    error: str = ""

    @property
    def ok(self) -> bool:
        return not self.error

    @property
    def throttled(self) -> int:
        return sum(s.throttled for s in self.steps)


class Client:
    """One identity's kept-alive HTTPS connection to the API server."""

    def __init__(self, url: str, context: ssl.SSLContext, token: str = "", timeout: float = 60) -> None:
        parsed = urllib.parse.urlsplit(url)
        self.host, self.port = parsed.hostname or "", parsed.port or 443
        self.context, self.timeout = context, timeout
        self.headers = {"Accept": "application/json", "Content-Type": "application/json"}
        if token:
            self.headers["Authorization"] = f"Bearer {token}"
        self.conn = self._connect()

    def close(self) -> None:
        self.conn.close()

    def _connect(self) -> http.client.HTTPSConnection:
        return http.client.HTTPSConnection(self.host, self.port, context=self.context, timeout=self.timeout)

    def call(self, step: str, method: str, path: str, body: Any = None) -> tuple[Step, Any]:
        """Send until the answer is not 429; the final status, classification and decoded body."""
        throttled = 0
        payload = None if body is None else json.dumps(body)
        while True:
            try:
                self.conn.request(method, path, body=payload, headers=self.headers)
                r = self.conn.getresponse()
                data = r.read()
            except (OSError, http.client.HTTPException):
                self.conn.close()
                self.conn = self._connect()
                if method not in ("GET", "PUT"):  # it may have been done: never send it twice
                    raise
                # a dropped kept-alive connection: once more, on a new one
                self.conn.request(method, path, body=payload, headers=self.headers)
                r = self.conn.getresponse()
                data = r.read()
            if r.status != 429 or throttled == MAX_429:
                break
            throttled += 1
            time.sleep(float(r.getheader("Retry-After") or 1))
        return Step.of(step, r, throttled), json.loads(data) if data.startswith(b"{") else {}

    def watch_until(self, step: str, path: str, done: Callable[[dict[str, Any]], Any]) -> tuple[Step, Any]:
        """Watch `path` (a watch URL) until an event's object satisfies `done`; return what it gave."""
        throttled = 0
        while True:
            # a watch holds its own connection, as client-go's does, open as long as the watch asks
            conn = http.client.HTTPSConnection(
                self.host, self.port, context=self.context, timeout=SIGNED_TIMEOUT_S + 30
            )
            try:
                conn.request("GET", path, headers=self.headers)
                r = conn.getresponse()
                if r.status == 429 and throttled < MAX_429:
                    throttled += 1
                    time.sleep(float(r.getheader("Retry-After") or 1))
                    continue
                result = Step.of(step, r, throttled)
                if r.status != 200:
                    return result, None
                while line := r.readline():
                    event = json.loads(line)
                    if event.get("type") == "ERROR":  # the object is a Status: the watch ended
                        return result, None
                    found = done(event.get("object") or {})
                    if found:
                        return result, found
                return result, None  # the watch's timeout ended it first
            finally:
                conn.close()


def csr_pem(node: str, key: ec.EllipticCurvePrivateKey) -> bytes:
    """The request a kubelet makes for its client certificate."""
    subject = x509.Name([
        x509.NameAttribute(NameOID.ORGANIZATION_NAME, NODES_GROUP),
        x509.NameAttribute(NameOID.COMMON_NAME, f"system:node:{node}"),
    ])  # fmt: skip
    return (
        x509.CertificateSigningRequestBuilder()
        .subject_name(subject)
        .sign(key, hashes.SHA256())
        .public_bytes(serialization.Encoding.PEM)
    )


def _issued(obj: dict[str, Any]) -> str:
    status = obj.get("status")
    if not isinstance(status, dict):
        return ""
    if any(c.get("type") in ("Denied", "Failed") for c in status.get("conditions") or []):
        return "denied"
    return str(status.get("certificate") or "")


def join(url: str, ca: Path, token: Token, node: str, keys: Path) -> JoinResult:
    """One kubelet's bootstrap and registration (see the module doc); the key and certificate it
    gets are written under `keys`."""
    result = JoinResult(node, time.monotonic())
    try:
        _join(url, ca, token, node, keys, result)
    except Exception as e:  # a failed join is a measured outcome, not a crash
        result.error = f"{type(e).__name__}: {e}"
    result.finished = time.monotonic()
    return result


def _join(url: str, ca: Path, token: Token, node: str, keys: Path, result: JoinResult) -> None:
    key = ec.generate_private_key(ec.SECP256R1())
    request = {
        "apiVersion": "certificates.k8s.io/v1",
        "kind": "CertificateSigningRequest",
        "metadata": {"generateName": "node-csr-"},
        "spec": {
            "request": base64.b64encode(csr_pem(node, key)).decode(),
            "signerName": KUBELET_CLIENT_SIGNER,
            "usages": ["digital signature", "client auth"],
        },
    }
    bootstrap = Client(url, ssl.create_default_context(cafile=str(ca)), token.value)
    try:
        step, created = bootstrap.call("create csr", "POST", CSR_PATH, request)
        result.steps.append(step)
        if step.status != 201:
            raise RuntimeError(f"creating its CSR answered {step.status}: {created.get('message', '')}")
        name = created["metadata"]["name"]
        selector = urllib.parse.quote(f"metadata.name={name}")
        watch = f"{CSR_PATH}?watch=true&fieldSelector={selector}&timeoutSeconds={SIGNED_TIMEOUT_S}"
        step, issued = bootstrap.watch_until("watch csr", watch, _issued)
        result.steps.append(step)
    finally:
        bootstrap.close()
    if not issued or issued == "denied":
        raise RuntimeError(f"its CSR {name} was {'denied' if issued else 'not signed in time'}")
    key_file, cert_file = keys / f"{node}.key", keys / f"{node}.crt"
    key_file.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    cert_file.write_bytes(base64.b64decode(issued))
    context = ssl.create_default_context(cafile=str(ca))
    context.load_cert_chain(str(cert_file), str(key_file))
    kubelet = Client(url, context)
    try:
        node_object = {"apiVersion": "v1", "kind": "Node",
                       "metadata": {"name": node, "labels": {"kubernetes.io/hostname": node}}}  # fmt: skip
        step, created = kubelet.call("create node", "POST", "/api/v1/nodes", node_object)
        result.steps.append(step)
        if step.status != 201:
            raise RuntimeError(f"creating its Node answered {step.status}: {created.get('message', '')}")
        owner = {"apiVersion": "v1", "kind": "Node", "name": node, "uid": created["metadata"]["uid"]}
        lease = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": node, "namespace": LEASE_NAMESPACE, "ownerReferences": [owner]},
            "spec": {"holderIdentity": node, "leaseDurationSeconds": 40},
        }
        path = f"/apis/coordination.k8s.io/v1/namespaces/{LEASE_NAMESPACE}/leases"
        step, created = kubelet.call("create lease", "POST", path, lease)
        result.steps.append(step)
        if step.status != 201:
            raise RuntimeError(f"creating its Lease answered {step.status}: {created.get('message', '')}")
    finally:
        kubelet.close()


def apf_metrics(text: str, names: Sequence[str]) -> dict[tuple[str, str], float]:
    """The API server's APF metrics `names` in its /metrics `text`, by (name, priority level), summed
    over their other labels (flow schema, phase, type)."""
    totals: dict[tuple[str, str], float] = {}
    for line in text.splitlines():
        name, _, rest = line.partition("{")
        if name not in names:
            continue
        labels, _, value = rest.rpartition("} ")
        level = (
            labels.split('priority_level="', 1)[1].split('"', 1)[0] if 'priority_level="' in labels else ""
        )
        totals[(name, level)] = totals.get((name, level), 0.0) + float(value)
    return totals


def use_flow_control(
    kubectl: Callable[..., str], manifests: Sequence[dict[str, Any]], timeout: float = 60
) -> None:
    """Apply flow-control objects and wait until the API server's APF configuration controller has
    taken every FlowSchema among them (condition Dangling=False: it is in force, its level found)."""
    kubectl(
        "apply", "-f", "-", stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": list(manifests)})
    )
    schemas = [m["metadata"]["name"] for m in manifests if m["kind"] == "FlowSchema"]
    deadline = time.monotonic() + timeout
    while True:
        taken = []
        for name in schemas:
            conditions = json.loads(kubectl("get", "flowschema", name, "-o", "json")).get("status", {})
            dangling = {c["type"]: c["status"] for c in conditions.get("conditions") or []}.get("Dangling")
            taken.append(dangling == "False")
        if all(taken):
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"the API server did not take the flow schemas {schemas} in {timeout:.0f} s")
        time.sleep(0.2)


def storm(
    url: str,
    ca: Path,
    tokens: Sequence[Token],
    nodes: Sequence[str],
    concurrency: int,
    progress: Callable[[int, int], None] = lambda done, total: None,
    rate: float = 0.0,
) -> list[JoinResult]:
    """Every (token, node) joins, at most `concurrency` at a time: all released at once, or with
    `rate`, one every 1/rate seconds (nodes arriving as a paced scale-up sends them)."""
    results: list[JoinResult] = []
    with (
        tempfile.TemporaryDirectory(prefix="superkube-joins-") as keys,
        concurrent.futures.ThreadPoolExecutor(concurrency) as pool,
    ):
        futures = []
        released = time.monotonic()
        for i, (t, n) in enumerate(zip(tokens, nodes, strict=True)):
            if rate:
                time.sleep(max(0.0, released + i / rate - time.monotonic()))
            futures.append(pool.submit(join, url, ca, t, n, Path(keys)))
        for f in concurrent.futures.as_completed(futures):
            results.append(f.result())
            progress(len(results), len(futures))
    return results


def steady(url: str, ca: Path, cert: Path, key: Path, namespace: str, seconds: float, out: Path) -> None:
    """The steady client (see the module doc): one JSON line per request, {t, op, ms, status}."""
    context = ssl.create_default_context(cafile=str(ca))
    context.load_cert_chain(str(cert), str(key))
    client = Client(url, context, timeout=30)
    pods = f"/api/v1/namespaces/{namespace}/pods"
    configmap = f"/api/v1/namespaces/{namespace}/configmaps/steady"
    end = time.monotonic() + seconds
    n = 0
    with out.open("w") as log:
        while time.monotonic() < end:
            n += 1
            if n % 2:
                op, method, path, body = "list pods", "GET", pods, None
            else:
                body = {"apiVersion": "v1", "kind": "ConfigMap",
                        "metadata": {"name": "steady", "namespace": namespace}, "data": {"n": str(n)}}  # fmt: skip
                op, method, path = "write configmap", "PUT", configmap
            began = time.monotonic()
            try:
                step, _ = client.call(op, method, path, body)
                status = step.status if not step.throttled else 429
            except (OSError, http.client.HTTPException) as e:
                status = 0
                client.conn = client._connect()
                print(f"steady client: {e}", file=sys.stderr)
            elapsed = time.monotonic() - began
            log.write(json.dumps({"t": time.time(), "op": op, "ms": elapsed * 1000, "status": status}) + "\n")
            log.flush()
            time.sleep(0.02)
    client.close()


if __name__ == "__main__":
    if len(sys.argv) != 9 or sys.argv[1] != "steady":
        sys.exit(
            "usage: python -m superkube.harness.joins steady URL CA CERT KEY NAMESPACE SECONDS OUT.jsonl"
        )
    _, _, url_, ca_, cert_, key_, ns_, seconds_, out_ = sys.argv
    steady(url_, Path(ca_), Path(cert_), Path(key_), ns_, float(seconds_), Path(out_))
