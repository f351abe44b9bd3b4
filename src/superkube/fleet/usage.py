"""Network use per namespace and pod, read from the metrics store.

Each node's iptables exporter counts bytes as `iptables_rule_bytes_total`, labelled `traffic`
(internet-out, internet-in, internal-out, internal-in) and, for a pod's own rules, `namespace` and
`pod`; the node's rules carry neither. Over a window the store's `increase()` gives the bytes each
pod sent and received, summed here by namespace (or by pod) and traffic; the node's rules are left
out. The store is anything that speaks Prometheus' query API: a Prometheus server, single-node
VictoriaMetrics (the lab's), or a VictoriaMetrics cluster's vmselect (production's).

Every way a query can fail (no answer, an HTTP error, the store refusing the query, an answer that is
not the API's) is a `StoreError` of one line that names the store and where its address came from.
"""

from __future__ import annotations

import http.client
import io
import json
import math
import re
import shlex
import subprocess
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from superkube.cluster.kube import METRICS_STORE, MONITORING, VMSELECT_PORT
from superkube.fleet.converge import PLAYBOOKS
from superkube.fleet.usage_options import TRAFFIC, By, Sort

if TYPE_CHECKING:
    pass

METRIC = "iptables_rule_bytes_total"
QUERY_TIMEOUT_S = 30.0
"""How long one query may take, connecting included (the stores' own limit is 2 minutes)."""


class StoreError(Exception):
    """The store could not be asked, or its answer was not one: one line."""


class UsageError(Exception):
    """A user error in what was asked (the window, the namespace): one line."""


# Prometheus' duration syntax: units from years down to milliseconds, each at most once, in order
_DURATION = re.compile(r"(?:(\d+)y)?(?:(\d+)w)?(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?(?:(\d+)ms)?")
_UNIT_S = (365 * 86400, 7 * 86400, 86400, 3600, 60, 1, 0.001)
_NAMESPACE = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")  # a DNS label, as Kubernetes names one


def window_seconds(window: str) -> float:
    """The seconds a window in Prometheus' duration syntax spans (`1h`, `90m`, `1h30m`, `7d`)."""
    found = _DURATION.fullmatch(window)
    seconds = (
        sum(int(n) * unit for n, unit in zip(found.groups(), _UNIT_S, strict=True) if n)
        if found and window
        else 0
    )
    if not seconds:
        raise UsageError(
            f"--window {window!r}: not a duration; write it as Prometheus does, a number and a unit "
            "(ms, s, m, h, d, w, y), largest unit first: 30m, 1h, 1h30m, 7d"
        )
    return seconds


def check_namespace(namespace: str) -> str:
    if not _NAMESPACE.fullmatch(namespace):
        raise UsageError(
            f"--namespace {namespace!r}: not a Kubernetes namespace name (lower-case letters, digits "
            "and '-', at most 63, starting and ending with a letter or digit)"
        )
    return namespace


def query(window: str, by: By, namespace: str | None = None, cluster: str | None = None) -> str:
    """The PromQL for the bytes each namespace (or pod) sent and received per traffic over `window`:
    only series with a namespace, so the node's own rules stay out."""
    window_seconds(window)
    matchers = ['namespace!=""']
    if namespace is not None:
        matchers.append(f'namespace="{check_namespace(namespace)}"')
    if cluster:
        matchers.append(f"cluster={json.dumps(cluster)}")  # a PromQL string is escaped as JSON's is
    labels = "namespace, pod, traffic" if by is By.pod else "namespace, traffic"
    return f"sum by ({labels}) (increase({METRIC}{{{', '.join(matchers)}}}[{window}]))"


@dataclass(frozen=True)
class Use:
    """The bytes one namespace (or one pod, `pod` set) sent and received over the window."""

    namespace: str
    pod: str
    bytes: Mapping[str, float]
    """traffic -> bytes, every one of TRAFFIC"""

    @property
    def internet(self) -> float:
        return self.bytes["internet-out"] + self.bytes["internet-in"]

    @property
    def internal(self) -> float:
        return self.bytes["internal-out"] + self.bytes["internal-in"]

    @property
    def total(self) -> float:
        return self.internet + self.internal

    def key(self, sort: Sort) -> float:
        if sort in (Sort.total, Sort.internet, Sort.internal):
            return float(getattr(self, sort.value))
        return self.bytes[sort.value]

    def as_dict(self, by: By) -> dict[str, Any]:
        named = {"namespace": self.namespace, **({"pod": self.pod} if by is By.pod else {})}
        return {
            **named,
            **{t.replace("-", "_"): round(self.bytes[t]) for t in TRAFFIC},
            "internet": round(self.internet),
            "internal": round(self.internal),
            "total": round(self.total),
        }


