"""The in-cluster layer's Kubernetes objects, taken from the plan.

`superkube render` and `superkube check` both read the objects from the recorded plan, so what is
written and validated is exactly what `pulumi up` would send; `superkube.cluster.render` checks them
against the official schemas and writes them.
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from superkube.cluster.render import SECRET_TYPE_KEYS, Problem, holds_secret_data, name_of, redacted, validate
from superkube.model import teams
from superkube.plan.engine import Plan, Resource

_KIND = re.compile(r"(?<!^)(?=[A-Z])")


def is_object(resource: Resource) -> bool:
    return resource.custom and resource.type.startswith("kubernetes:")


def object_of(resource: Resource) -> dict[str, Any]:
    """The object as the plan holds it: apiVersion and kind first, a secret value as SECRET."""
    inputs = dict(resource.inputs)
    head = {"apiVersion": inputs.pop("apiVersion"), "kind": inputs.pop("kind")}
    return {**head, **inputs}


def manifest(resource: Resource) -> dict[str, Any]:
    """The object as the API server would receive it: apiVersion and kind first. A Secret's data is
    secret in the plan and stays out of it: it is shown empty (its keys and values never leave Pulumi)."""
    return redacted(object_of(resource))


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


def _as_planned(plan: Plan) -> dict[str, list[dict[str, Any]]]:
    """Every Kubernetes object of the plan as the plan holds it, by component (sorted), each in an
    order it can be applied in."""
    out: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for resource in plan.resources:
        if is_object(resource):
            out[component_of(plan, resource)].append(object_of(resource))
    # the foundation (namespace, classes) first, then the rest by name: the order files are applied in
    order = sorted(out, key=lambda c: (c != "foundation", c))
    return {component: sorted(out[component], key=_apply_rank) for component in order}


def objects(plan: Plan) -> dict[str, list[dict[str, Any]]]:
    """Every Kubernetes object of the plan, by component (sorted), each in an order it can be applied."""
    return {c: [redacted(o) for o in objs] for c, objs in _as_planned(plan).items()}


@dataclass(frozen=True)
class Withheld:
    """An object `render` leaves out: a Secret whose data only `pulumi up` has, which written with its
    data empty a real API server would refuse or hold empty."""

    component: str
    obj: str
    type: str
    stack: str

    @property
    def fix(self) -> str:
        """How the stack is given the secret this Secret's data comes from ("" when not known here)."""
        if self.obj.endswith(f"/{teams.WEBHOOK_TLS_SECRET}"):
            return teams.set_webhook_tls(self.stack)
        return ""

    def __str__(self) -> str:
        keys = SECRET_TYPE_KEYS.get(self.type)
        holds = f"its data ({', '.join(keys)})" if keys else "its data"
        return (
            f"{self.component}: {self.obj} ({self.type}): {holds} is a secret of the stack, which the plan "
            "does not hold and pulumi up sends"
            + (f"; set it, once converge has written it: {self.fix}" if self.fix else "")
        )


def written(plan: Plan) -> tuple[dict[str, list[dict[str, Any]]], list[Withheld]]:
    """What `superkube render` writes (`objects`, less the Secrets whose data only Pulumi holds), and
    those Secrets: written with their data empty, a real API server refuses one whose type requires
    keys (a kubernetes.io/tls Secret without tls.crt) and holds any other empty."""
    out: dict[str, list[dict[str, Any]]] = {}
    withheld: list[Withheld] = []
    for component, objs in _as_planned(plan).items():
        for obj in objs:
            if holds_secret_data(obj):
                withheld.append(
                    Withheld(component, name_of(obj), str(obj.get("type") or "Opaque"), plan.stack)
                )
        kept = [o for o in objs if not holds_secret_data(o)]
        if kept:
            out[component] = kept
    return out, withheld


def file_names(components: list[str]) -> dict[str, str]:
    """Numbered so that `kubectl apply -f DIR` (which goes by file name) applies them in order."""
    return {c: f"{i:02d}-{c}.yaml" for i, c in enumerate(components)}


def problems(plan: Plan, kubernetes_version: str) -> list[Problem]:
    """Every object as the plan holds it, checked: a Secret's data the plan holds as secret is not
    known here, and so not missing (`pulumi up` sends it; what `render` writes is checked by itself)."""
    found: list[Problem] = []
    for resource in plan.resources:
        if is_object(resource):
            found += validate(object_of(resource), kubernetes_version, component_of(plan, resource))
    return found
