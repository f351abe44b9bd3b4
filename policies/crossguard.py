"""Each superkube rule as a CrossGuard stack policy. Importing this starts nothing."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
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


SERVER_METADATA = (
    "uid",
    "resourceVersion",
    "generation",
    "creationTimestamp",
    "managedFields",
    "selfLink",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
)
"""What the API server writes into an object's metadata: in its outputs, never in what was declared."""


def plain(value: Any) -> Any:
    """A value as plain dicts and lists: pulumi_policy hands stack policies read-only Mapping and
    Sequence proxies, which the rules (and jsonschema's type checks) do not take for objects and arrays."""
    if isinstance(value, Mapping):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, Sequence) and not isinstance(value, str | bytes):
        return [plain(v) for v in value]
    return value


def declared(type_: str, props: dict[str, Any]) -> dict[str, Any]:
    """A resource's props as the plan records them. A stack policy sees each resource's outputs; for
    a Kubernetes object that exists those are the live object, with the status and metadata the API
    server writes, which are no part of what the program declared (and `status` no part of what a
    rule may judge): dropped. Found by running the pack on the real engine (bench/pulumi_up.py)."""
    if not type_.startswith("kubernetes:"):
        return props
    out = {k: _dashed(v) for k, v in props.items() if k != "status"}
    metadata = out.get("metadata")
    if isinstance(metadata, dict):
        out["metadata"] = {k: v for k, v in metadata.items() if k not in SERVER_METADATA}
    return out


def _dashed(value: Any) -> Any:
    """The provider's outputs spell a CRD schema's `x-kubernetes-*` keys `x_kubernetes_*` (its schema's
    property names); the object declared, and the one the API server holds, use the dashes."""
    if isinstance(value, dict):
        return {
            (k.replace("_", "-") if k.startswith("x_kubernetes_") else k): _dashed(v)
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [_dashed(v) for v in value]
    return value


INTEGER_CONFIG = ("apiserver_count", "other_spokes_ips", "safe_join_rate_per_minute")


def config_of(args: Any) -> RuleConfig:
    """The policy-pack config as `superkube policy-config` wrote it. It reaches the pack through a
    protobuf Struct, which holds every number as a float: the whole numbers are made whole again."""
    config = dict(plain(args.get_config()))
    for key in INTEGER_CONFIG:
        if isinstance(config.get(key), float) and config[key].is_integer():
            config[key] = int(config[key])
    if isinstance(config.get("limits"), dict):
        config["limits"] = {
            k: int(v) if isinstance(v, float) and v.is_integer() else v for k, v in config["limits"].items()
        }
    return RuleConfig.from_dict(config)


def view_of(args: Any) -> StackView:
    """CrossGuard's resources as the rules see them: plain values, a Kubernetes object as declared."""
    return StackView(
        PlanResource(
            urn=r.urn,
            type=r.resource_type,
            name=r.name,
            props=declared(r.resource_type, plain(r.props)),
            parent=r.parent.urn if r.parent else None,
            dependencies=tuple(d.urn for d in r.dependencies),
        )
        for r in args.resources
    )


def to_policy(rule: Rule) -> StackValidationPolicy:
    def validate(args: Any, report_violation: Any) -> None:
        config = config_of(args)
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
