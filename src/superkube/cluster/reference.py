"""Component configs checked field by field and type by type against their release's reference.

`data/kubernetes/<minor>/<kind>.schema.json` are made from the release's own Go API types by
`scripts/k8s_config_reference.py`: a field the release does not have, or a value not of the field's
type or form (durations, taint effects, ...), is a problem. One line each: where, and what.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import jsonschema

DATA = Path(__file__).resolve().parents[3] / "data" / "kubernetes"
KINDS = {
    "KubeletConfiguration": "kubelet-config.v1beta1",
    "KubeProxyConfiguration": "kube-proxy-config.v1alpha1",
    "KubeSchedulerConfiguration": "kube-scheduler-config.v1",
}


class NoReference(Exception):
    """No reference is kept for this kind and version."""


@functools.cache
def _validator(minor: str, kind: str) -> jsonschema.Draft202012Validator:
    name = KINDS.get(kind)
    path = DATA / minor / f"{name}.schema.json"
    if name is None or not path.is_file():
        raise NoReference(
            f"no {kind} reference for Kubernetes {minor}: make it with scripts/k8s_config_reference.py"
        )
    return jsonschema.Draft202012Validator(json.loads(path.read_text()))


def minor_of(version: str) -> str:
    return ".".join(version.split(".")[:2])


def problems(document: Any, version: str) -> list[str]:
    """One line per field that the release does not know or whose value is not of its type."""
    kind = document.get("kind") if isinstance(document, dict) else None
    validator = _validator(minor_of(version), str(kind))
    out = []
    for error in sorted(validator.iter_errors(document), key=lambda e: list(e.absolute_path)):
        where = ".".join(str(p) for p in error.absolute_path) or "(top level)"
        if error.validator == "additionalProperties":
            extra = sorted(set(error.instance) - set(error.schema.get("properties", {})))
            out.append(f"{kind} {where}: {', '.join(extra)} is not a field of Kubernetes {minor_of(version)}")
        else:
            out.append(f"{kind} {where}: {error.message}")
    return out
