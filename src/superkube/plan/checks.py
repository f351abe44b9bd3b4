"""Policy rules on a recorded plan: the evaluator `superkube check` runs, and its reports.

The rules (`policies/rules/`) are written against the contract in `superkube.model.policy` and know
nothing of this module; this module loads them, evaluates them on a plan and reports the verdict.
`policies/__main__.py` wraps the same rule functions in a CrossGuard PolicyPack.
"""

from __future__ import annotations

import difflib
import importlib
import json
import sys
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from superkube.model.ipam import AddressPlan
from superkube.model.policy import (
    Enforcement,
    Finding,
    PlanResource,
    Rule,
    RuleConfig,
    Severity,
    StackView,
)
from superkube.model.spec import NAMESPACE, ClusterSpec, PolicyOverride, SpecError
from superkube.plan import collector


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
