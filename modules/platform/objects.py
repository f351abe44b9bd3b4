"""Kubernetes objects as Pulumi resources: one pulumi-kubernetes resource per manifest.

Every component of the in-cluster layer builds its objects as plain manifests (the same dicts that
`superkube render` writes and validates), then `create` registers each under the Kubernetes
provider's type token for its apiVersion and kind (`kubernetes:apps/v1:Deployment`), so the plan
records the full manifest of every object and policies see it.

The token and the manifest are all the provider reads: pulumi-kubernetes' typed classes register
exactly these, adding type aliases for API versions older than any cluster superkube supports, and
making a Secret's data secret, which `create` does too. Importing the typed classes costs a plan
about half a second (each API group's module defines every kind's input types); registering the
manifest directly costs nothing.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

import pulumi

PART_OF = "superkube"
Manifest = dict[str, Any]


def label_value(name: str) -> str:
    """An object's name as a label value: RBAC names like `superkube:gang-scheduler` carry a colon,
    which no label value may (the API server refuses the object), nor more than 63 characters."""
    return re.sub(r"[^A-Za-z0-9_.-]", "-", name)[:63].strip("-_.")


def labels(component: str, name: str) -> dict[str, str]:
    """The recommended labels every object of the layer carries."""
    return {
        "app.kubernetes.io/name": label_value(name),
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


def daemonset(name: str, component: str, namespace: str, pod: dict[str, Any]) -> Manifest:
    """A DaemonSet of `pod` (a pod spec) named `name`, rolled out a tenth of its nodes at a time."""
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": meta(name, component, namespace),
        "spec": {
            "selector": {"matchLabels": {"app.kubernetes.io/name": label_value(name)}},
            "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": "10%"}},
            "template": {"metadata": {"labels": labels(component, name)}, "spec": pod},
        },
    }


def type_token(api_version: str, kind: str) -> str:
    """The Kubernetes provider's type of a kind: the core group is `core`, every other its full name."""
    return f"kubernetes:{api_version if '/' in api_version else 'core/' + api_version}:{kind}"


SECRET_FIELDS = ("data", "stringData")


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
        props: dict[str, Any] = dict(manifest)
        options = opts
        if manifest["apiVersion"] == "v1" and manifest["kind"] == "Secret":
            props.update({k: pulumi.Output.secret(v) for k, v in manifest.items() if k in SECRET_FIELDS})
            options = pulumi.ResourceOptions.merge(
                opts, pulumi.ResourceOptions(additional_secret_outputs=list(SECRET_FIELDS))
            )
        created.append(
            pulumi.CustomResource(
                type_token(manifest["apiVersion"], manifest["kind"]),
                resource_name(owner_name, manifest),
                props,
                options,
            )
        )
    return created
