"""cluster-autoscaler run for real beside a loopback API server, resizing the plan's scale sets as kwok
nodes.

What production runs: cluster-autoscaler at `autoscaling.VERSION` with the command line the plan
makes (`autoscaling.flags`) as its own user (`autoscaling.USER`, a client certificate from the
cluster CA) with the in-cluster layer's RBAC. What the lab puts in Azure's place, and nothing else:

- The cloud provider is the autoscaler's own kwok provider (`--cloud-provider=kwok`), so
  `--node-group-auto-discovery` goes (that provider groups nodes by an annotation instead). Each
  node group is one of the plan's autoscaled scale sets, read from the tags the autoscaler reads on
  Azure (`scale_sets`): min and max, and the node template (labels, taints, resources). What the
  SKU gives on Azure (CPU, memory) is `TEMPLATE_CAPACITY`. A scale-up creates the Nodes, which kwok
  then plays (`superkube.harness.kwok`).
- That provider needs two ConfigMaps and may create and delete Nodes and read them: lab-only RBAC
  (`provider_objects`), bound to the same user. Azure's provider needs neither.
- The binary is not a published Go module: `scripts/build_autoscaler.py` builds it from a checkout
  of the release tag (with the kwok provider), into `binary()`. Without it, `binary` says how.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from superkube.cluster import autoscaling
from superkube.harness import apiserver, gang, kwok
from superkube.harness.errors import HarnessError

KWOK_CONFIG = "kwok-provider-config"
KWOK_TEMPLATES = "kwok-provider-templates"
SCALE_SET_ANNOTATION = "superkube.io/lab-scale-set"
"""On each template Node: the scale set it stands for (how the kwok provider groups nodes)."""
MAX_ANNOTATION = "cluster-autoscaler.kwok.nodegroup/max-count"
GROUP_ANNOTATION = "cluster-autoscaler.kwok.nodegroup/name"
"""What the kwok provider writes on the Nodes it creates: their node group."""
LAB_RBAC = "superkube-lab-kwok-provider"
TEMPLATE_CAPACITY = {k: v for k, v in gang.GPU_CAPACITY.items() if k != "nvidia.com/gpu"}
"""What Azure's provider reads from the GPU pool's SKU rather than tags: the lab's GPU node's (the GPUs
come from the tags)."""
CACHE = Path(os.environ.get("SUPERKUBE_BUILD_CACHE", "/var/cache/superkube/build"))

TUNED = (
    "max-nodes-per-scaleup",
    "scan-interval",
    "max-total-unready-percentage",
    "ok-total-unready-count",
    "new-pod-scale-up-delay",
    "max-node-provision-time",
)
"""The plan's scale-up settings: the flags whose upstream defaults `upstream_defaults` leaves in place.
Not `--startup-taint`: without it no GPU pool grows at all (`autoscaling.flags` says why)."""


LAB_BUILD = 3
"""Revision of the build script's lab changes: a binary built before a change is not found, not run."""


def binary_path(version: str = autoscaling.VERSION) -> Path:
    return CACHE / "cluster-autoscaler" / f"v{version}-lab{LAB_BUILD}" / "bin" / "cluster-autoscaler"


def binary(version: str = autoscaling.VERSION) -> Path:
    """Where `scripts/build_autoscaler.py` puts the release's binary; HarnessError saying how when absent."""
    path = binary_path(version)
    if not path.is_file():
        raise HarnessError(
            f"no cluster-autoscaler v{version} built at {path}: run scripts/build_autoscaler.py with a "
            f"checkout of kubernetes/autoscaler at tag cluster-autoscaler-{version}"
        )
    return path


@dataclass(frozen=True)
class ScaleSet:
    """An autoscaled scale set as cluster-autoscaler sees it on Azure: its tags, decoded."""

    name: str
    min: int
    max: int
    labels: dict[str, str]
    taints: list[dict[str, str]]
    resources: dict[str, str]
    capacity: int
    """The most nodes the plan lets it hold (`superkube-capacity`): the governor's ceiling, where its
    `max` tag is the governor's first step."""


def _tag_name(encoded: str) -> str:
    """A template tag's key as Azure's provider decodes it: `_` for `/`, `~2` for a literal `_`."""
    return encoded.replace("_", "/").replace("~2", "_")


