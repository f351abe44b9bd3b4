"""Gang scheduling's in-cluster half and the MPI Operator.

- The scheduler-plugins controller that keeps each PodGroup's status. The scheduler itself is a host
  service on the API-server hosts (playbooks/roles/gang_scheduler), and what it cannot start without
  comes with converge, not with this layer: the PodGroup and ElasticQuota CRDs and the scheduler's
  read access to them are among the kube_apiserver role's bootstrap objects, applied before any
  scheduler starts (until the PodGroup CRD exists, Coscheduling schedules no pod at all).
- The Kubeflow MPI Operator: the MPIJob CRD, its controller started with gang scheduling through
  scheduler-plugins under our scheduler's name (it then creates one PodGroup per MPIJob, minMember =
  launcher + workers, and labels every pod with it), its RBAC, and roles that let namespace editors
  and viewers use MPIJobs.

Versions come from superkube.cluster.gang (the controller from the scheduler's own pin); CRDs from data/crds.
"""

from __future__ import annotations

from dataclasses import dataclass

import pulumi

from modules.common import require
from modules.platform import objects
from modules.platform.foundation import CLUSTER_CRITICAL, NAMESPACE
from modules.platform.objects import Manifest
from superkube.cluster import gang

COMPONENT = "gang-scheduling"
CONTROLLER = gang.CONTROLLER_NAME
MPI_OPERATOR = gang.MPI_OPERATOR_NAME
MPI_OPERATOR_HEALTH_PORT = 8080
"""fixed in the operator (v0.8.2 cmd/mpi-operator/app/server.go): no flag moves it"""
MPI_OPERATOR_METRICS_PORT = 9090


@dataclass(frozen=True, kw_only=True)
class GangSchedulingArgs:
    kubernetes_version: str
    """The cluster's Kubernetes version: picks the scheduler-plugins release pinned for its minor."""
    controller_replicas: int = 2
    """scheduler-plugins controller replicas (leader-elected; default 2)."""
    mpi_operator: bool = True
    """Deploy the MPI Operator (default: yes)."""
    mpi_operator_image: str = gang.MPI_OPERATOR_IMAGE
    """The operator's image (default: the pinned release)."""
    api_qps: int = 50
    """Client QPS of both controllers (their defaults of 5 throttle a thousand-pod job's creation)."""
    api_burst: int = 100
    """Client burst of both controllers."""

    def __post_init__(self) -> None:
        require(self.controller_replicas >= 1, "controller_replicas", "must be at least 1")
        require(1 <= self.api_qps <= self.api_burst, "api_qps", "must be at least 1 and at most api_burst")
        try:
            gang.scheduler_plugins_version(self.kubernetes_version)
        except ValueError as e:
            require(False, "kubernetes_version", str(e))


def _crd(name: str) -> Manifest:
    doc = dict(gang.crd(name))
    doc["metadata"] = {
        **doc["metadata"],
        "labels": {**doc["metadata"].get("labels", {}), **objects.labels(COMPONENT, name)},
    }
    return doc


def _deployment(name: str, replicas: int, container: Manifest) -> Manifest:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": objects.meta(name, COMPONENT, NAMESPACE),
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app.kubernetes.io/name": name}},
            "template": {
                "metadata": {"labels": objects.labels(COMPONENT, name)},
                "spec": {
                    "serviceAccountName": name,
                    "priorityClassName": CLUSTER_CRITICAL,
                    "containers": [{**container, "securityContext": objects.restricted()}],
                    # spread the replicas: one node's loss never takes every copy
                    "topologySpreadConstraints": [
                        {
                            "maxSkew": 1,
                            "topologyKey": "kubernetes.io/hostname",
                            "whenUnsatisfiable": "ScheduleAnyway",
                            "labelSelector": {"matchLabels": {"app.kubernetes.io/name": name}},
                        }
                    ],
                },
            },
        },
    }


CONTROLLER_RULES: list[dict[str, object]] = [
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]},
    {"apiGroups": [""], "resources": ["events"], "verbs": ["create", "patch", "update"]},
    {
        "apiGroups": ["scheduling.x-k8s.io"],
        "resources": ["podgroups", "elasticquotas"],
        "verbs": ["get", "list", "watch", "create", "delete", "update", "patch"],
    },
    {
        "apiGroups": ["scheduling.x-k8s.io"],
        "resources": ["podgroups/status", "elasticquotas/status"],
        "verbs": ["get", "update", "patch"],
    },
    # its leader election lease (in kube-system, fixed by the controller)
    {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create", "get", "update"]},
]

