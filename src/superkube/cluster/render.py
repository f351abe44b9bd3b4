"""Kubernetes objects as superkube writes them: checked against official schemas, written as stable YAML.

Built-in kinds are validated with the official OpenAPI schemas of the cluster's Kubernetes version
(kubernetes-validate, strict: an unknown field fails); custom resources against their CRD's
`openAPIV3Schema` kept under data/crds/. The in-cluster layer's objects come from the plan
(`superkube.plan.layer`); a job's from `superkube.cluster.jobs`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import yaml

CRDS = Path(__file__).resolve().parents[3] / "data" / "crds"
SECRET = "[secret]"
"""How a secret value shows in a plan and in what is rendered from it: never its value."""


@dataclass(frozen=True)
class Problem:
    """One invalid object: which, where in it, and why, as one line."""

    component: str
    obj: str
    field: str
    reason: str

    def __str__(self) -> str:
        return f"{self.component}: {self.obj}: {self.field or '(object)'}: {self.reason}"


def redacted(obj: dict[str, Any]) -> dict[str, Any]:
    """A Secret whose data the plan holds as secret, with that data shown empty."""
    if not holds_secret_data(obj):
        return obj
    return {**obj, **{k: {} for k in ("data", "stringData") if obj.get(k) == SECRET}}


def holds_secret_data(obj: dict[str, Any]) -> bool:
    """A Secret whose data the plan holds as secret: the keys and values are Pulumi's to send, and
    nothing rendered from the plan has them."""
    return obj.get("kind") == "Secret" and SECRET in (obj.get("data"), obj.get("stringData"))


# What the API server requires of a Secret of each built-in type beyond its schema (apimachinery's
# ValidateSecret): the data keys it must carry. stringData counts, as the server merges it into data.
SECRET_TYPE_KEYS: dict[str, tuple[str, ...]] = {
    "kubernetes.io/tls": ("tls.crt", "tls.key"),
    "kubernetes.io/dockerconfigjson": (".dockerconfigjson",),
    "kubernetes.io/dockercfg": (".dockercfg",),
    "kubernetes.io/ssh-auth": ("ssh-privatekey",),
}
SERVICE_ACCOUNT_NAME = "kubernetes.io/service-account.name"


def secret_problems(obj: dict[str, Any]) -> list[tuple[str, str]]:
    """(field, reason) for what an API server would refuse in a Secret of a built-in type that its
    schema allows: a key its type requires, missing from its data (`data[tls.crt]: Required value`).
    A Secret whose data the plan holds as secret has keys not known here, so none are missing."""
    if obj.get("kind") != "Secret" or obj.get("apiVersion") != "v1" or holds_secret_data(obj):
        return []
    kind = str(obj.get("type") or "Opaque")
    keys = {str(k) for part in ("data", "stringData") if isinstance(obj.get(part), dict) for k in obj[part]}
    if kind == "kubernetes.io/basic-auth" and not keys & {"username", "password"}:
        return [("data[username]", f"Required value: a {kind} Secret needs data username or password")]
    if kind == "kubernetes.io/service-account-token":
        annotations = (obj.get("metadata") or {}).get("annotations") or {}
        if SERVICE_ACCOUNT_NAME not in annotations:
            return [
                (
                    f"metadata.annotations[{SERVICE_ACCOUNT_NAME}]",
                    f"Required value: a {kind} Secret names its service account",
                )
            ]
    needs = SECRET_TYPE_KEYS.get(kind, ())
    return [
        (f"data[{key}]", f"Required value: a {kind} Secret needs data {' and '.join(needs)}")
        for key in needs
        if key not in keys
    ][:1]


def name_of(obj: dict[str, Any]) -> str:
    meta = obj.get("metadata") or {}
    where = f"{meta.get('namespace')}/" if meta.get("namespace") else ""
    return f"{obj.get('kind')}/{where}{meta.get('name')}"


@cache
def crd_schemas() -> dict[tuple[str, str], dict[str, Any]]:
    """(apiVersion, kind) -> openAPIV3Schema of every CRD kept under data/crds/."""
    schemas: dict[tuple[str, str], dict[str, Any]] = {}
    if not CRDS.is_dir():
        return schemas
    for path in sorted(CRDS.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if not doc or doc.get("kind") != "CustomResourceDefinition":
                continue
            group, kind = doc["spec"]["group"], doc["spec"]["names"]["kind"]
            for version in doc["spec"]["versions"]:
                schemas[(f"{group}/{version['name']}", kind)] = version["schema"]["openAPIV3Schema"]
    return schemas


def _strict(schema: Any) -> Any:
    """A CRD schema that rejects unknown fields, as the API server's pruning would silently drop them.

    Wherever properties are listed and the schema does not keep unknown fields
    (x-kubernetes-preserve-unknown-fields) or describe a map (additionalProperties), no other field
    is allowed. `metadata` is left open: the API server owns its schema.
    """
    if isinstance(schema, list):
        return [_strict(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: _strict(v) for k, v in schema.items()}
    if (
        "properties" in schema
        and "additionalProperties" not in schema
        and not schema.get("x-kubernetes-preserve-unknown-fields")
    ):
        out["additionalProperties"] = False
        if "metadata" in out["properties"]:
            out["properties"]["metadata"] = {"type": "object"}
    return out


def _path(parts: Any) -> str:
    out = ""
    for part in parts:
        out += f"[{part}]" if isinstance(part, int) else f".{part}"
    return out.lstrip(".")


def _reason(error: Any) -> str:
    if error.validator == "additionalProperties":
        return f"unknown field: {error.message}"
    return str(error.message).splitlines()[0]


@cache
def _definitions(schema_dir: str) -> Any:
    import kubernetes_validate.utils as kv_utils
    from referencing import Resource as SchemaResource

    return SchemaResource.from_contents(
        kv_utils.schema_contents(f"kubernetes-json-schema/{schema_dir}/_definitions.json", schema_dir)
    )


def is_builtin_group(api_version: str) -> bool:
    """Kubernetes' own API groups: the core group, the dotless ones (apps, batch, policy...) and
    *.k8s.io, but not the SIGs' *.x-k8s.io, whose kinds are CRDs. The schema files are named by the
    group's first label only, so without this scheduling.x-k8s.io's PodGroup (a CRD) would be checked
    against the alpha scheduling.k8s.io PodGroup of Kubernetes 1.35."""
    group = api_version.rpartition("/")[0]
    return "." not in group or (group.endswith(".k8s.io") and not group.endswith(".x-k8s.io"))


@cache
def _builtin_validator(api_version: str, kind: str, kubernetes_version: str) -> Any:
    """The strict validator of one built-in kind, built once (the package's own `validate` reloads
    and re-resolves its ~5 MB of definitions on every call); None if the release has no such kind.

    Schema files and their naming are kubernetes-validate's: the newest schema set not newer than the
    cluster's minor, `<kind>-<group>-<version>.json` in its `-local-strict` directory."""
    import jsonschema
    import kubernetes_validate.utils as kv_utils
    from referencing import Registry
    from referencing import Resource as SchemaResource

    wanted = kv_utils.major_minor(kubernetes_version)
    if kv_utils.Version(wanted) > kv_utils.Version(kv_utils.latest_version()):
        raise kv_utils.VersionNotSupportedError(version=wanted)
    version = [
        v
        for v in kv_utils.all_versions()
        if kv_utils.Version(kv_utils.major_minor(v)) <= kv_utils.Version(wanted)
    ][-1]
    schema_dir = f"v{version}-local-strict"
    if not is_builtin_group(api_version):
        return None
    group = re.sub(r"^([^./]*)(?:\.[^/]*)?/", r"\1-", api_version)
    try:
        schema = kv_utils.schema_contents(
            f"kubernetes-json-schema/{schema_dir}/{kind.lower()}-{group}.json", wanted
        )
    except FileNotFoundError:
        return None
    registry = _definitions(schema_dir) @ (SchemaResource.from_contents(schema) @ Registry())
    return jsonschema.validators.Draft202012Validator(schema, registry=registry)


