"""Kubernetes objects as Pulumi resources: one typed pulumi-kubernetes resource per manifest.

Every component of the in-cluster layer builds its objects as plain manifests (the same dicts that
`superkube render` writes and validates), then `create` turns each into the typed resource class of
its apiVersion and kind, so the plan records the full manifest of every object and policies see it.
Custom resources (kinds pulumi-kubernetes has no class for) become `apiextensions.CustomResource`.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Iterable, Mapping
from typing import Any

import pulumi
import pulumi_kubernetes as k8s

PART_OF = "superkube"
Manifest = dict[str, Any]

_CAMEL = re.compile(r"(?<!^)(?=[A-Z])")


def labels(component: str, name: str) -> dict[str, str]:
    """The recommended labels every object of the layer carries."""
    return {
        "app.kubernetes.io/name": name,
        "app.kubernetes.io/component": component,
        "app.kubernetes.io/part-of": PART_OF,
        "app.kubernetes.io/managed-by": "pulumi",
    }


def restricted(user: int = 65532) -> dict[str, Any]:
    """The securityContext of every container of the layer that needs no privilege: a non-root
    user, a read-only root, no capabilities and no way to gain any."""
    return {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "runAsNonRoot": True,
        "runAsUser": user,
        "capabilities": {"drop": ["ALL"]},
    }


def meta(name: str, component: str, namespace: str | None = None, **extra: Any) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": name, "labels": labels(component, name)}
    if namespace:
        metadata["namespace"] = namespace
    metadata.update(extra)
    return metadata


def service_account_access(
    name: str, component: str, namespace: str, rules: list[dict[str, object]]
) -> list[Manifest]:
    """A ServiceAccount and the ClusterRole (with `rules`) bound to it, all named `name`."""
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta(name, component, namespace)},
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": meta(name, component),
            "rules": rules,
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": meta(name, component),
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
            "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": namespace}],
        },
    ]


def _resource_class(api_version: str, kind: str) -> Any:
    group, _, version = api_version.rpartition("/")
    package = group.split(".")[0] if group else "core"
    try:
        module = importlib.import_module(f"pulumi_kubernetes.{package}.{version}")
    except ModuleNotFoundError:
        return None
    return getattr(module, kind, None)


def _snake(key: str) -> str:
    return _CAMEL.sub("_", key).lower()


def resource_name(owner: str, manifest: Mapping[str, Any]) -> str:
    """Stable, unique Pulumi name: owner, kind, namespace and name of the object."""
    meta_ = manifest["metadata"]
    parts = [owner, manifest["kind"].lower(), meta_.get("namespace", ""), meta_["name"]]
    return "-".join(p for p in parts if p)


def create(
    owner: pulumi.ComponentResource,
    owner_name: str,
    manifests: Iterable[Manifest],
) -> list[pulumi.CustomResource]:
    """One resource per manifest, children of `owner` (whose dependencies and provider they inherit)."""
    created: list[pulumi.CustomResource] = []
    # the Kubernetes provider comes from the layer's `providers` option, inherited through `parent`
    opts = pulumi.ResourceOptions(parent=owner)
    for manifest in manifests:
        name = resource_name(owner_name, manifest)
        cls = _resource_class(manifest["apiVersion"], manifest["kind"])
        if cls is None:
            created.append(
                k8s.apiextensions.CustomResource(
                    name,
                    api_version=manifest["apiVersion"],
                    kind=manifest["kind"],
                    metadata=manifest["metadata"],
                    opts=opts,
                    **{k: v for k, v in manifest.items() if k not in ("apiVersion", "kind", "metadata")},
                )
            )
            continue
        kwargs = {_snake(k): v for k, v in manifest.items() if k not in ("apiVersion", "kind")}
        created.append(cls(name, **kwargs, opts=opts))
    return created
