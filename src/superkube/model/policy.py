"""The contract a policy rule is written against, below both the rules and the evaluator.

A rule (`policies/rules/`) is a plain function over a `StackView` (the stack's resources with their
input properties, as both the mock engine and CrossGuard see them) and a `RuleConfig` made from the
stack's config, yielding a `Finding` per violation; `Rule` names it, with its severity and the fix.
The rules import this module and nothing of `superkube.plan`; `superkube.plan.checks` loads the
rules and evaluates them, and `policies/crossguard.py` wraps them for the Pulumi CLI.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from superkube.model.ipam import AZURE_LIMITS

Severity = Literal["critical", "high", "medium", "low"]
Enforcement = Literal["mandatory", "advisory", "disabled"]
TAGLESS_TYPES = frozenset(
    {
        "azure-native:network:Subnet",
        "azure-native:network:VirtualNetworkPeering",
        "azure-native:network:Route",
        "azure-native:authorization:RoleAssignment",
        "azure-native:authorization:RoleDefinition",
        "azure-native:network:SecurityRule",
    }
)


@dataclass(frozen=True)
class PlanResource:
    """What a rule sees of a resource; built from a recorded plan or from CrossGuard's PolicyResource."""

    urn: str
    type: str
    name: str
    props: Mapping[str, Any]
    parent: str | None = None
    dependencies: tuple[str, ...] = ()

    @property
    def tags(self) -> Mapping[str, str]:
        return self.props.get("tags") or {}

    @property
    def role(self) -> str | None:
        return self.tags.get("superkube-role")

    @property
    def capacity(self) -> int:
        """The most VMs a scale set may hold: its planned capacity, autoscaler maximum or SKU count."""
        counts = [
            self.tags.get("superkube-capacity"),
            self.tags.get("max"),
            (self.props.get("sku") or {}).get("capacity"),
        ]
        return max((int(str(c)) for c in counts if str(c or "").isdigit()), default=0)


@dataclass(frozen=True)
class RuleConfig:
    """What the rules need beyond the resources, derived from the stack's config."""

    cluster: str = ""
    apiserver_count: int = 5
    service_cidr: str = ""
    other_spokes_ips: int = 0
    limits: Mapping[str, int] = field(default_factory=lambda: {k: v[0] for k, v in AZURE_LIMITS.items()})
    # the Ansible side: the stack's Azure dynamic inventory (superkube inventory) and any group
    # variables a team adds over the roles' defaults
    inventory: Mapping[str, Any] = field(default_factory=dict)
    group_vars: Mapping[str, Any] = field(default_factory=dict)
    # the in-cluster layer: the schemas its objects are checked against, and the join rate the API
    # servers are trusted with
    kubernetes_version: str = "1.35.0"
    safe_join_rate_per_minute: int = 300
    autoscaler_enabled: bool = True
    # monitoring: every Prometheus shard's rendered config, the alert rules and their promtool tests
    # (superkube.cluster.monitoring.bundle)
    monitoring: Mapping[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "limits": dict(self.limits)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RuleConfig:
        known = {
            k: data[k]
            for k in (
                "cluster",
                "apiserver_count",
                "service_cidr",
                "other_spokes_ips",
                "inventory",
                "group_vars",
                "kubernetes_version",
                "safe_join_rate_per_minute",
                "autoscaler_enabled",
                "monitoring",
            )
            if k in data
        }
        limits = {k: v[0] for k, v in AZURE_LIMITS.items()} | dict(data.get("limits") or {})
        return cls(**known, limits=limits)


class StackView:
    """Resources of one stack with the lookups rules keep needing."""

    def __init__(self, resources: Iterable[PlanResource]) -> None:
        self.resources = list(resources)
        self._by_type: dict[str, list[PlanResource]] = {}
        for r in self.resources:
            self._by_type.setdefault(r.type, []).append(r)

    def of_type(self, type_: str) -> list[PlanResource]:
        return self._by_type.get(type_, [])

    def with_role(self, type_: str, role: str) -> list[PlanResource]:
        return [r for r in self.of_type(type_) if r.role == role]

    def vnet_roles(self) -> dict[str, str]:
        """VNet name -> hub or spoke, from the VNets' role tags."""
        return {
            v.props.get("virtualNetworkName", v.name): v.role or "unknown"
            for v in self.of_type("azure-native:network:VirtualNetwork")
        }

    def nic_of_vm(self, vm: PlanResource) -> PlanResource | None:
        ids = [n.get("id", "") for n in (vm.props.get("networkProfile") or {}).get("networkInterfaces", [])]
        names = {i.rsplit("/", 1)[-1] for i in ids if isinstance(i, str)}
        for nic in self.of_type("azure-native:network:NetworkInterface"):
            if nic.props.get("networkInterfaceName") in names:
                return nic
        return None


def vnet_of(subnet_id: str) -> str:
    """The VNet name in a subnet ID `.../virtualNetworks/<vnet>/subnets/<subnet>`."""
    parts = subnet_id.split("/")
    return parts[parts.index("virtualNetworks") + 1] if "virtualNetworks" in parts else ""


def subnet_of(subnet_id: str) -> str:
    return subnet_id.rsplit("/", 1)[-1]


def networks(prefixes: Iterable[str]) -> list[ipaddress.IPv4Network]:
    return [ipaddress.IPv4Network(p, strict=False) for p in prefixes]


@dataclass(frozen=True)
class Finding:
    """One violation: which resource, what is wrong."""

    message: str
    urn: str | None = None


Check = Callable[[StackView, RuleConfig], Iterator[Finding]]


@dataclass(frozen=True)
class Rule:
    name: str  # <area>-<resource>-<rule>
    severity: Severity
    description: str
    remediation: str
    check: Check
    enforcement: Enforcement = "mandatory"

    @property
    def area(self) -> str:
        return self.name.split("-", 1)[0]