# What the API server accepts as a label (apimachinery's validation; the OpenAPI schemas say only
# "a map of strings"): a value of at most 63 characters, alphanumerics with - _ . inside; a key the
# same, optionally behind a DNS subdomain prefix and a slash.
_LABEL_NAME = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


def label_problems(labels: dict[str, Any]) -> list[str]:
    """What the API server would refuse in a labels map (empty when it accepts them all)."""
    found = []
    for key, value in labels.items():
        prefix, _, name = str(key).rpartition("/")
        if not (0 < len(name) <= 63 and _LABEL_NAME.fullmatch(name)) or (
            prefix and not (len(prefix) <= 253 and _DNS_SUBDOMAIN.fullmatch(prefix))
        ):
            found.append(f"label key {key!r} is not a valid label key")
        if not isinstance(value, str) or len(value) > 63 or (value and not _LABEL_NAME.fullmatch(value)):
            found.append(
                f"label {key}={value!r}: a value is at most 63 characters, alphanumerics with - _ . inside"
            )
    return found


def _label_maps(value: Any, path: tuple[str | int, ...] = ()) -> Iterator[tuple[tuple[str | int, ...], Any]]:
    """Every metadata.labels in an object, its pod templates' included, with its path."""
    if isinstance(value, dict):
        for key, item in value.items():
            if key == "labels" and path and path[-1] == "metadata" and isinstance(item, dict):
                yield (*path, key), item
            else:
                yield from _label_maps(item, (*path, key))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from _label_maps(item, (*path, i))


