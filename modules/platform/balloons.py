"""Balloons: low-priority placeholder pods that keep each pool's nodes up until real work needs them.

One Deployment per pool (not a DaemonSet: a DaemonSet follows the nodes that exist, a Deployment
makes the autoscaler add them). Each replica requests one whole node of the pool's VM size (less
the node agents' share), one pod per node by anti-affinity, so replicas = the pool's maximum asks for
the whole pool. Their PriorityClass is at the autoscaler's expendable cutoff, so the autoscaler adds
and keeps nodes for them, and below every real workload, so any real pod preempts them at once.
They tolerate the pool's own taints but never the preflight taint: a GPU node is held only after it
has passed its tests.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pulumi

from modules.common import require
from modules.platform import objects
from modules.platform.foundation import BALLOON_PRIORITY, NAMESPACE
from modules.platform.objects import Manifest
from superkube.cluster import autoscaling
from superkube.cluster.cloudinit import POOL_LABEL
from superkube.model.spec import PREFLIGHT_TAINT_KEY
from superkube.model.spec import NodePool as PoolSpec
from superkube.model.teams import TAINT_EFFECT, TEAM_KEY
from superkube.model.vmsizes import VmSize, fill_one_node

COMPONENT = autoscaling.BALLOONS
PAUSE_IMAGE = "registry.k8s.io/pause:3.10"


@dataclass(frozen=True, kw_only=True)
class BalloonsArgs:
    pools: Sequence[tuple[PoolSpec, VmSize]]
    """Every pool with the facts of its VM size (from src/superkube/data/vm_sizes.yaml)."""
    priority_class: str = BALLOON_PRIORITY
    """PriorityClass of balloon pods (default: superkube-balloon)."""
    image: str = PAUSE_IMAGE
    """The placeholder container (default: the pinned pause image)."""
    hold_nodes: bool = True
    """Replicas: each pool's maximum (default True); False: none, for nodes that cannot hold a
    whole-node balloon (spec.balloons_enabled false, the lab's)."""

    def __post_init__(self) -> None:
        require(bool(self.pools), "pools", "needs at least one pool")
        for pool, vm in self.pools:
            require(
                vm.name == pool.vm_size, "pools", f"pool {pool.name} is {pool.vm_size}, facts are {vm.name}"
            )
            require(
                vm.gpus == pool.gpus_per_node,
                "pools",
                f"pool {pool.name}: gpus_per_node is {pool.gpus_per_node} but {vm.name} has {vm.gpus} GPUs; "
                "fix gpus_per_node in the stack",
            )


def tolerations(pool: PoolSpec) -> list[dict[str, str]]:
    """The pool's own taints, tolerated exactly, and every team's (a balloon holds a node for whoever
    comes, and any real pod preempts it); the preflight taint never."""
    out = [{"key": TEAM_KEY, "operator": "Exists", "effect": TAINT_EFFECT}]
    for taint in pool.taints:
        key_value, _, effect = taint.partition(":")
        key, _, value = key_value.partition("=")
        if key != PREFLIGHT_TAINT_KEY:
            out.append({"key": key, "operator": "Equal", "value": value, "effect": effect})
    return out


def deployment(pool: PoolSpec, vm: VmSize, args: BalloonsArgs) -> Manifest:
    name = f"{autoscaling.BALLOON_PREFIX}{pool.name}"
    selector = {"app.kubernetes.io/name": name}
    requests = fill_one_node(vm)
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": objects.meta(name, COMPONENT, NAMESPACE),
        "spec": {
            "replicas": pool.nodes if args.hold_nodes else 0,
            "selector": {"matchLabels": selector},
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": "10%"}},
            "template": {
                "metadata": {"labels": {**objects.labels(COMPONENT, name), POOL_LABEL: pool.name}},
                "spec": {
                    "priorityClassName": args.priority_class,
                    "terminationGracePeriodSeconds": 0,
                    "automountServiceAccountToken": False,
                    "enableServiceLinks": False,
                    "nodeSelector": {POOL_LABEL: pool.name},
                    "tolerations": tolerations(pool),
                    "affinity": {
                        "podAntiAffinity": {
                            "requiredDuringSchedulingIgnoredDuringExecution": [
                                {
                                    "labelSelector": {"matchLabels": selector},
                                    "topologyKey": "kubernetes.io/hostname",
                                }
                            ]
                        }
                    },
                    "securityContext": {"runAsNonRoot": True, "runAsUser": 65535},
                    "containers": [
                        {
                            "name": "pause",
                            "image": args.image,
                            "resources": {"requests": requests, "limits": dict(requests)},
                            "securityContext": {
                                "allowPrivilegeEscalation": False,
                                "readOnlyRootFilesystem": True,
                                "capabilities": {"drop": ["ALL"]},
                            },
                        }
                    ],
                },
            },
        },
    }


def manifests(args: BalloonsArgs) -> list[Manifest]:
    return [deployment(pool, vm, args) for pool, vm in args.pools]


class Balloons(pulumi.ComponentResource):
    """One balloon Deployment per pool, sized to fill that pool."""

    def __init__(self, name: str, args: BalloonsArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("superkube:platform:Balloons", name, None, opts)
        self.resources = objects.create(self, name, manifests(args))
        self.register_outputs({"deployments": [f"balloon-{pool.name}" for pool, _ in args.pools]})
