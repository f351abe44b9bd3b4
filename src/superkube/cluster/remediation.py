"""Remediation on the API-server hosts (superkube.agents.remediation): its Kubernetes user, its Azure
identity and the one custom role that identity holds, and its settings from the stack.

The role may read the cluster's scale sets and their instances and delete instances, nothing else:
no scale-set update (so no capacity or model change), no VM outside a scale set, no network. The
identity is its own, not the autoscaler's, so each can be revoked alone and the audit log says which
deleted a VM."""

from __future__ import annotations

from typing import Any

from superkube.cluster import health
from superkube.cluster.cloudinit import POOL_LABEL
from superkube.model.ipam import AddressPlan
from superkube.model.spec import PREFLIGHT_TAINT_KEY, ClusterSpec

USER = "superkube-remediation"
"""Its Kubernetes user (a client certificate from the cluster CA): nodes, and nothing else."""
IDENTITY_TAG = "superkube-remediation-identity"
"""The tag on the API-server VMs naming its identity's client ID (the role reads it)."""
ROLE_ACTIONS = (
    "Microsoft.Compute/virtualMachineScaleSets/read",
    "Microsoft.Compute/virtualMachineScaleSets/virtualMachines/read",
    "Microsoft.Compute/virtualMachineScaleSets/delete/action",
)
"""Its custom role's actions: read the sets and their instances, delete instances."""
NODE_RULES = [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "patch", "delete"]}]
LEDGER = "superkube-remediation"
"""The ConfigMap in kube-system where it counts the last hour's deletions (agents.remediation.Ledger)."""
LEDGER_RULES = [
    {"apiGroups": [""], "resources": ["configmaps"], "resourceNames": [LEDGER], "verbs": ["get", "update"]},
    {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["create"]},  # a name cannot fence a create
]
"""Its Role in kube-system: its ledger, and the create of it (an admission policy holds the name)."""


def enabled(spec: ClusterSpec) -> bool:
    return spec.remediation_max_per_hour > 0


def settings(spec: ClusterSpec, addresses: AddressPlan) -> dict[str, Any]:
    """The service's settings from the stack (the host adds the scope and identity); empty where it
    does not run."""
    if not enabled(spec):
        return {}
    return {
        "scale_sets": [
            {"name": s.name, "prefix": s.computer_name_prefix, "pool": pool.name}
            for pool in spec.node_pools
            for s in addresses.pool_scale_sets(pool.name)
        ],
        "deadline_days": {pool.name: pool.remediation_deadline_days for pool in spec.node_pools},
        "max_per_hour": spec.remediation_max_per_hour,
        "max_cordoned_share": spec.health_max_cordoned_share,
        "node_facts": {
            "cordoned": health.CORDONED,
            "cordoned_at": health.CORDONED_AT,
            "drained_at": health.DRAINED_AT,
            "requested_at": health.REMEDIATION_REQUESTED_AT,
            "pool_label": POOL_LABEL,
            "preflight_taint": PREFLIGHT_TAINT_KEY,
            "kind": health.CORDON_KIND,
            "maintenance": health.MAINTENANCE,
            "verdict": health.VERDICT,
            "gpu_reset": health.GPU_RESET,
            "reset_hint": health.RESET_HINT,
        },
        "reset_wait_s": health.RESET_WAIT_S,
    }
