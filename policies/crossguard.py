"""Each superkube rule as a CrossGuard stack policy. Importing this starts nothing."""

from __future__ import annotations

from typing import Any

from pulumi_policy import EnforcementLevel, PolicyConfigSchema, Severity, StackValidationPolicy

from superkube.model.policy import PlanResource, Rule, RuleConfig, StackView

CONFIG_SCHEMA = PolicyConfigSchema(
    properties={
        "cluster": {"type": "string"},
        "apiserver_count": {"type": "integer"},
        "service_cidr": {"type": "string"},
        "other_spokes_ips": {"type": "integer"},
        "limits": {"type": "object"},
        "inventory": {"type": "object"},
        "group_vars": {"type": "object"},
        "kubernetes_version": {"type": "string"},
        "safe_join_rate_per_minute": {"type": "integer"},
        "autoscaler_enabled": {"type": "boolean"},
    }
)


def view_of(args: Any) -> StackView:
    """CrossGuard's resources as the rules see them (props are the same camelCase inputs)."""
    return StackView(
        PlanResource(
            urn=r.urn,
            type=r.resource_type,
            name=r.name,
            props=dict(r.props),
            parent=r.parent.urn if r.parent else None,
            dependencies=tuple(d.urn for d in r.dependencies),
        )
        for r in args.resources
    )


def to_policy(rule: Rule) -> StackValidationPolicy:
    def validate(args: Any, report_violation: Any) -> None:
        config = RuleConfig.from_dict(args.get_config())
        for finding in rule.check(view_of(args), config):
            report_violation(finding.message, finding.urn)

    return StackValidationPolicy(
        name=rule.name,
        description=rule.description,
        enforcement_level=EnforcementLevel(rule.enforcement),
        validate=validate,
        severity=Severity(rule.severity),
        remediation_steps=rule.remediation,
        config_schema=CONFIG_SCHEMA,
    )
