"""What superkube's node agents share for talking to the API server: the official client's few calls
they make, the Event they record each action with, and which errors mean "unreachable, try later"."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

EVENT_NAMESPACE = "default"  # where Events about cluster-scoped objects (nodes) live
MAX_MESSAGE = 1024  # the API server caps an Event's message at this many bytes


def now() -> datetime:
    return datetime.now(UTC)


def stamp(at: datetime) -> str:
    return at.strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True)
class PodRef:
    namespace: str
    name: str


def eviction(pod: PodRef) -> dict[str, Any]:
    return {
        "apiVersion": "policy/v1",
        "kind": "Eviction",
        "metadata": {"name": pod.name, "namespace": pod.namespace},
    }


def pointer(key: str) -> str:
    """A map key as a JSON Pointer token (RFC 6901)."""
    return key.replace("~", "~0").replace("/", "~1")


def annotate(node: Mapping[str, Any], key: str, value: str) -> list[dict[str, Any]]:
    """The JSON patch operation that sets one annotation of `node` (and makes the map if it has none)."""
    if (node.get("metadata") or {}).get("annotations") is None:
        return [{"op": "add", "path": "/metadata/annotations", "value": {key: value}}]
    return [{"op": "add", "path": f"/metadata/annotations/{pointer(key)}", "value": value}]


def node_probe(args: argparse.Namespace, log: logging.Logger) -> Callable[[], Any]:
    """The probe a node agent's options ask for; a bad thresholds file raises ReadingError."""
    from superkube.agents import gpu_probe

    if args.reading is None and args.expected_gpus == 0:  # a node without GPUs (a CPU pool's)
        return lambda: gpu_probe.Verdict(args.node, "healthy", [])
    limits = gpu_probe.thresholds(args.thresholds or gpu_probe.THRESHOLDS)
    return probe_of(
        args.node,
        args.vm_size,
        args.expected_gpus,
        args.reading,
        limits,
        args.dcgm_url,
        log,
        getattr(args, "burn_seconds", 0.0),
    )


def event(
    node: Mapping[str, Any], component: str, type_: str, reason: str, message: str, at: datetime
) -> dict[str, Any]:
    """A core/v1 Event about `node` from `component`."""
    meta = node.get("metadata") or {}
    name = meta.get("name", "")
    return {
        "apiVersion": "v1",
        "kind": "Event",
        # the server names it (the node's name and a random suffix, retried on a clash): a name made
        # from the time is the same for every Event of one round, and the server refuses the second
        "metadata": {"generateName": f"{name}.", "namespace": EVENT_NAMESPACE},
        "involvedObject": {"apiVersion": "v1", "kind": "Node", "name": name, "uid": meta.get("uid", "")},
        "type": type_,
        "reason": reason,
        "message": message[:MAX_MESSAGE],
        "source": {"component": component, "host": name},
        "reportingComponent": component,
        "reportingInstance": name,
        "firstTimestamp": stamp(at),
        "lastTimestamp": stamp(at),
        "count": 1,
    }


# statuses that mean "not now": too many requests, or the server (or what fronts it) failing
_RETRY_LATER = frozenset({429, 500, 502, 503, 504})


def unreachable(exc: BaseException) -> bool:
    """The API server could not be asked, or asked us to come back later: no connection, a timeout,
    TLS, 429 or a 5xx. Anything else the server says (403, 404, 409, 422...) is an answer, and a
    local error (a file that cannot be read) is no network error either."""
    from kubernetes.client.exceptions import ApiException
    from urllib3.exceptions import HTTPError

    if isinstance(exc, ApiException):
        return not exc.status or exc.status in _RETRY_LATER
    return isinstance(exc, HTTPError | ConnectionError | TimeoutError)


def refused(exc: BaseException) -> str:
    """What the API server answered, for a refusal (a 4xx other than 429): e.g. "403 Forbidden:
    nodes "a" is forbidden: ..."; empty for anything else."""
    from kubernetes.client.exceptions import ApiException

    if not isinstance(exc, ApiException) or unreachable(exc):
        return ""
    message = ""
    try:
        message = str(json.loads(exc.body or "{}").get("message", ""))
    except (ValueError, AttributeError):
        message = str(exc.body or "")[:200]
    return f"{exc.status} {exc.reason}: {message}".strip().rstrip(":")