def validate(obj: dict[str, Any], kubernetes_version: str, component: str = "objects") -> list[Problem]:
    """Problems of one object (empty when valid): at most one, the one the schema deems most relevant."""
    # the schema packages are slow to import: only the commands that check objects load them
    import jsonschema
    import kubernetes_validate.utils as kv_utils

    secret = secret_problems(obj)  # before the plan's secret data is shown empty: it is not missing
    obj = redacted(obj)
    label = name_of(obj)
    for path, labels in _label_maps(obj):
        for reason in label_problems(labels):
            return [Problem(component, label, _path(path), reason)]
    try:
        validator = _builtin_validator(
            str(obj.get("apiVersion", "")), str(obj.get("kind", "")), kubernetes_version
        )
    except kv_utils.VersionNotSupportedError:
        newest = kv_utils.major_minor(kv_utils.latest_version())
        return [
            Problem(
                component,
                label,
                "(kubernetes_version)",
                f"no official schemas for Kubernetes {kubernetes_version} here (newest: {newest}); "
                "upgrade the kubernetes-validate package or plan for a version it knows",
            )
        ]
    if validator is not None:
        error = jsonschema.exceptions.best_match(validator.iter_errors(obj))
        if error is not None:
            return [Problem(component, label, _path(error.path), _reason(error))]
        return [Problem(component, label, where, reason) for where, reason in secret]
    schema = crd_schemas().get((obj.get("apiVersion", ""), obj.get("kind", "")))
    if schema is None:
        return [
            Problem(
                component,
                label,
                "apiVersion",
                f"no schema for {obj.get('apiVersion')} {obj.get('kind')}: not a Kubernetes "
                f"{kubernetes_version} kind, and no CRD for it under data/crds/",
            )
        ]
    errors = sorted(jsonschema.Draft7Validator(_strict(schema)).iter_errors(obj), key=lambda e: list(e.path))
    return [Problem(component, label, _path(e.path), _reason(e)) for e in errors[:1]]


_HEAD = ("apiVersion", "kind", "metadata")


def _sorted(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _sorted(value[k]) for k in sorted(value)}
    if isinstance(value, list):
        return [_sorted(v) for v in value]
    return value


def to_yaml(objs: list[dict[str, Any]]) -> str:
    """Multi-document YAML in a stable order: apiVersion, kind, metadata, then every key sorted."""
    docs = []
    for obj in json.loads(json.dumps(objs)):  # plain dicts, lists and scalars only
        body = _sorted(obj)
        docs.append(
            {**{k: body[k] for k in _HEAD if k in body}, **{k: v for k, v in body.items() if k not in _HEAD}}
        )
    return yaml.safe_dump_all(docs, sort_keys=False, default_flow_style=False, width=120)