@dataclass(frozen=True)
class Store:
    """A metrics store's Prometheus query API at `url` (queries go to `<url>/api/v1/query`), reached
    directly or through `proxy`: an SSH-style ProxyCommand (`%h` and `%p` its host and port) that
    carries the connection, as it carries Ansible's to the same hosts."""

    url: str
    source: str
    """where the address came from, for messages: "--store", "stack dev", "inventory <path>"."""
    proxy: str = ""
    cluster: str | None = None
    """the `cluster` label this store's series are read under; None: every cluster it holds"""
    timeout: float = field(default=QUERY_TIMEOUT_S, compare=False)

    @property
    def where(self) -> str:
        return f"metrics store {self.url} ({self.source})"

    def query(self, expr: str) -> list[dict[str, Any]]:
        """The instant vector `expr` evaluates to now: its samples as the API gives them."""
        try:
            parts = urllib.parse.urlsplit(self.url)
            port = parts.port or (443 if parts.scheme == "https" else 80)
        except ValueError as exc:
            raise StoreError(f"{self.where}: not a URL ({exc}); give one like http://HOST:9090") from None
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise StoreError(f"{self.where}: not an http:// or https:// URL; give one like http://HOST:9090")
        path = f"{parts.path.rstrip('/')}/api/v1/query?{urllib.parse.urlencode({'query': expr})}"
        if self.proxy:
            status, reason, body = self._through_proxy(parts, port, path)
        else:
            status, reason, body = self._direct(parts, path)
        return self._vector(status, reason, body)

    def _direct(self, parts: urllib.parse.SplitResult, path: str) -> tuple[int, str, bytes]:
        request = urllib.request.Request(
            f"{parts.scheme}://{parts.netloc}{path}", headers={"Accept": "application/json"}
        )
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as answer:
                return answer.status, answer.reason, answer.read()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.reason, exc.read()
        except (urllib.error.URLError, OSError, http.client.HTTPException) as exc:
            raise StoreError(
                f"{self.where}: unreachable ({_reason(exc)}): is the store up, and is this its address?"
            ) from None

    def _through_proxy(self, parts: urllib.parse.SplitResult, port: int, path: str) -> tuple[int, str, bytes]:
        if parts.scheme != "http":
            raise StoreError(f"{self.where}: only http:// is spoken through a ProxyCommand")
        host = parts.hostname or ""
        command = re.sub(r"%[%hp]", lambda m: {"%%": "%", "%h": host, "%p": str(port)}[m[0]], self.proxy)
        request = (
            f"GET {path} HTTP/1.0\r\nHost: {parts.netloc}\r\nAccept: application/json\r\n"
            "Connection: close\r\n\r\n"
        ).encode()
        try:
            proc = subprocess.run(
                ["sh", "-c", command], input=request, capture_output=True, timeout=self.timeout
            )
        except subprocess.TimeoutExpired:
            raise StoreError(f"{self.where}: unreachable: no answer in {self.timeout:.0f} s") from None
        if not proc.stdout:
            said = proc.stderr.decode(errors="replace").strip().splitlines() or [f"exit {proc.returncode}"]
            raise StoreError(f"{self.where}: unreachable through ProxyCommand {command!r}: {said[-1]}")
        answer = http.client.HTTPResponse(_Replay(proc.stdout))  # type: ignore[arg-type]
        try:
            answer.begin()
            return answer.status, answer.reason, answer.read()
        except (http.client.HTTPException, OSError, ValueError) as exc:
            raise StoreError(f"{self.where}: answered, but not in HTTP: {_reason(exc)}") from None

    def _vector(self, status: int, reason: str, body: bytes) -> list[dict[str, Any]]:
        try:
            doc = json.loads(body)
        except ValueError:
            doc = None
        if status >= 400 or (isinstance(doc, dict) and doc.get("status") == "error"):
            if isinstance(doc, dict) and doc.get("error"):
                kind = f" ({doc['errorType']})" if doc.get("errorType") else ""
                raise StoreError(f"{self.where}: refused the query{kind}: {doc['error']}")
            raise StoreError(
                f"{self.where}: HTTP {status} {reason}; is this a Prometheus query API? (Prometheus: "
                "http://HOST:9090; VictoriaMetrics: http://HOST:8428, or a cluster's "
                f"http://HOST:{VMSELECT_PORT}/select/0/prometheus)"
            )
        data = doc.get("data") if isinstance(doc, dict) else None
        if not isinstance(data, dict) or data.get("resultType") != "vector":
            raise StoreError(f"{self.where}: malformed answer: {_glimpse(body)} is not a query's vector")
        result = data.get("result")
        if not isinstance(result, list) or not all(_is_sample(s) for s in result):
            raise StoreError(
                f"{self.where}: malformed answer: {_glimpse(body)} holds a sample that is not one"
            )
        return result


