"""The CrossGuard PolicyPack: every rule in policies/rules as a stack validation policy.

Constructing a PolicyPack starts the policy server, so only the Pulumi CLI runs this file;
tests and `superkube check` import policies.rules instead. Per-stack settings (limits, the
configured API-server count, advisory or disabled rules) come from the policy pack config that
`superkube policy-config --stack <name>` writes for `--policy-pack-config`.
"""

import sys
from pathlib import Path

from pulumi_policy import EnforcementLevel, PolicyConfigSchema, PolicyPack, Severity, StackValidationPolicy

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from policies.rules import ALL_RULES
from superkube.checks import PlanResource, Rule, RuleConfig, StackView

CONFIG_SCHEMA = PolicyConfigSchema(
    properties={
        "cluster": {"type": "string"},
        "apiserver_count": {"type": "integer"},
        "service_cidr": {"type": "string"},
        "other_spokes_ips": {"type": "integer"},
        "limits": {"type": "object"},
    }
)


def _view(args):  # type: ignore[no-untyped-def]
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


def _policy(rule: Rule) -> StackValidationPolicy:
    def validate(args, report_violation):  # type: ignore[no-untyped-def]
        config = RuleConfig.from_dict(args.get_config())
        for finding in rule.check(_view(args), config):
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


PolicyPack(
    name="superkube",
    enforcement_level=EnforcementLevel.MANDATORY,
    policies=[_policy(rule) for rule in ALL_RULES],
)
