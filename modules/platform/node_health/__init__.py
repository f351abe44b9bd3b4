"""GPU node lifecycle in the cluster: the preflight agent on nodes still behind the preflight taint,
the health agent on every GPU node, their RBAC, the policy that fences the preflight agent in, and
the thresholds both read.

Both agents run one DaemonSet per GPU pool (the pool's VM facts tell the probe how many GPUs to
expect), on the host network so Prometheus's `node-agents` job finds them at the node's address, and
see the GPUs through the NVIDIA runtime without requesting any (NVIDIA_VISIBLE_DEVICES=all). Their
thresholds are a ConfigMap made from src/superkube/data/gpu_health.yaml, so a threshold change is a reviewed
`pulumi up` like any other.

- preflight (superkube.agents.preflight): only on nodes labelled superkube.io/preflight=pending;
  removes that taint and label from its own node once the GPUs pass. The ValidatingAdmissionPolicy
  `superkube-preflight-own-node` rejects anything else its service account tries on a node.
- health (superkube.agents.node_health), on every node of every pool (a CPU pool's without NVML):
  writes its node's verdict on its own Node (a watch on that one object;
  `superkube-node-health-own-node` lets it set its own annotations there and nothing else). Beside
  the GPUs it checks the host, with read-only access to exactly what those checks read: an empty
  directory on each filesystem the node keeps state on (FILESYSTEMS: root, the kubelet's,
  containerd's and a data disk's; its fullness and read-only flag, followed into the agent as the
  host mounts change; one that is no filesystem of its own is judged once, as the one it is on),
  and the directory of the node's kernel log (KERNEL_LOG_DIR, kernel messages only, for I/O
  errors). On the host network it also asks the kubelet's and containerd's loopback endpoints
  whether they answer, opens a TCP connection to the API servers' load balancer and to the kubelet
  port of a few peers of its pool (`peers`; learnt from one label-selected list with a limit, about
  hourly), reads the routing table and its VM's scheduled events from the instance metadata.
- the health controller (superkube.agents.health_controller, a Deployment of two, one leading by a
  Lease): follows the GPU nodes with one watch, cordons the nodes reported fatal (behind the breaker
  per pool) or under Azure's maintenance (past it) and evicts their pods through the Eviction API;
  fenced by `superkube-node-health-controller-nodes` (only nodes reported fatal or under
  maintenance; cordon, and uncordon only after a GPU reset or a maintenance is over) and
  `superkube-node-health-evictions` (workload namespaces only). Fleet-wide facts live there, not in
  a DaemonSet: no node agent reads the fleet (the health agent lists at most a page of its own
  pool, about hourly, for its peers).
- the GPU reset (superkube.agents.gpu_reset, a DaemonSet per GPU pool whose pods run only on nodes
  the controller labelled `superkube.io/gpu-reset=requested`): resets a drained node's GPUs once when
  every fatal finding is one a reset may clear, and records the outcome on its own node; the one
  privileged container of the layer, fenced by `superkube-gpu-reset-own-node`.
"""

from __future__ import annotations

import pulumi

from modules.platform import objects
from modules.platform.foundation import NAMESPACE
from modules.platform.node_health.agents import daemonset, periodic_test, reset_daemonset
from modules.platform.node_health.controller import agent_access, controller
from modules.platform.node_health.facts import (  # noqa: F401
    ADM_GID,
    AGENT_RESOURCES,
    BURN_CPU,
    BURN_MEMORY,
    BURN_RESOURCES,
    COMPONENT,
    CONTAINERD_DIR,
    CONTROLLER_FENCE,
    CONTROLLER_LEASE_RULES,
    CONTROLLER_RULES,
    DATA_DIR,
    FENCE,
    FILESYSTEMS,
    GPU_RESET,
    GPU_RESET_FENCE,
    GPU_RESET_RULES,
    GPU_TEST,
    GPU_TEST_FENCE,
    GPU_TEST_RULES,
    HEALTH,
    HEALTH_CONTROLLER,
    HEALTH_EVICTION_FENCE,
    HEALTH_FENCE,
    HEALTH_FS_DIR,
    HOST_FS,
    HOST_FS_DIR,
    HOST_LOG,
    KUBELET_DIR,
    LEDGER_NAMESPACE,
    PREFLIGHT,
    PROTECTED_NAMESPACES,
    REMEDIATION_FENCE_NAME,
    RESET_SECURITY,
    RULES,
    SCALE_UP_DELAY,
    SCRATCH,
    SCRATCH_MOUNT,
    THRESHOLDS_DIR,
    THRESHOLDS_NAME,
    WATCHED,
    Agent,
    Fenced,
    NodeHealthArgs,
)
from modules.platform.node_health.fences import (  # noqa: F401
    CONTROLLER_RULES_EXTRA,
    CORDONED,
    DRAINED_SINCE_CORDON,
    FENCES,
    FOR_MAINTENANCE,
    MAINTENANCE_OVER,
    REPORTED_FATAL,
    REPORTED_MAINTENANCE,
    RESET_CLEARED,
    RESET_FAILED,
    WAS_CORDONED,
    Fence,
    eviction_validations,
    fence,
    fence_validations,
    remediation_access,
)
from modules.platform.objects import Manifest


def manifests(args: NodeHealthArgs) -> list[Manifest]:
    agents: tuple[Agent, ...] = ("preflight", "health")
    return [
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": objects.meta(THRESHOLDS_NAME, COMPONENT, NAMESPACE),
            "data": {args.thresholds.name: args.thresholds.read_text()},
        },
        *fence(),
        *fence("health"),
        *fence("health-controller"),
        *(remediation_access() if args.remediation else []),
        *(m for agent in agents for m in agent_access(agent)),
        *controller(args),
        *(daemonset(pool, vm, args, "preflight") for pool, vm in args.gpu_pools),
        *(daemonset(pool, vm, args, "health") for pool, vm in args.pools),
        *(
            [
                *fence("gpu-reset"),
                *objects.service_account_access(GPU_RESET, COMPONENT, NAMESPACE, GPU_RESET_RULES),
                *(reset_daemonset(pool, vm, args) for pool, vm in args.gpu_pools),
            ]
            if args.gpu_pools
            else []
        ),
        *(
            [
                *fence("gpu-test"),
                *objects.service_account_access(GPU_TEST, COMPONENT, NAMESPACE, GPU_TEST_RULES),
                *(periodic_test(pool, vm, args) for pool, vm in args.gpu_pools),
            ]
            if args.test_schedule and args.gpu_pools
            else []
        ),
    ]


class NodeHealth(pulumi.ComponentResource):
    """Preflight and health agents (a DaemonSet each per GPU pool), their RBAC, fence and thresholds."""

    def __init__(self, name: str, args: NodeHealthArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("superkube:platform:NodeHealth", name, None, opts)
        self.resources = objects.create(self, name, manifests(args))
        self.register_outputs(
            {
                "daemonsets": [f"{PREFLIGHT}-{pool.name}" for pool, _ in args.gpu_pools]
                + [f"{HEALTH}-{pool.name}" for pool, _ in args.pools]
                + [f"{GPU_RESET}-{pool.name}" for pool, _ in args.gpu_pools],
                "periodic_tests": [f"{GPU_TEST}-{pool.name}" for pool, _ in args.gpu_pools]
                if args.test_schedule
                else [],
            }
        )
