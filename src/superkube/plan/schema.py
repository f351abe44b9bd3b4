"""Generate Pulumi.yaml's config declarations from ClusterSpec, so the two never drift apart."""

from __future__ import annotations

import typing
from pathlib import Path
from typing import Any

import yaml

from superkube.model.spec import ARRAY_KEYS, YAML_KEYS, ClusterSpec

HEADER = """\
# Generated from superkube.model.spec.ClusterSpec by `superkube config-schema --write`; edit the spec, not this.
# Pulumi types project config only as string, integer, boolean or array, so node_pools, peered_spokes
# and limit_overrides are YAML documents held in strings (write `node_pools: |` in a stack file), and
# a fraction (health_max_cordoned_share) is a string the program reads as a number.
"""


class _Dumper(yaml.SafeDumper):
    pass


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def _type_of(name: str) -> str:
    if name in YAML_KEYS:
        return "string"
    if name in ARRAY_KEYS:
        return "array"
    annotation = ClusterSpec.model_fields[name].annotation
    origin = typing.get_origin(annotation) or annotation
    # no "number": the Pulumi CLI refuses a project whose config declares one
    return {str: "string", int: "integer", float: "string", bool: "boolean"}[origin]


def _default(name: str) -> Any:
    field = ClusterSpec.model_fields[name]
    value = field.get_default(call_default_factory=True)
    if isinstance(value, float):
        return str(value)
    if name in YAML_KEYS and not isinstance(value, str):
        return (
            yaml.safe_dump(value, sort_keys=False) if value else ("[]" if isinstance(value, list) else "{}")
        )
    return value


def declarations() -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for name, field in ClusterSpec.model_fields.items():
        decl: dict[str, Any] = {"type": _type_of(name), "description": field.description}
        if decl["type"] == "array":
            decl["items"] = {"type": "string"}
        decl["default"] = _default(name)
        out[name] = decl
    return out


def pulumi_yaml() -> str:
    project = {
        "name": "superkube",
        "description": "GPU Kubernetes clusters of thousands of nodes on Azure: one stack per cluster.",
        "runtime": {"name": "python", "options": {"toolchain": "pip", "virtualenv": ".venv"}},
        "stackConfigDir": "stacks",
        "config": declarations(),
    }
    return HEADER + yaml.dump(project, Dumper=_Dumper, sort_keys=False, width=100, allow_unicode=True)


def write(project_dir: Path) -> Path:
    path = project_dir / "Pulumi.yaml"
    path.write_text(pulumi_yaml())
    return path
