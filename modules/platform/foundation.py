"""What the rest of the in-cluster layer stands on: its namespace and the PriorityClasses."""

from __future__ import annotations

from dataclasses import dataclass

import pulumi

from modules.common import require
from modules.platform import objects
from modules.platform.objects import Manifest
from superkube.cluster.autoscaling import EXPENDABLE_CUTOFF, PRIORITY_CLASS_MAX
from superkube.cluster.kube import SYSTEM_NAMESPACE

NAMESPACE = SYSTEM_NAMESPACE
"""Namespace of superkube's own workloads (balloons, agents, webhooks)."""
BALLOON_PRIORITY = "superkube-balloon"
DEFAULT_PRIORITY = "superkube-default"
NODE_AGENT_PRIORITY = "superkube-node-agent"
GPU_TEST_PRIORITY = "superkube-gpu-test"
CLUSTER_CRITICAL = "system-cluster-critical"
"""Kubernetes' built-in class for what the cluster cannot run without (controllers, webhooks)."""
COMPONENT = "foundation"


@dataclass(frozen=True, kw_only=True)
class FoundationArgs:
    balloon_priority: int = EXPENDABLE_CUTOFF
    """Priority of balloon pods (default: the autoscaler's expendable cutoff, -10): below every real
    workload, so any pod preempts them, yet not below the cutoff, so they still make the autoscaler
    add nodes and hold them."""
    default_priority: int = 0
    """Priority of pods that name no class (default: 0)."""
    node_agent_priority: int = PRIORITY_CLASS_MAX
    """Priority of superkube's node agents that are not system-node-critical (default: 1,000,000,000,
    the highest a user-defined class may have)."""

    def __post_init__(self) -> None:
        require(
            EXPENDABLE_CUTOFF <= self.balloon_priority < self.default_priority,
            "balloon_priority",
            f"must be at least {EXPENDABLE_CUTOFF} (the autoscaler's expendable cutoff) and below "
            f"default_priority {self.default_priority}",
        )
        require(
            self.default_priority < self.node_agent_priority <= PRIORITY_CLASS_MAX,
            "node_agent_priority",
            f"must be above default_priority and at most {PRIORITY_CLASS_MAX}",
        )


def manifests(args: FoundationArgs) -> list[Manifest]:
    def priority(name: str, value: int, description: str, **extra: object) -> Manifest:
        return {
            "apiVersion": "scheduling.k8s.io/v1",
            "kind": "PriorityClass",
            "metadata": objects.meta(name, COMPONENT),
            "value": value,
            "description": description,
            **extra,
        }

    return [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": objects.meta(NAMESPACE, COMPONENT)},
        priority(
            BALLOON_PRIORITY,
            args.balloon_priority,
            "Balloon pods: hold spare nodes, preempted by any real workload.",
            preemptionPolicy="Never",
        ),
        priority(
            DEFAULT_PRIORITY,
            args.default_priority,
            "Every pod that names no PriorityClass.",
            globalDefault=True,
        ),
        priority(
            NODE_AGENT_PRIORITY,
            args.node_agent_priority,
            "superkube's node agents that are not system-node-critical (exporters, probes).",
        ),
        priority(
            GPU_TEST_PRIORITY,
            EXPENDABLE_CUTOFF - 1,
            "Periodic GPU tests: run only on idle nodes. Below the autoscaler's expendable cutoff, so a "
            "pending test never adds a node; never preempts; any real pod, balloons too, preempts it.",
            preemptionPolicy="Never",
        ),
    ]


class Foundation(pulumi.ComponentResource):
    """The superkube-system namespace and the PriorityClasses every other component refers to."""

    def __init__(
        self,
        name: str,
        args: FoundationArgs,
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        super().__init__("superkube:platform:Foundation", name, None, opts)
        self.resources = objects.create(self, name, manifests(args))
        self.register_outputs({"namespace": NAMESPACE})
