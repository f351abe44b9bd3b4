"""Join credentials at boot: a short-lived bootstrap token in each node scale set's custom data.

A new scale-set instance joins with nothing but its image and its custom data: cloud-init writes the
bootstrap kubeconfig (the API servers' address, the cluster CA, a bootstrap token) where the join
unit waits for it, and the kubelet's TLS bootstrap does the rest. No converge has to reach the node.

The token is not Pulumi's: the program plans custom data without credentials (Pulumi keeps every
input in its state for as long as the stack lives), and the join-token publisher
(`superkube.agents.join_tokens`, on the API-server hosts) issues a token with an expiration, then
writes each scale set's model with the plan's document plus this one file. Azure hands the model's
custom data to instances it creates from then on; instances already running keep what they booted
with, which no longer matters once they hold a node certificate.

The threat model (docs/01-operating-on-azure.md, "New instances join by themselves") rests on three
facts kept here: every token the publisher issues expires (`MAX_TTL_S`), the file is root's alone
(`KUBECONFIG_MODE`), and the token's group grants only the node-bootstrapper role and the
auto-approval of node client certificates. (Converge's own token, from the kube_pki and
kube_apiserver roles, expires too: within `kube_pki_bootstrap_token_hours`, at most a day.)

This module ships to the API-server hosts with the publisher (the join_tokens role): it imports only
the standard library and PyYAML.
"""

from __future__ import annotations

import base64
import re
import secrets
import string
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import yaml

BOOTSTRAP_KUBECONFIG = "/etc/kubernetes/bootstrap-kubelet.conf"
"""Where the kubelet's bootstrap kubeconfig lies on a node: the join unit starts on its arrival."""
TOKEN_TYPE = "bootstrap.kubernetes.io/token"
TOKEN_NAMESPACE = "kube-system"
TOKEN_PATTERN = re.compile(r"\b([a-z0-9]{6})\.([a-z0-9]{16})\b")
"""A bootstrap token as the API server accepts it: `<id>.<secret>`, [a-z0-9]{6}.[a-z0-9]{16}."""
PUBLISHER = "superkube-join-tokens"
"""The publisher's Kubernetes user (its certificate from the controller's PKI) and its Lease's name."""
DOCUMENTS_CONFIGMAP = "superkube-node-documents"
"""The ConfigMap (in superkube's namespace) the in-cluster layer keeps of the plan's custom data: one
key per node scale set, its #cloud-config document without credentials. `pulumi up` updates it with
the plan; the publisher writes what it holds, plus the token, into each scale set's model."""
PUBLISHER_NAMESPACE = "superkube-system"
"""Where that ConfigMap and the publisher's Lease live (superkube.cluster.kube.SYSTEM_NAMESPACE)."""
PUBLISHED_LABEL = "superkube.io/join-token"
"""On the token Secrets the publisher makes, valued with the cluster's name: the ones it rotates."""
JOIN_GROUP = "system:bootstrappers:superkube"
"""The extra group of every join token (the kube_apiserver role binds it to node bootstrap and the
auto-approval of node client certificates); must start with `system:bootstrappers:`."""
KUBECONFIG_MODE = "0600"
KUBECONFIG_USER = "kubelet-bootstrap"

MAX_TTL_S = 24 * 3600
"""No join token lives longer than a day: a leaked one lets its holder make node identities until
it expires, and revocation (deleting its Secret) needs someone to notice."""
DEFAULT_TTL_S = 4 * 3600
DEFAULT_ROTATE_S = 3600
"""A new token each hour, each valid for four: an instance Azure creates from the model just before
a rotation still has three hours to boot and join (a GPU VM boots in minutes)."""

_CHARS = string.ascii_lowercase + string.digits


@dataclass(frozen=True)
class Token:
    """A bootstrap token: `<id>.<secret>`, [a-z0-9]{6}.[a-z0-9]{16}."""

    id: str
    secret: str

    @property
    def value(self) -> str:
        return f"{self.id}.{self.secret}"

    @classmethod
    def parse(cls, value: str) -> Token:
        m = TOKEN_PATTERN.fullmatch(value.strip())
        if not m:
            raise ValueError("not a bootstrap token (<6 of a-z0-9>.<16 of a-z0-9>)")
        return cls(m.group(1), m.group(2))


def new_token() -> Token:
    """A token from the system's randomness (id and secret as kubeadm makes them)."""
    return Token(
        "".join(secrets.choice(_CHARS) for _ in range(6)), "".join(secrets.choice(_CHARS) for _ in range(16))
    )


MIN_LEFT_S = 15 * 60
"""A model's token has at least this long left when the next one replaces it: an instance Azure
creates from the model just before then still has time to boot and join."""