class _Replay:
    """A connection's whole answer, as the socket `http.client` reads a response from."""

    def __init__(self, raw: bytes) -> None:
        self.raw = raw

    def makefile(self, mode: str) -> io.BytesIO:
        return io.BytesIO(self.raw)


def _is_sample(sample: Any) -> bool:
    if not isinstance(sample, dict) or not isinstance(sample.get("metric"), dict):
        return False
    value = sample.get("value")
    if not isinstance(value, list) or len(value) != 2 or not isinstance(value[1], str):
        return False
    try:
        return math.isfinite(float(value[1])) and float(value[1]) >= 0
    except ValueError:
        return False


def _glimpse(body: bytes) -> str:
    text = " ".join(body.decode(errors="replace").split())
    return repr(text[:80] + ("..." if len(text) > 80 else ""))


def _reason(exc: BaseException) -> str:
    reason = getattr(exc, "reason", None) or exc
    return str(reason) or type(reason).__name__


def usage(
    store: Store, window: str, by: By = By.namespace, namespace: str | None = None, sort: Sort = Sort.total
) -> list[Use]:
    """Every namespace's (or pod's) use over `window`, most bytes (of `sort`) first, then by name."""
    found: dict[tuple[str, str], dict[str, float]] = {}
    for sample in store.query(query(window, by, namespace, store.cluster)):
        labels = sample["metric"]
        traffic = labels.get("traffic", "")
        if traffic not in TRAFFIC or not labels.get("namespace"):
            continue  # a kind of traffic this command does not know, or a node's own rule
        name = (labels["namespace"], labels.get("pod", "") if by is By.pod else "")
        counted = found.setdefault(name, dict.fromkeys(TRAFFIC, 0.0))
        counted[traffic] += float(sample["value"][1])
    uses = [Use(ns, pod, counted) for (ns, pod), counted in found.items()]
    return sorted(uses, key=lambda u: (-u.key(sort), u.namespace, u.pod))


# --- where the store is: a stack's, or that of the fleet an inventory lists -----------------------


def inventory_store(path: Path) -> Store | None:
    """The store of the fleet an inventory lists (a lab's, or any YAML inventory of hosts): the lab's
    single-node store on its first monitoring host, else vmselect on the first metrics store host;
    reached through the ProxyCommand Ansible's SSH uses, if it has one. None when it lists neither
    (an Azure dynamic inventory's config lists no hosts)."""
    try:
        inventory = yaml.safe_load(path.read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return None
    everything = inventory.get("all") if isinstance(inventory, dict) else None
    if not isinstance(everything, dict):
        return None
    given = everything.get("vars")
    variables: dict[str, Any] = given if isinstance(given, dict) else {}
    role = yaml.safe_load((PLAYBOOKS / "roles" / "monitoring" / "defaults" / "main.yml").read_text())
    monitoring, stores = _hosts(everything, MONITORING), _hosts(everything, METRICS_STORE)
    if variables.get("monitoring_single_node_store") and monitoring:
        # the monitoring role's single-node store (the lab's inventory sets it) on its first host
        url = (
            f"http://{monitoring[0]}:{variables.get('monitoring_store_port', role['monitoring_store_port'])}"
        )
    elif stores:
        url = f"http://{stores[0]}:{VMSELECT_PORT}/select/0/prometheus"
    else:
        return None
    cluster = variables.get("superkube_cluster")
    return Store(
        url,
        f"inventory {path}",
        proxy=_proxy_command(str(variables.get("ansible_ssh_common_args", ""))),
        cluster=str(cluster) if cluster else None,
    )


def _hosts(group: dict[str, Any], name: str) -> list[str]:
    """The addresses of group `name`'s hosts, looked for among `group`'s children at any depth."""
    children = group.get("children")
    if not isinstance(children, dict):
        return []
    for child, body in children.items():
        body = body if isinstance(body, dict) else {}
        if child == name and isinstance(body.get("hosts"), dict):
            return [
                str(v.get("ansible_host", h)) if isinstance(v, dict) else h for h, v in body["hosts"].items()
            ]
        if found := _hosts(body, name):
            return found
    return []


def _proxy_command(ssh_args: str) -> str:
    """The ProxyCommand among SSH's `-o` options, "" when none."""
    try:
        words = shlex.split(ssh_args)
    except ValueError:
        return ""
    for word in words:
        key, _, value = word.removeprefix("-o").partition("=")
        if key.lower() == "proxycommand" and value.strip().lower() != "none":
            return value.strip()
    return ""
