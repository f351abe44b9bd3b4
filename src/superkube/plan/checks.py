"""Policy rules on a recorded plan: the engine `superkube check` and the CrossGuard pack share.

Rules are plain functions over a `StackView` (the stack's resources with their input properties,
as both the mock engine and CrossGuard see them) and a `RuleConfig` made from the stack's config.
`policies/rules/` holds the rules; `policies/__main__.py` wraps the same functions in a PolicyPack.
"""

from __future__ import annotations

import difflib
import importlib
import ipaddress
import json
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from superkube.model.ipam import AZURE_LIMITS, AddressPlan
from superkube.model.spec import NAMESPACE, ClusterSpec, PolicyOverride, SpecError
from superkube.plan import collector

Severity = Literal["critical", "high", "medium", "low"]
Enforcement = Literal["mandatory", "advisory", "disabled"]
TAGLESS_TYPES = frozenset(
    {
        "azure-native:network:Subnet",
        "azure-native:network:VirtualNetworkPeering",
        "azure-native:network:Route",
        "azure-native:authorization:RoleAssignment",
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


@dataclass(frozen=True)
class Violation:
    rule: str
    severity: Severity
    enforcement: Enforcement
    message: str
    urn: str | None
    resource: str
    remediation: str


@dataclass(frozen=True)
class RuleOutcome:
    rule: Rule
    enforcement: Enforcement
    reason: str | None  # why a stack made the rule advisory or disabled
    violations: tuple[Violation, ...]


@dataclass
class Report:
    stack: str
    cluster: str
    outcomes: list[RuleOutcome]
    source: str  # the stack file or plan file the verdict is about

    @property
    def violations(self) -> list[Violation]:
        return [v for o in self.outcomes for v in o.violations]

    @property
    def mandatory(self) -> list[Violation]:
        return [v for v in self.violations if v.enforcement == "mandatory"]

    @property
    def passed(self) -> bool:
        return not self.mandatory


def load_rules(project: Path) -> list[Rule]:
    """The rules in `<project>/policies/rules`, in their declared order."""
    if str(project) not in sys.path:
        sys.path.insert(0, str(project))
    module = importlib.import_module("policies.rules")
    rules: list[Rule] = list(module.ALL_RULES)
    return rules


def check_overrides(overrides: Mapping[str, PolicyOverride], rules: Iterable[Rule]) -> None:
    """Every rule a stack relaxes must exist, so a typo never silently keeps a rule on."""
    names = [r.name for r in rules]
    for name in overrides:
        if name not in names:
            close = difflib.get_close_matches(name, names, n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise SpecError(
                f"{NAMESPACE}:policy_overrides.{name}",
                "is not a rule",
                f"{hint}`superkube check --list` shows every rule",
            )


def rule_config(
    spec: ClusterSpec, addresses: AddressPlan, group_vars: Mapping[str, Any] | None = None
) -> RuleConfig:
    """The rules' config from a stack's validated spec and address plan."""
    from superkube.cluster import monitoring
    from superkube.cluster.inventory import azure_rm

    return RuleConfig(
        inventory=azure_rm(spec, addresses),
        group_vars=dict(group_vars or {}),
        cluster=addresses.cluster,
        apiserver_count=spec.apiserver_count,
        kubernetes_version=spec.kubernetes_version,
        safe_join_rate_per_minute=spec.safe_join_rate_per_minute,
        autoscaler_enabled=spec.autoscaler_enabled,
        service_cidr=spec.service_cidr,
        other_spokes_ips=sum(p.ips for p in spec.peered_spokes.values()),
        limits={name: limit.value for name, limit in addresses.limits.items()},
        monitoring=monitoring.bundle(spec, addresses, addresses.cluster),
    )


def evaluate(
    view: StackView,
    rules: Iterable[Rule],
    config: RuleConfig,
    overrides: Mapping[str, PolicyOverride] | None = None,
    *,
    stack: str = "",
    source: str = "",
) -> Report:
    overrides = overrides or {}
    names = {r.urn: r.name for r in view.resources}
    outcomes = []
    with collector.paused():
        for rule in rules:
            override = overrides.get(rule.name)
            enforcement: Enforcement = override.enforcement if override else rule.enforcement
            findings: list[Finding] = [] if enforcement == "disabled" else list(rule.check(view, config))
            outcomes.append(
                RuleOutcome(
                    rule=rule,
                    enforcement=enforcement,
                    reason=override.reason if override else None,
                    violations=tuple(
                        Violation(
                            rule=rule.name,
                            severity=rule.severity,
                            enforcement=enforcement,
                            message=f.message,
                            urn=f.urn,
                            resource=names.get(f.urn, "(stack)") if f.urn else "(stack)",
                            remediation=rule.remediation,
                        )
                        for f in findings
                    ),
                )
            )
    return Report(stack=stack, cluster=config.cluster, outcomes=outcomes, source=source)


def view_from_plan_document(document: Mapping[str, Any]) -> StackView:
    """A StackView of a plan saved by `superkube plan --output json`."""
    return StackView(
        PlanResource(
            urn=r["urn"],
            type=r["type"],
            name=r["name"],
            props=r.get("inputs") or {},
            parent=r.get("parent"),
            dependencies=tuple(r.get("dependencies") or ()),
        )
        for r in document["resources"]
    )


# --- reports -------------------------------------------------------------------------------------

SARIF_LEVEL = {"mandatory": "error", "advisory": "warning", "disabled": "none"}


def to_json(report: Report) -> str:
    return json.dumps(
        {
            "stack": report.stack,
            "cluster": report.cluster,
            "passed": report.passed,
            "summary": summary(report),
            "rules": [
                {
                    "rule": o.rule.name,
                    "severity": o.rule.severity,
                    "enforcement": o.enforcement,
                    "reason": o.reason,
                    "violations": [asdict(v) for v in o.violations],
                }
                for o in report.outcomes
            ],
        },
        indent=2,
    )


def summary(report: Report) -> str:
    rules = len(report.outcomes)
    disabled = sum(1 for o in report.outcomes if o.enforcement == "disabled")
    mandatory = len(report.mandatory)
    advisory = len(report.violations) - mandatory
    verdict = "PASS" if report.passed else "FAIL"
    return (
        f"{verdict}: {rules - disabled} of {rules} rules checked on {report.cluster or report.stack}: "
        f"{mandatory} mandatory and {advisory} advisory violations"
    )


def to_sarif(report: Report, tool_version: str) -> str:
    rules = [o.rule for o in report.outcomes]
    index = {r.name: i for i, r in enumerate(rules)}
    results = [
        {
            "ruleId": v.rule,
            "ruleIndex": index[v.rule],
            "level": SARIF_LEVEL[v.enforcement],
            "message": {"text": f"{v.resource}: {v.message}"},
            "locations": [
                {
                    "physicalLocation": {
                        "artifactLocation": {"uri": report.source},
                        "region": {"startLine": 1},
                    },
                    "logicalLocations": [{"fullyQualifiedName": v.urn or report.stack, "kind": "resource"}],
                }
            ],
            "properties": {"severity": v.severity},
        }
        for v in report.violations
    ]
    run = {
        "tool": {
            "driver": {
                "name": "superkube",
                "version": tool_version,
                "informationUri": "https://github.com/superkube/superkube",
                "rules": [
                    {
                        "id": r.name,
                        "name": r.name,
                        "shortDescription": {"text": r.description},
                        "help": {"text": r.remediation},
                        "defaultConfiguration": {"level": SARIF_LEVEL[r.enforcement]},
                        "properties": {"severity": r.severity, "tags": [r.area]},
                    }
                    for r in rules
                ],
            }
        },
        "results": results,
    }
    document = {"version": "2.1.0", "$schema": "https://json.schemastore.org/sarif-2.1.0.json", "runs": [run]}
    return json.dumps(document, indent=2)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def to_markdown(report: Report) -> str:
    lines = [f"**superkube check** `{report.stack}`: {summary(report)}", ""]
    if report.violations:
        lines += ["| rule | resource | what is wrong | how to fix |", "| --- | --- | --- | --- |"]
        for v in report.violations:
            rule = v.rule if v.enforcement == "mandatory" else f"{v.rule} ({v.enforcement})"
            lines.append(
                f"| `{rule}` | `{_cell(v.resource)}` | {_cell(v.message)} | {_cell(v.remediation)} |"
            )
        lines.append("")
    relaxed = [o for o in report.outcomes if o.reason]
    if relaxed:
        lines.append("Rules this stack relaxes:")
        lines += [f"- `{o.rule.name}` is {o.enforcement}: {o.reason}" for o in relaxed]
        lines.append("")
    return "\n".join(lines)


def plan_wiring(plan: Any) -> Any:
    """The hosts of a recorded plan (`superkube.plan.engine.Plan`) over the inventory that
    `superkube inventory` writes for it, with no group variables of a team's: a
    `superkube.cluster.wiring.Wiring` that renders the roles as a converge would."""
    from superkube.cluster import inventory, wiring

    view = StackView(
        PlanResource(r.urn, r.type, r.name, r.inputs, r.parent, tuple(r.dependencies)) for r in plan.resources
    )
    return wiring.Wiring(wiring.plan_hosts(view.resources), inventory.azure_rm(plan.spec, plan.addresses))