def check_lifetime(ttl_s: float, rotate_s: float, interval_s: float = 60.0) -> None:
    """Refuse a token that would never expire or outlive `MAX_TTL_S`, and a rotation that could
    leave a model's token with less than `MIN_LEFT_S` (plus a round) when the next replaces it."""
    if ttl_s <= 0:
        raise ValueError("ttl_s must be above 0: a join token must expire")
    if ttl_s > MAX_TTL_S:
        raise ValueError(f"ttl_s {ttl_s:.0f} is above {MAX_TTL_S} (a day): a join token must be short-lived")
    if interval_s <= 0:
        raise ValueError(f"interval_s {interval_s:.0f} must be above 0")
    if not interval_s <= rotate_s <= ttl_s - MIN_LEFT_S - interval_s:
        raise ValueError(
            f"rotate_s {rotate_s:.0f} must be at least interval_s ({interval_s:.0f}) and leave each token "
            f"{MIN_LEFT_S} s and a round before ttl_s {ttl_s:.0f}: at most {ttl_s - MIN_LEFT_S - interval_s:.0f}"
        )


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def encode(document: str) -> str:
    """Custom data as Azure takes it: the document, base64."""
    return _b64(document)


def stamp(at: datetime) -> str:
    return at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def token_secret(token: Token, expires: datetime, cluster: str, group: str = JOIN_GROUP) -> dict[str, Any]:
    """The token's Secret in kube-system, with its expiration: past it the API server refuses the
    token and the controller-manager's tokencleaner deletes the Secret."""
    if not group.startswith("system:bootstrappers:"):
        raise ValueError(
            f"group {group!r}: a bootstrap token's extra groups must start with system:bootstrappers:"
        )
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": f"bootstrap-token-{token.id}",
            "namespace": TOKEN_NAMESPACE,
            "labels": {PUBLISHED_LABEL: cluster},
        },
        "type": TOKEN_TYPE,
        "data": {
            "description": _b64(f"superkube join token for {cluster}'s new instances (custom data)"),
            "token-id": _b64(token.id),
            "token-secret": _b64(token.secret),
            "expiration": _b64(stamp(expires)),
            "usage-bootstrap-authentication": _b64("true"),
            "auth-extra-groups": _b64(group),
        },
    }


def expiration(secret: Mapping[str, Any]) -> datetime | None:
    """A token Secret's expiration (None: it has none, and never expires)."""
    raw = (secret.get("data") or {}).get("expiration")
    if not raw:
        return None
    text = base64.b64decode(raw).decode()
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def secret_token(secret: Mapping[str, Any]) -> Token:
    data = secret.get("data") or {}
    return Token(base64.b64decode(data["token-id"]).decode(), base64.b64decode(data["token-secret"]).decode())


def bootstrap_kubeconfig(server: str, ca_pem: str, token: Token, cluster: str) -> str:
    """The kubelet's bootstrap kubeconfig, self-contained: the CA inline, the token as its user."""
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {"name": cluster, "cluster": {"server": server, "certificate-authority-data": _b64(ca_pem)}}
        ],
        "users": [{"name": KUBECONFIG_USER, "user": {"token": token.value}}],
        "contexts": [
            {"name": f"{KUBECONFIG_USER}@{cluster}", "context": {"cluster": cluster, "user": KUBECONFIG_USER}}
        ],
        "current-context": f"{KUBECONFIG_USER}@{cluster}",
    }
    return yaml.safe_dump(config, sort_keys=False)


def with_credentials(document: str, kubeconfig: str) -> str:
    """The plan's #cloud-config `document` with the bootstrap kubeconfig added as root's file (the
    join unit waits for that path), and nothing else changed."""
    if not document.startswith("#cloud-config\n"):
        raise ValueError("not a #cloud-config document")
    doc = yaml.safe_load(document)
    files = [f for f in doc.get("write_files") or [] if f.get("path") != BOOTSTRAP_KUBECONFIG]
    files.append(
        {"path": BOOTSTRAP_KUBECONFIG, "permissions": KUBECONFIG_MODE, "owner": "root:root",
         "content": kubeconfig}
    )  # fmt: skip
    doc["write_files"] = files
    return "#cloud-config\n" + yaml.safe_dump(doc, sort_keys=False, width=1_000)


def credentials_in(doc: Mapping[str, Any]) -> list[str]:
    """What a decoded #cloud-config document carries that grants cluster access: a bootstrap
    kubeconfig, a bootstrap token or a private key anywhere in its files (empty: none)."""
    found = []
    for f in doc.get("write_files") or []:
        path, content = str(f.get("path", "")), str(f.get("content", ""))
        if path == BOOTSTRAP_KUBECONFIG:
            found.append(f"{path} (the bootstrap kubeconfig)")
        elif TOKEN_PATTERN.search(content):
            found.append(f"{path} (a bootstrap token)")
        elif "PRIVATE KEY-----" in content:
            found.append(f"{path} (a private key)")
    return found


def joining_file(doc: Mapping[str, Any]) -> Mapping[str, Any] | None:
    for f in doc.get("write_files") or []:
        if f.get("path") == BOOTSTRAP_KUBECONFIG:
            return f
    return None


def now() -> datetime:
    return datetime.now(UTC)


def later(at: datetime, seconds: float) -> datetime:
    return at + timedelta(seconds=seconds)