class Kube:
    """The calls the agents make, through the official Kubernetes client."""

    def __init__(self, kubeconfig: str | None) -> None:
        from kubernetes import client, config

        if kubeconfig:
            config.load_kube_config(config_file=kubeconfig)
        else:
            config.load_incluster_config()
        api = client.ApiClient()
        api.configuration.retries = 0  # the agent's own backoff decides when to try again
        self.core = client.CoreV1Api(api)
        self.coordination = client.CoordinationV1Api(api)
        self.api = api

    def _plain(self, obj: Any) -> dict[str, Any]:
        data: dict[str, Any] = self.api.sanitize_for_serialization(obj)
        return data

    def node(self, name: str) -> dict[str, Any]:
        return self._plain(self.core.read_node(name, _request_timeout=10))

    def pods_on(self, node: str) -> list[dict[str, Any]]:
        items = self.core.list_pod_for_all_namespaces(
            field_selector=f"spec.nodeName={node}", _request_timeout=30
        ).items
        return [self._plain(p) for p in items]

    def nodes(self, selector: str) -> list[dict[str, Any]]:
        """The Nodes whose labels match `selector` (e.g. superkube.io/pool=gpu)."""
        items = self.core.list_node(label_selector=selector, _request_timeout=30).items
        return [self._plain(n) for n in items]

    def delete_node(self, name: str) -> bool:
        """Delete the Node; False when there was none."""
        from kubernetes.client.exceptions import ApiException

        try:
            self.core.delete_node(name, _request_timeout=30)
        except ApiException as e:
            if e.status == 404:
                return False
            raise
        return True

    def patch_node(self, name: str, body: Any) -> None:
        """A merge patch (a mapping) or a JSON patch (a list of operations) of the node."""
        self.core.patch_node(name, body, _request_timeout=10)

    def evict(self, pod: PodRef) -> bool:
        """True when the pod is being evicted; False when a PodDisruptionBudget holds it (429)."""
        from kubernetes.client.exceptions import ApiException

        try:
            body: Any = eviction(pod)  # the client serialises plain dicts as they are
            self.core.create_namespaced_pod_eviction(pod.name, pod.namespace, body, _request_timeout=10)
        except ApiException as e:
            if e.status == 429:
                return False
            if e.status == 404:  # gone already
                return True
            raise
        return True

    def create_event(self, body: Any) -> None:
        self.core.create_namespaced_event(EVENT_NAMESPACE, body, _request_timeout=10)


def serve(
    one_round: Callable[[], bool],
    api_up: Any,
    log: logging.Logger,
    interval: float,
    max_backoff: float,
    rounds: int | None = None,
) -> None:
    """Run `one_round` every `interval` seconds until it returns True (or `rounds` are done).
    - The API server cannot be reached (or says "later"): back off (doubling, to `max_backoff`) with
      `api_up` at 0 and one log line a try.
    - The server refused a request (403, 404, 409, 422...): it is up; one error line with its answer
      (a missing permission, an admission policy, a conflict) and the next round at the interval.
    - Anything else is a bug or a local fault (a file that cannot be read) and is raised."""
    delay, done = interval, 0
    while rounds is None or done < rounds:
        try:
            if one_round():
                return
            delay = interval
        except Exception as exc:  # classified here
            answer = refused(exc)
            if answer:
                api_up.set(1)
                delay = interval
                log.error("the API server refused a request: %s; next round in %.0f s", answer[:300], delay)
            elif unreachable(exc):
                api_up.set(0)
                delay = min(max(delay * 2, interval), max_backoff)
                log.error(
                    "API server unreachable (%s); next try in %.0f s", str(exc).splitlines()[0][:200], delay
                )
            else:
                raise
        done += 1
        if rounds is None or done < rounds:
            time.sleep(delay)


def probe_of(
    node: str,
    vm_size: str,
    expected_gpus: int,
    reading: Path | None,
    thresholds: Any,
    dcgm_url: str = "",
    log: logging.Logger | None = None,
    burn_seconds: float = 0.0,
) -> Callable[[], Any]:
    """The node's probe: NVML, or a saved reading (tests, incidents), with what the node's
    dcgm-exporter adds when `dcgm_url` is set, judged by `thresholds`. An exporter that cannot be
    read costs one log line and the reading goes on without it: it adds signals, never gates them.

    With `burn_seconds` (preflight and the periodic tests) a live reading also runs the active check
    (gpu_burn) for that long; a burn that cannot run is a fatal finding, since a node whose GPUs
    could not be exercised has not passed."""
    from superkube.agents import gpu_burn, gpu_probe

    def probe() -> gpu_probe.Verdict:
        got = (
            gpu_probe.load_reading(reading)
            if reading is not None
            else gpu_probe.read_nvml(node, vm_size, expected_gpus)
        )
        if dcgm_url:
            try:
                got = gpu_probe.merge_dcgm(got, gpu_probe.read_dcgm(dcgm_url), dcgm_url)
            except (OSError, gpu_probe.ReadingError) as e:
                (log or logging.getLogger(__name__)).warning("dcgm-exporter not read (%s); NVML only", e)
        failed = None
        if burn_seconds > 0 and reading is None:
            try:
                got = got.model_copy(update={"performance": gpu_burn.measure(burn_seconds)})
            except gpu_burn.BurnError as e:
                failed = gpu_probe.Finding("fatal", None, f"the active GPU check could not run: {e}")
        result = gpu_probe.verdict(got, thresholds)
        if failed is None:
            return result
        return gpu_probe.Verdict(result.node, "fatal", [*result.findings, failed])

    return probe