MPI_OPERATOR_RULES: list[dict[str, object]] = [
    {
        "apiGroups": [""],
        "resources": ["configmaps", "secrets", "services"],
        "verbs": ["create", "list", "watch", "update"],
    },
    {
        "apiGroups": [""],
        "resources": ["pods"],
        "verbs": ["create", "get", "list", "watch", "delete", "update", "patch"],
    },
    {"apiGroups": [""], "resources": ["pods/exec"], "verbs": ["create"]},
    {"apiGroups": [""], "resources": ["endpoints"], "verbs": ["create", "get", "update"]},
    {"apiGroups": [""], "resources": ["events"], "verbs": ["create", "patch"]},
    {"apiGroups": ["batch"], "resources": ["jobs"], "verbs": ["create", "list", "update", "watch"]},
    {
        "apiGroups": ["kubeflow.org"],
        "resources": ["mpijobs", "mpijobs/finalizers", "mpijobs/status"],
        "verbs": ["get", "list", "watch", "update", "patch"],
    },
    {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create", "get", "update"]},
    {
        "apiGroups": ["scheduling.x-k8s.io"],
        "resources": ["podgroups"],
        "verbs": ["create", "get", "list", "watch", "update", "delete"],
    },
    # minResources of a gang: the operator orders replicas by their PriorityClass
    {"apiGroups": ["scheduling.k8s.io"], "resources": ["priorityclasses"], "verbs": ["get", "list", "watch"]},
]


def _user_roles() -> list[Manifest]:
    """MPIJobs for everyone the built-in edit/admin and view roles already cover."""
    resources = ["mpijobs", "mpijobs/status"]
    out = []
    for name, verbs, aggregate in (
        (
            "superkube:mpijobs-edit",
            ["create", "delete", "get", "list", "patch", "update", "watch"],
            ("admin", "edit"),
        ),
        ("superkube:mpijobs-view", ["get", "list", "watch"], ("view",)),
    ):
        meta = objects.meta(name, COMPONENT)
        meta["labels"].update({f"rbac.authorization.k8s.io/aggregate-to-{a}": "true" for a in aggregate})
        out.append(
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "ClusterRole",
                "metadata": meta,
                "rules": [{"apiGroups": ["kubeflow.org"], "resources": resources, "verbs": verbs}],
            }
        )
    return out


def manifests(args: GangSchedulingArgs) -> list[Manifest]:
    controller = {
        "name": "controller",
        "image": gang.controller_image(args.kubernetes_version),
        "args": [
            "--enableLeaderElection",
            f"--qps={args.api_qps}",
            f"--burst={args.api_burst}",
            "--workers=4",
        ],
        "ports": [{"name": "metrics", "containerPort": 8080}, {"name": "probes", "containerPort": 8081}],
        "livenessProbe": {"httpGet": {"path": "/healthz", "port": 8081}, "periodSeconds": 20},
        "readinessProbe": {"httpGet": {"path": "/readyz", "port": 8081}, "periodSeconds": 10},
        "resources": {"requests": {"cpu": "100m", "memory": "256Mi"}, "limits": {"memory": "1Gi"}},
    }
    out: list[Manifest] = [
        *objects.service_account_access(CONTROLLER, COMPONENT, NAMESPACE, CONTROLLER_RULES),
        _deployment(CONTROLLER, args.controller_replicas, controller),
    ]
    if args.mpi_operator:
        operator = {
            "name": "operator",
            "image": args.mpi_operator_image,
            "args": [
                f"--gang-scheduling={gang.SCHEDULER_NAME}",
                f"--lock-namespace={NAMESPACE}",
                f"--kube-api-qps={args.api_qps}",
                f"--kube-api-burst={args.api_burst}",
                # not 8080: the operator always serves /healthz there, on every address, and a
                # metrics server on the same port makes it exit at start ("address already in use")
                f"--monitoring-port={MPI_OPERATOR_METRICS_PORT}",
            ],
            "ports": [
                {"name": "metrics", "containerPort": MPI_OPERATOR_METRICS_PORT},
                {"name": "healthz", "containerPort": MPI_OPERATOR_HEALTH_PORT},
            ],
            # healthy while it leads, or while it waits to (its leader election's health adaptor)
            "livenessProbe": {
                "httpGet": {"path": "/healthz", "port": MPI_OPERATOR_HEALTH_PORT},
                "periodSeconds": 20,
            },
            "resources": {"requests": {"cpu": "100m", "memory": "256Mi"}, "limits": {"memory": "1Gi"}},
        }
        out += [
            *(_crd(name) for name in gang.MPI_CRDS),
            *objects.service_account_access(MPI_OPERATOR, COMPONENT, NAMESPACE, MPI_OPERATOR_RULES),
            _deployment(MPI_OPERATOR, 1, operator),
            *_user_roles(),
        ]
    return out


class GangScheduling(pulumi.ComponentResource):
    """PodGroup CRDs and the scheduler-plugins controller; the MPI Operator."""

    def __init__(
        self, name: str, args: GangSchedulingArgs, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        super().__init__("superkube:platform:GangScheduling", name, None, opts)
        self.resources = objects.create(self, name, manifests(args))
        self.register_outputs(
            {
                "scheduler_plugins": gang.scheduler_plugins_version(args.kubernetes_version),
                "mpi_operator": args.mpi_operator_image if args.mpi_operator else None,
            }
        )