def scale_set(name: str, tags: Mapping[str, str]) -> ScaleSet:
    labels: dict[str, str] = {}
    taints: list[dict[str, str]] = []
    resources: dict[str, str] = {}
    prefix = autoscaling.NODE_TEMPLATE + "_"
    for tag, value in tags.items():
        if not tag.startswith(prefix):
            continue
        kind, _, key = tag.removeprefix(prefix).partition("_")
        if kind == "label":
            labels[_tag_name(key)] = value
        elif kind == "taint":
            taint_value, _, effect = value.rpartition(":")
            taints.append({"key": _tag_name(key), "value": taint_value, "effect": effect})
        elif kind == "resources":
            resources[_tag_name(key)] = value
    capacity = int(tags.get("superkube-capacity", tags["max"]))
    return ScaleSet(name, int(tags.get("min", 0)), int(tags["max"]), labels, taints, resources, capacity)


def scale_sets(plan: Any, pool: str | None = None) -> list[ScaleSet]:
    """The plan's autoscaled scale sets (of `pool`, when given), from the tags on its resources."""
    out = []
    for r in plan.resources:
        if r.type != "azure-native:compute:VirtualMachineScaleSet":
            continue
        tags = r.inputs.get("tags") or {}
        if autoscaling.is_autoscaled(tags) and (pool is None or tags.get("superkube-pool") == pool):
            out.append(scale_set(r.name, tags))
    if not out:
        raise HarnessError(f"the plan has no autoscaled scale set{f' in pool {pool}' if pool else ''}")
    return out


def template(s: ScaleSet) -> dict[str, Any]:
    """The template Node for `s`'s node group, as the kwok provider reads it."""
    body, status = kwok.node(s.name, s.labels, {**TEMPLATE_CAPACITY, **s.resources}, s.taints)
    body["metadata"]["annotations"].update({
        SCALE_SET_ANNOTATION: s.name,
        "cluster-autoscaler.kwok.nodegroup/min-count": str(s.min),
        MAX_ANNOTATION: str(s.max),
    })  # fmt: skip
    return {**body, **status}


def provider_objects(sets: Sequence[ScaleSet], user: str = autoscaling.USER) -> list[dict[str, Any]]:
    """The kwok provider's configuration and templates, and the lab-only RBAC it needs (see the doc)."""
    ns = autoscaling.NAMESPACE
    config = {
        "apiVersion": "v1alpha1",
        "readNodesFrom": "configmap",
        "nodegroups": {"fromNodeAnnotationKey": SCALE_SET_ANNOTATION},
        "nodes": {"skipTaint": True},  # the template's taints are the plan's, nothing added
        "configmap": {"name": KWOK_TEMPLATES},
    }
    templates = {"apiVersion": "v1", "kind": "List", "items": [template(s) for s in sets]}
    subject = [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}]
    meta = {"name": LAB_RBAC, "labels": {"app.kubernetes.io/part-of": "superkube-lab"}}
    return [
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": KWOK_CONFIG, "namespace": ns},
         "data": {"config": json.dumps(config)}},
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": KWOK_TEMPLATES, "namespace": ns},
         "data": {"templates": json.dumps(templates)}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": meta,
         "rules": [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["create", "delete"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": meta,
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": LAB_RBAC},
         "subjects": subject},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": {**meta, "namespace": ns},
         "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"],
                    "resourceNames": [KWOK_CONFIG, KWOK_TEMPLATES]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": {**meta, "namespace": ns},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": LAB_RBAC},
         "subjects": subject},
    ]  # fmt: skip


def flag_name(arg: str) -> str:
    """`--name=value` -> `name`."""
    return arg.removeprefix("--").partition("=")[0]


def lab_args(flags: Sequence[str], kubeconfig: Path, metrics_port: int) -> list[str]:
    """The plan's command line with the lab's provider (see the module doc), its kubeconfig, and
    metrics on loopback."""
    kept = [f for f in flags if flag_name(f) not in ("cloud-provider", "node-group-auto-discovery")]
    return [
        "--cloud-provider=kwok",
        *kept,
        f"--kubeconfig={kubeconfig}",
        f"--address=127.0.0.1:{metrics_port}",
    ]


def upstream_defaults(flags: Sequence[str]) -> list[str]:
    """`flags` less the plan's scale-up settings (`TUNED`): the release's defaults for those."""
    return [f for f in flags if flag_name(f) not in TUNED]


@dataclass(frozen=True)
class ScaleUp:
    at: datetime
    group: str
    old: int
    new: int


