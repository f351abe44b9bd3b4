"""What the agents' tests make on the real API server (the session's `api`, tests/conftest.py): nodes,
pods bound to them, service accounts and the tokens a kubelet would mint for a pod."""

from __future__ import annotations

import contextlib
import itertools
import json
import threading
import time
from collections.abc import Iterator
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any

from superkube.harness import apiserver
from superkube.harness.apiserver import LocalApi

_names = itertools.count()


def unique(prefix: str) -> str:
    """A name no other test of the session uses (they share one API server)."""
    return f"{prefix}-{next(_names)}"


def admin(api: LocalApi) -> Any:
    """CoreV1Api as the cluster admin."""
    from kubernetes import client, config

    return client.CoreV1Api(config.new_client_from_config(config_file=str(api.kubeconfig)))


def apply(api: LocalApi, *docs: dict[str, Any]) -> None:
    apiserver.kubectl(api, "apply", "--server-side", "--field-manager=test", "-f", "-",
                      stdin="\n---\n".join(json.dumps(d) for d in docs))  # fmt: skip


def make_node(
    api: LocalApi, name: str, labels: dict[str, str] | None = None, taints: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    """A Node as a kubelet registers it (no taints field at all when it has none)."""
    body: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": labels or {}},
    }
    core = admin(api)
    core.create_node(body)
    # the server taints a new node not-ready; the node lifecycle controller lifts that once the
    # kubelet reports Ready (none runs here): the node as it is in service, taints as asked
    core.patch_node(name, {"spec": {"taints": None}})
    if taints:
        core.patch_node(name, {"spec": {"taints": taints}})
    node: dict[str, Any] = core.api_client.sanitize_for_serialization(core.read_node(name))
    return node


def account(api: LocalApi, ns: str, name: str) -> None:
    """Service account `ns/name`, made if it is not there yet."""
    from kubernetes.client.exceptions import ApiException

    try:
        admin(api).create_namespaced_service_account(ns, {"metadata": {"name": name}})
    except ApiException as e:
        if e.status != 409:
            raise


def make_pod(api: LocalApi, namespace: str, name: str, node: str, **spec: Any) -> None:
    """A pod bound to `node` (no scheduler runs), running nothing."""
    core = admin(api)
    account(api, namespace, spec.get("service_account", "default"))
    body = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "nodeName": node,
            "serviceAccountName": spec.pop("service_account", "default"),
            "automountServiceAccountToken": False,
            "containers": [{"name": "c", "image": "registry.invalid/none:0"}],
            **spec,
        },
    }
    core.create_namespaced_pod(namespace, body)


def namespace(api: LocalApi, name: str, labels: dict[str, str] | None = None) -> str:
    """A namespace with its default service account (no controller-manager makes it here)."""
    core = admin(api)
    core.create_namespace({"metadata": {"name": name, "labels": labels or {}}})
    account(api, name, "default")
    return name


def identity(api: LocalApi, ns: str, name: str, node: str) -> Path:
    """A kubeconfig for service account `ns/name` as a pod on `node` holds it: a token bound to
    a pod there, which carries the node's name (what the agents' admission policies check)."""
    core = admin(api)
    pod = unique(f"{name}-on-{node}")
    make_pod(api, ns, pod, node, service_account=name)
    uid = core.read_namespaced_pod(pod, ns).metadata.uid
    request = {
        "spec": {
            "audiences": [apiserver.ISSUER],
            "expirationSeconds": 3600,
            "boundObjectRef": {"kind": "Pod", "apiVersion": "v1", "name": pod, "uid": uid},
        }
    }
    token = core.create_namespaced_service_account_token(name, ns, request).status.token
    return api.token_kubeconfig(pod, token)


@contextlib.contextmanager
def serving(server: ThreadingHTTPServer) -> Iterator[str]:
    """`server` answering on its loopback port in a thread while the block runs; its base URL."""
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def policy_loaded(api: LocalApi, delete: Any, prefix: str) -> None:
    """Wait until a delete policy just applied refuses: `refusal` retries an admitted call, which for
    a delete takes the node away, so the wait is on throwaway nodes, remade while they are admitted."""
    from kubernetes.client.exceptions import ApiException

    deadline = time.monotonic() + 15
    for i in itertools.count():
        probe = f"{prefix}-probe-{i}"
        make_node(api, probe)
        try:
            delete(probe)
        except ApiException as e:
            assert e.status == 403, (e.status, e.body)
            admin(api).delete_node(probe)
            return
        assert time.monotonic() < deadline, "admitted: the delete policy never refused"
        time.sleep(0.5)