def base_parser(prog: str, description: str, metrics_port: int, interval: float) -> argparse.ArgumentParser:
    """The options every agent that talks to the API server takes: its rounds, its metrics, its client."""
    p = argparse.ArgumentParser(prog=prog, description=description)
    p.add_argument("--interval", type=float, default=interval, help="seconds between rounds")
    p.add_argument("--max-backoff", type=float, default=600.0)
    p.add_argument("--metrics-port", type=int, default=metrics_port)
    p.add_argument("--metrics-address", default="0.0.0.0")
    p.add_argument("--kubeconfig", default=None, help="default: the pod's service account")
    p.add_argument("--dry-run", action="store_true")
    p.add_argument("--rounds", type=int, default=None, help="stop after this many rounds (tests)")
    return p


def agent_parser(prog: str, description: str, metrics_port: int) -> argparse.ArgumentParser:
    """The options every node agent takes (each adds its own)."""
    p = base_parser(prog, description, metrics_port, interval=60.0)
    p.add_argument("--node", default=os.environ.get("NODE_NAME", ""), help="this node's name (env NODE_NAME)")
    p.add_argument("--vm-size", default=os.environ.get("VM_SIZE", ""))
    p.add_argument("--expected-gpus", type=int, default=int(os.environ.get("EXPECTED_GPUS", "0") or 0))
    p.add_argument("--reading", type=Path, help="a saved probe reading instead of NVML (tests, incidents)")
    p.add_argument(
        "--thresholds", type=Path, default=None, help="default: src/superkube/data/gpu_health.yaml"
    )
    p.add_argument(
        "--dcgm-url",
        default=os.environ.get("DCGM_URL", ""),
        help="the node's dcgm-exporter /metrics, whose Xid and error counters join NVML's (env DCGM_URL)",
    )
    return p


def add_burn_option(p: argparse.ArgumentParser) -> None:
    """The active check's option, for the agents that may burn a node (never the health agent,
    whose node runs jobs)."""
    p.add_argument(
        "--burn-seconds",
        type=float,
        default=0.0,
        help="run the active GPU check (matrix-multiply burn, bandwidth) this long each round; 0: none",
    )


def log_to_stderr(component: str) -> None:
    logging.basicConfig(
        level=logging.INFO, format=f"{component} %(levelname)s %(message)s", stream=sys.stderr
    )


def connect(component: str, args: argparse.Namespace, registry: Any) -> Kube | None:
    """Serve the agent's metrics, then load its client; None (after one line on stderr) when the
    client's config cannot be loaded."""
    from prometheus_client import start_http_server

    start_http_server(args.metrics_port, addr=args.metrics_address, registry=registry)
    try:
        return Kube(args.kubeconfig)
    except Exception as e:  # a config the client cannot load
        print(f"{component}: cannot load the Kubernetes client's config: {e}", file=sys.stderr)
        return None


def check_agent_args(
    p: argparse.ArgumentParser, args: argparse.Namespace, gpus_required: bool = True
) -> None:
    """The common options checked; `gpus_required`: the agent has nothing to do on a node without
    GPUs (preflight; the health agent also checks the host, so on a CPU node it reads no GPU)."""
    if not args.node:
        p.error("--node is required (or NODE_NAME)")
    if args.expected_gpus < 0 or (gpus_required and args.reading is None and args.expected_gpus < 1):
        p.error("reading NVML needs --vm-size and --expected-gpus >= 1")
    if args.reading is None and args.expected_gpus > 0 and not args.vm_size:
        p.error("reading NVML needs --vm-size and --expected-gpus >= 1")


def run_agent(
    component: str,
    log: logging.Logger,
    args: argparse.Namespace,
    metrics: Any,
    make_round: Callable[[Callable[[], Any], Kube], Callable[[], bool]],
) -> int:
    """Start an agent: its thresholds, its probe, its metrics server, the client, then its rounds.
    A bad thresholds file or reading, or a client config that cannot load, is one line and exit 2."""
    from superkube.agents import gpu_probe

    log_to_stderr(component)
    try:
        probe = node_probe(args, log)
    except gpu_probe.ReadingError as e:
        print(f"{component}: {e}", file=sys.stderr)
        return 2
    kube = connect(component, args, metrics.registry)
    if kube is None:
        return 2
    try:
        serve(make_round(probe, kube), metrics.api_up, log, args.interval, args.max_backoff, args.rounds)
    except (gpu_probe.ReadingError, OSError) as e:  # a reading or a local file: this node's fault, said once
        print(f"{component}: {e}", file=sys.stderr)
        return 2
    return 0
