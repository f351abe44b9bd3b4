"""Gang scheduling and MPI: the versions, names and CRDs both the in-cluster layer and `superkube job`
rest on, named once.

- The gang scheduler is scheduler-plugins' kube-scheduler, a host service on the API-server hosts
  (playbooks/roles/gang_scheduler). Its release is pinned, by digest, in kube_component's
  release-<minor>.yml; the scheduler-plugins controller in the cluster is read from the same pin,
  so the two never drift apart.
- The scheduler runs one profile, `default-scheduler` with Coscheduling, so it is the only scheduler
  and every pod goes through it. The MPI Operator's `--gang-scheduling=<name>` is not a mode but the
  scheduler name it writes into every launcher and worker pod (any value but `volcano` means
  scheduler-plugins), so it is given this name, not `scheduler-plugins`.
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path
from typing import Any

from superkube.model import strictyaml

ROOT = Path(__file__).resolve().parents[3]
CRDS = ROOT / "data" / "crds"
RELEASES = ROOT / "playbooks" / "roles" / "kube_component" / "vars"

SCHEDULER_NAME = "default-scheduler"
"""The gang scheduler's one profile (playbooks/roles/gang_scheduler/templates/scheduler-config.yaml.j2)."""
POD_GROUP_LABEL = "scheduling.x-k8s.io/pod-group"
PODGROUP_API = "scheduling.x-k8s.io/v1alpha1"
MPIJOB_API = "kubeflow.org/v2beta1"

MPI_OPERATOR_VERSION = "0.8.2"
MPI_OPERATOR_IMAGE = f"mpioperator/mpi-operator:{MPI_OPERATOR_VERSION}"
"""The release's image (its tags carry no leading v)."""
SCHEDULER_PLUGINS_CONTROLLER = "registry.k8s.io/scheduler-plugins/controller"
CONTROLLER_NAME, MPI_OPERATOR_NAME = "scheduler-plugins-controller", "mpi-operator"
"""the in-cluster layer's Deployments and service accounts for the two (and the lab's processes)"""

GANG_CRDS = ("podgroups.scheduling.x-k8s.io", "elasticquotas.scheduling.x-k8s.io")
MPI_CRDS = ("mpijobs.kubeflow.org",)

_TAG = re.compile(r":(v\d+\.\d+\.\d+)$")


@cache
def scheduler_plugins_version(kubernetes_version: str) -> str:
    """The scheduler-plugins release pinned for this Kubernetes minor (its kube-scheduler image tag)."""
    minor = ".".join(kubernetes_version.split(".")[:2])
    path = RELEASES / f"release-{minor}.yml"
    if not path.is_file():
        known = sorted(p.stem.removeprefix("release-") for p in RELEASES.glob("release-*.yml"))
        raise ValueError(f"no release pins for Kubernetes {minor}; known: {', '.join(known)}")
    ref = strictyaml.safe_load(path.read_text())["kube_component_release"]["images"]["kube-scheduler"]["ref"]
    m = _TAG.search(ref)
    if not m:
        raise ValueError(f"{path.name}: kube-scheduler ref {ref!r} has no vX.Y.Z tag")
    return m.group(1)


def controller_image(kubernetes_version: str) -> str:
    return f"{SCHEDULER_PLUGINS_CONTROLLER}:{scheduler_plugins_version(kubernetes_version)}"


@cache
def crd(name: str) -> dict[str, Any]:
    """The CustomResourceDefinition kept as data/crds/<name>.yaml."""
    doc: dict[str, Any] = strictyaml.safe_load((CRDS / f"{name}.yaml").read_text())
    return doc
