#!/usr/bin/env python3
"""Write the component-config references under data/kubernetes/<minor>/ from a release's Go types.

Each reference is a JSON Schema of one config kind (KubeletConfiguration, KubeProxyConfiguration,
KubeSchedulerConfiguration): every field by its JSON name, every value by its Go type, and no field
that the release does not have (additionalProperties: false). It is made from the published Go API
types of that release, in the staging repositories k8s.io/kubelet, k8s.io/kube-proxy,
k8s.io/kube-scheduler and k8s.io/component-base, checked out at the release's tag (v0.<minor>.<patch>
for Kubernetes 1.<minor>.<patch>):

    scripts/k8s_config_reference.py --minor 1.35 --tag v0.35.0 --scheduler-tag v0.34.7 \\
        --kubelet DIR --kube-proxy DIR --kube-scheduler DIR --component-base DIR

(each DIR a git clone of that repository). The kube-scheduler reference follows --scheduler-tag:
the gang scheduler is scheduler-plugins' build of kube-scheduler 1.34.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
from pathlib import Path
from typing import Any

STRUCT = re.compile(r"^type (\w+) struct \{\n(.*?)^\}", re.M | re.S)
NAMED_STRING = re.compile(r"^type (\w+) string\b", re.M)
NAMED_SLICE = re.compile(r"^type (\w+) (\[\]\w+)$", re.M)
FIELD = re.compile(r"^\t(?:(\w+)\s+)?([\w.\[\]*]+)\s+`json:\"([^\"]*)\"")
DURATION = {"type": "string", "pattern": r"^(0|-?([0-9]+(\.[0-9]+)?(ns|us|µs|ms|s|m|h))+)$"}
SCALARS: dict[str, dict[str, Any]] = {
    "bool": {"type": "boolean"},
    "string": {"type": "string"},
    "float32": {"type": "number"},
    "float64": {"type": "number"},
    "byte": {"type": "integer"},
    "metav1.Duration": DURATION,
    "metav1.Time": {"type": "string"},
    "resource.Quantity": {"type": ["string", "integer", "number"]},
    "resource.QuantityValue": {"type": ["string", "integer", "number"]},
    "v1.ResourceList": {"type": "object", "additionalProperties": {"type": ["string", "integer", "number"]}},
    "runtime.RawExtension": {"type": "object"},
    "intstr.IntOrString": {"type": ["string", "integer"]},
    # component-base logs: a number, and a duration written as a string (custom JSON in Go)
    "VerbosityLevel": {"type": "integer"},
    "TimeOrMetaDuration": DURATION,
    # k8s.io/api/core/v1.Taint, the one core type these configs use
    "v1.Taint": {
        "type": "object",
        "additionalProperties": False,
        "required": ["key", "effect"],
        "properties": {
            "key": {"type": "string"},
            "value": {"type": "string"},
            "effect": {"type": "string", "enum": ["NoSchedule", "PreferNoSchedule", "NoExecute"]},
            "timeAdded": {"type": "string"},
        },
    },
}
SCALARS |= {
    t: {"type": "integer"}
    for t in ("int", "int8", "int16", "int32", "int64", "uint", "uint16", "uint32", "uint64")
}


def go_sources(repo: Path, tag: str, paths: list[str]) -> str:
    return "\n".join(
        subprocess.run(
            ["git", "-C", str(repo), "show", f"{tag}:{p}"], capture_output=True, text=True, check=True
        ).stdout
        for p in paths
    )


class Types:
    def __init__(self, *sources: str) -> None:
        self.structs: dict[str, str] = {}
        self.strings: set[str] = set()
        self.slices: dict[str, str] = {}
        for source in sources:
            self.structs.update({m.group(1): m.group(2) for m in STRUCT.finditer(source)})
            self.strings.update(NAMED_STRING.findall(source))
            self.slices.update(NAMED_SLICE.findall(source))

    def schema(self, go_type: str) -> dict[str, Any]:
        go_type = go_type.lstrip("*")
        if go_type.startswith("[]"):
            inner = go_type[2:]
            if inner == "byte":
                return {"type": "string"}
            return {"type": "array", "items": self.schema(inner)}
        if go_type.startswith("map[string]"):
            return {"type": "object", "additionalProperties": self.schema(go_type[len("map[string]") :])}
        if go_type in SCALARS:
            return SCALARS[go_type]
        name = go_type.rsplit(".", 1)[-1]
        if name in SCALARS:
            return SCALARS[name]
        if name in self.slices:
            return self.schema(self.slices[name])
        if name in self.strings:
            return {"type": "string"}
        if name in self.structs:
            return self.struct(name)
        raise SystemExit(f"unknown Go type {go_type}: add its source or a SCALARS entry")

    def struct(self, name: str) -> dict[str, Any]:
        properties: dict[str, Any] = {}
        for line in self.structs[name].splitlines():
            match = FIELD.match(line)
            if not match:
                continue
            field, go_type, tag = match.groups()
            json_name = tag.split(",")[0]
            if json_name == "-":
                continue
            if field is None or (json_name == "" and ",inline" in tag):  # embedded: fields join this struct
                if go_type.endswith("TypeMeta"):
                    properties |= {"apiVersion": {"type": "string"}, "kind": {"type": "string"}}
                else:
                    properties |= self.schema(go_type)["properties"]
                continue
            properties[json_name] = self.schema(go_type)
        return {"type": "object", "additionalProperties": False, "properties": properties}


def kind_schema(types: Types, kind: str, api_version: str, release: str) -> dict[str, Any]:
    schema = types.struct(kind)
    schema["properties"]["apiVersion"] = {"const": api_version}
    schema["properties"]["kind"] = {"const": kind}
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": f"{kind} ({api_version}), Kubernetes {release}",
        "required": ["apiVersion", "kind"],
        **schema,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minor", required=True)
    parser.add_argument("--tag", required=True)
    parser.add_argument("--scheduler-tag", required=True)
    for repo in ("kubelet", "kube-proxy", "kube-scheduler", "component-base"):
        parser.add_argument(f"--{repo}", type=Path, required=True)
    args = parser.parse_args()
    out = Path(__file__).resolve().parents[1] / "data" / "kubernetes" / args.minor
    out.mkdir(parents=True, exist_ok=True)

    def base(tag: str) -> str:
        return go_sources(
            args.component_base,
            tag,
            ["config/v1alpha1/types.go", "logs/api/v1/types.go", "tracing/api/v1/types.go"],
        )

    docs = {
        "kubelet-config.v1beta1": kind_schema(
            Types(go_sources(args.kubelet, args.tag, ["config/v1beta1/types.go"]), base(args.tag)),
            "KubeletConfiguration",
            "kubelet.config.k8s.io/v1beta1",
            args.tag,
        ),
        "kube-proxy-config.v1alpha1": kind_schema(
            Types(go_sources(args.kube_proxy, args.tag, ["config/v1alpha1/types.go"]), base(args.tag)),
            "KubeProxyConfiguration",
            "kubeproxy.config.k8s.io/v1alpha1",
            args.tag,
        ),
        "kube-scheduler-config.v1": kind_schema(
            Types(
                go_sources(args.kube_scheduler, args.scheduler_tag, ["config/v1/types.go"]),
                base(args.scheduler_tag),
            ),
            "KubeSchedulerConfiguration",
            "kubescheduler.config.k8s.io/v1",
            args.scheduler_tag,
        ),
    }
    for name, doc in docs.items():
        (out / f"{name}.schema.json").write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
        print(f"{out / name}.schema.json: {len(doc['properties'])} top-level fields")


if __name__ == "__main__":
    main()