_SCALE_UP = re.compile(
    r"^I(\d{2})(\d{2}) (\d{2}:\d{2}:\d{2}\.\d{6}) .*Scale-up: setting group (\S+) size to (\d+)$"
)


def scale_ups(log: str, year: int, sizes: Mapping[str, int] | None = None) -> list[ScaleUp]:
    """Each scale-up the autoscaler made, from its log: its "setting group G size to N" lines
    (klog's header has no year: `year`; UTC). A group's size before its first one is `sizes[G]`
    (0 when not given: the lab's groups start empty)."""
    last = dict(sizes or {})
    out = []
    for line in log.splitlines():
        m = _SCALE_UP.match(line.rstrip())
        if m:
            month, day, clock, group, new = m.groups()
            at = datetime.strptime(f"{year}-{month}-{day} {clock}", "%Y-%m-%d %H:%M:%S.%f").replace(
                tzinfo=UTC
            )
            out.append(ScaleUp(at, group, last.get(group, 0), int(new)))
            last[group] = int(new)
    return out


@dataclass
class Autoscaler:
    process: subprocess.Popen[bytes]
    log_path: Path
    metrics_port: int

    def alive(self) -> bool:
        return self.process.poll() is None

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        apiserver.terminate(self.process, 30)


def start(
    api: apiserver.LocalApi, workdir: Path, flags: Sequence[str], name: str = "cluster-autoscaler"
) -> Autoscaler:
    """Start the autoscaler with the plan's `flags` (`lab_args` adds the lab's) as its own user."""
    exe = binary()
    workdir.mkdir(parents=True, exist_ok=True)
    config = api.client_kubeconfig("cluster-autoscaler", autoscaling.USER)
    port = apiserver.free_port()
    log = workdir / f"{name}.log"
    env = {
        **os.environ,
        "TZ": "UTC",
        "KUBECONFIG": str(config),  # the kwok provider's own client reads it
        "KWOK_PROVIDER_MODE": "local",
        "POD_NAMESPACE": autoscaling.NAMESPACE,
    }
    with log.open("ab") as out:
        process = subprocess.Popen([str(exe), *lab_args(flags, config, port)], stdout=out, stderr=subprocess.STDOUT,
                                   start_new_session=True, preexec_fn=apiserver.die_with_parent, env=env)  # fmt: skip
    ca = Autoscaler(process, log, port)
    time.sleep(1)
    if not ca.alive():
        tail = ca.log().strip().splitlines()[-3:]
        raise HarnessError(
            f"cluster-autoscaler exited at start: {' | '.join(tail) or 'no output'} (log: {log})"
        )
    return ca


@contextlib.contextmanager
def running(
    api: apiserver.LocalApi, workdir: Path, flags: Sequence[str], name: str = "cluster-autoscaler"
) -> Iterator[Autoscaler]:
    ca = start(api, workdir, flags, name)
    try:
        yield ca
    finally:
        ca.stop()


class KwokMaxSizes:
    """The lab's stand-in for the scale sets' `max` tags that the governor writes on Azure: each
    group's template's max-count in the kwok provider's templates ConfigMap, which the lab's build
    re-reads as Azure's provider re-reads the tags (`scripts/build_autoscaler.py`). One update per
    round; a conflict with another writer is read again and retried."""

    def __init__(self, api: apiserver.LocalApi) -> None:
        self.api = api

    def set_max(self, sizes: Mapping[str, int]) -> None:
        ns = autoscaling.NAMESPACE
        for _ in range(5):
            cm = json.loads(
                apiserver.kubectl(self.api, "get", "configmap", KWOK_TEMPLATES, "-n", ns, "-o", "json")
            )
            templates = json.loads(cm["data"]["templates"])
            for item in templates["items"]:
                notes = item["metadata"]["annotations"]
                if notes.get(SCALE_SET_ANNOTATION) in sizes:
                    notes[MAX_ANNOTATION] = str(sizes[notes[SCALE_SET_ANNOTATION]])
            cm["data"]["templates"] = json.dumps(templates)
            try:  # the read's resourceVersion rides along: a write in between is a conflict
                apiserver.kubectl(self.api, "replace", "-f", "-", stdin=json.dumps(cm))
                return
            except subprocess.CalledProcessError as exc:
                if "modified" not in (exc.stderr or ""):
                    raise HarnessError(
                        f"the governor's update of the kwok templates failed: {exc.stderr.strip()}"
                    ) from None
        raise HarnessError(f"the kwok templates kept changing under the governor's update of {dict(sizes)}")
