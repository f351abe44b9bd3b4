"""The in-cluster layer's Kubernetes objects, taken from the plan.

`superkube render` and `superkube check` both read the objects from the recorded plan, so what is
written and validated is exactly what `pulumi up` would send; `superkube.cluster.render` checks them
against the official schemas and writes them.
"""

from __future__ import annotations

import re
from collections import defaultdict
from typing import Any

from superkube.cluster.render import Problem, redacted, validate
from superkube.plan.engine import Plan, Resource

_KIND = re.compile(r"(?<!^)(?=[A-Z])")


def is_object(resource: Resource) -> bool:
    return resource.custom and resource.type.startswith("kubernetes:")


def manifest(resource: Resource) -> dict[str, Any]:
    """The object as the API server would receive it: apiVersion and kind first. A Secret's data is
    secret in the plan and stays out of it: it is shown empty (its keys and values never leave Pulumi)."""
    inputs = dict(resource.inputs)
    head = {"apiVersion": inputs.pop("apiVersion"), "kind": inputs.pop("kind")}
    return redacted({**head, **inputs})


def component_of(plan: Plan, resource: Resource) -> str:
    """The component an object belongs to: its parent's type, e.g. superkube:platform:Autoscaler -> autoscaler."""
    if resource.parent:
        try:
            parent = plan.by_urn(resource.parent)
        except KeyError:
            return "objects"
        return _KIND.sub("-", parent.type.rsplit(":", 1)[-1]).lower()
    return "objects"


# The order objects can be applied in: what others live in or refer to first, workloads last.
APPLY_ORDER = (
    "Namespace",
    "CustomResourceDefinition",
    "PriorityClass",
    "PriorityLevelConfiguration",
    "FlowSchema",
    "ServiceAccount",
    "ClusterRole",
    "ClusterRoleBinding",
    "Role",
    "RoleBinding",
    "ConfigMap",
    "Secret",
    "Service",
)


def _apply_rank(obj: dict[str, Any]) -> tuple[int, str, str]:
    kind = obj.get("kind", "")
    rank = APPLY_ORDER.index(kind) if kind in APPLY_ORDER else len(APPLY_ORDER)
    meta = obj.get("metadata") or {}
    return rank, meta.get("namespace", ""), meta.get("name", "")


def objects(plan: Plan) -> dict[str, list[dict[str, Any]]]:
    """Every Kubernetes object of the plan, by component (sorted), each in an order it can be applied."""
    out: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for resource in plan.resources:
        if is_object(resource):
            out[component_of(plan, resource)].append(manifest(resource))
    # the foundation (namespace, classes) first, then the rest by name: the order files are applied in
    order = sorted(out, key=lambda c: (c != "foundation", c))
    return {component: sorted(out[component], key=_apply_rank) for component in order}


def file_names(components: list[str]) -> dict[str, str]:
    """Numbered so that `kubectl apply -f DIR` (which goes by file name) applies them in order."""
    return {c: f"{i:02d}-{c}.yaml" for i, c in enumerate(components)}


def problems(plan: Plan, kubernetes_version: str) -> list[Problem]:
    found: list[Problem] = []
    for component, objs in objects(plan).items():
        for obj in objs:
            found += validate(obj, kubernetes_version, component)
    return found
