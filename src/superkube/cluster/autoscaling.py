"""cluster-autoscaler facts named once: discovery tags, the pinned release, and the join-rate model.

The scale sets' tags (modules/compute/node_pool.py) and the autoscaler's `--node-group-auto-discovery`
flag (`flags`) are both made from `discovery_tags`, so they cannot drift.

Where it runs: a host service on the API-server VMs (role cluster_autoscaler), beside the scheduler
and the controller-manager, with leader election. A pod would need a node that is always there,
which a cluster whose GPU pools scale to zero (and that has no CPU pool) does not have; the
API-server hosts always are. It acts on Azure as a user-assigned identity those VMs carry (`IDENTITY_TAG`
names it) and on the cluster as the user `USER`, with a client certificate from the cluster's PKI.

The join-rate model (`peak_join_rate_per_second`): cluster-autoscaler adds at most
`max_nodes_per_scaleup` nodes per scan (its FAQ: not meant as a rate limit, but while pods stay
pending every scan adds another batch), and each new node waits a uniform random 0..jitter seconds
before its kubelet bootstraps. `bench/join_storm.py` simulates the same burst, with the API Priority
and Fairness queue it meets, and prints the simulated peak beside this formula's.

What the real autoscaler showed (`bench/autoscaler.py`): a loop that scaled up starts the next one
at once ("Autoscaler loop triggered immediately after a scale up"), so `--scan-interval` does not
space the batches; while pods stay pending they follow each other as fast as a loop runs. The
formula's batch every scan interval holds only where a loop takes that long; on a faster host the
batches come sooner. Nothing in the autoscaler's flags bounds the rate (the unready brakes count a
node as unready only after it has been registered and not ready for 15 minutes).

What bounds it: the scale-up governor (`superkube.agents.scale_governor`) holds each scale set's
`max` tag a budget above the autoscaler's target, the budget being the safe rate split over the
provider refreshes a minute can touch. In the same benchmark it kept the busiest minute under the
safe rate, where the flagship's flags alone reach or pass it depending on how fast a loop runs.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from functools import cache
from pathlib import Path

from superkube.cluster.kube import AUTOSCALER_METRICS_PORT
from superkube.model.ipam import AddressPlan
from superkube.model.spec import PREFLIGHT_TAINT_KEY, ClusterSpec

VERSION = "1.35.2"
"""cluster-autoscaler release, matched to the cluster's Kubernetes minor (its release policy)."""
IMAGE = f"registry.k8s.io/autoscaling/cluster-autoscaler:v{VERSION}"
FLAGS = Path(__file__).resolve().parents[3] / "data" / "cluster-autoscaler" / f"{VERSION}.flags"
NODE_TEMPLATE = "k8s.io_cluster-autoscaler_node-template"
"""Prefix of the scale-from-zero template tags (labels, taints, resources) on a scale set."""
BALLOONS = "balloons"
"""The balloons' component label (modules/platform/balloons); each pool's Deployment is BALLOON_PREFIX
and the pool's name. Placeholders that hold a node for the next job: health's drain moves them
too, or a cordoned node would keep its balloon, and the autoscaler a node a balloon fills
(bench/scale_down.py saw it)."""
BALLOON_PREFIX = "balloon-"
EXPENDABLE_CUTOFF = -10
"""`--expendable-pods-priority-cutoff`: pods below it never cause a scale-up (upstream default)."""
PRIORITY_CLASS_MAX = 1_000_000_000
"""The highest value a user-defined PriorityClass may have; above it are the system classes."""


def template_tag(kind: str, name: str) -> str:
    """The scale-set tag that tells the autoscaler a node label, taint or resource of a set's nodes
    (kind `label`, `taint` or `resources`); Azure tag names cannot hold '/', which becomes '_'."""
    return f"{NODE_TEMPLATE}_{kind}_{name.replace('/', '_')}"


USER = "cluster-autoscaler"
GOVERNOR_USER = "superkube-scale-governor"
"""The user the scale-up governor beside it acts as (the in-cluster layer's Role binds it; the
inventory hands it to kube_pki and the scale_governor role)."""
"""The Kubernetes user the autoscaler acts as (its client certificate's CN; RBAC binds this user)."""
NAMESPACE = "kube-system"
"""Where its leader-election lease and status ConfigMap live."""
IDENTITY_TAG = "superkube-autoscaler-identity"
"""Tag on the API-server VMs: client ID of the user-assigned identity the autoscaler uses there."""
SCOPE_TAG = "superkube-autoscaler-scope"
"""Tag on the API-server VMs: the resource group (ID) whose scale sets the autoscaler resizes."""

# What the pinned release's Azure provider calls for Uniform scale sets found by tags, as the role
# sets it up (ARM_VM_TYPE=vmss; no dynamic SKU list, no VMs pools, no Flexible sets). Files are
# cluster-autoscaler/cloudprovider/azure/ at tag cluster-autoscaler-<VERSION> in kubernetes/autoscaler.
ROLE_ACTIONS = (
    # azure_cache.go fetchScaleSets: the scale sets of the group (List), each refresh; discovery reads
    # their tags. azure_scale_set.go getCurSize (Spot sets) and retryCreateOrUpdateWithFreshETag: Get
    "Microsoft.Compute/virtualMachineScaleSets/read",
    # azure_scale_set.go initCreateOrUpdate: the capacity PUT (SKU and location only) of IncreaseSize
    # and AtomicIncreaseSize; the join-token publisher's PATCH of the model's custom data, same identity
    "Microsoft.Compute/virtualMachineScaleSets/write",
    # azure_scale_set.go GetScaleSetVms: the instances with their instance view (ListVMInstanceView),
    # for buildScaleSetCacheForUniform
    "Microsoft.Compute/virtualMachineScaleSets/virtualMachines/read",
    # azure_force_delete_scale_set.go deleteInstances (from azure_scale_set.go DeleteInstances):
    # BeginDeleteInstances, the scale-down and the removal of nodes that never registered
    "Microsoft.Compute/virtualMachineScaleSets/delete/action",
    # azure_cache.go fetchVirtualMachines: lists the group's VMs on every refresh whatever the VM type,
    # and fetchAzureResources fails the refresh when it cannot
    "Microsoft.Compute/virtualMachines/read",
    # the pollers of the two long operations above (waitForCreateOrUpdateInstances,
    # waitForDeleteInstances, AtomicIncreaseSize) read Compute's operation status
    "Microsoft.Compute/locations/operations/read",
)
"""The autoscaler identity's custom role, on the cluster's resource group: what cluster-autoscaler
(and the join-token publisher beside it) call, and nothing else. Not in it: Microsoft.Compute/skus/read
(azure_cache.go fetchSKUs runs only with AZURE_ENABLE_DYNAMIC_INSTANCE_LIST, which the role does not
set; scale-from-zero uses the static size list and the node-template tags), NICs, disks and
standalone VM deletes (azure_util.go, for the `standard` VM type only)."""
GOVERNOR_ACTIONS = (
    # superkube.agents.scale_governor AzureTags.set_max: PATCH
    # <scale set>/providers/Microsoft.Resources/tags/default (Tags, Update At Scope, Merge)
    "Microsoft.Resources/tags/write",
)
"""Added to the same role where the scale-up governor runs: it writes the scale sets' `max` tags."""


def role_actions(spec: ClusterSpec) -> tuple[str, ...]:
    """The actions of the autoscaler identity's custom role for this stack."""
    return ROLE_ACTIONS + (GOVERNOR_ACTIONS if spec.autoscaler_governor else ())


ENABLED_TAG = "cluster-autoscaler-enabled"
NAME_TAG = "cluster-autoscaler-name"


def discovery_tags(cluster: str) -> dict[str, str]:
    """The tags that make a scale set one of this cluster's autoscaled node groups."""
    return {ENABLED_TAG: "true", NAME_TAG: cluster}


def is_autoscaled(tags: Mapping[str, str]) -> bool:
    """Whether a scale set's tags enlist it for cluster-autoscaler."""
    return tags.get(ENABLED_TAG) == "true"


def auto_discovery_flag(cluster: str) -> str:
    """`--node-group-auto-discovery` value that finds exactly the scale sets carrying `discovery_tags`."""
    return "label:" + ",".join(f"{k}={v}" for k, v in discovery_tags(cluster).items())


def parse_auto_discovery(value: str) -> dict[str, str]:
    """The tag filter a `label:k=v,...` discovery spec selects (for checks that compare both sides)."""
    kind, _, pairs = value.partition(":")
    if kind != "label" or not pairs:
        return {}
    return dict(pair.partition("=")[::2] for pair in pairs.split(","))


@cache
def reference_flags() -> frozenset[str]:
    """Every flag the pinned release accepts (data made by scripts/autoscaler_flags.py)."""
    return frozenset(
        line.strip() for line in FLAGS.read_text().splitlines() if line.strip() and not line.startswith("#")
    )


_FLAG = re.compile(r"^--([a-z0-9-]+)(=.*)?$")


def unknown_flags(args: list[str]) -> list[str]:
    """The arguments that are not flags of the pinned release."""
    known = reference_flags()
    bad = []
    for arg in args:
        m = _FLAG.match(arg)
        if not m or m.group(1) not in known:
            bad.append(arg)
    return bad


def peak_join_rate_per_second(nodes: int, per_scaleup: int, scan_interval: float, jitter: float) -> float:
    """Peak rate (nodes/second) at which a scale-up of `nodes` reaches the API servers' join path.

    Batches of b = min(per_scaleup, nodes) start every `scan_interval` seconds, ceil(nodes / b) of
    them; each spreads its nodes evenly over the `jitter` window that follows. At any moment at most
    ceil(jitter / scan_interval) windows overlap, each adding b / jitter nodes per second. Without a
    jitter window a whole batch arrives within one second.
    """
    if nodes <= 0:
        return 0.0
    batch = min(per_scaleup, nodes)
    if jitter < 1:
        return float(batch)
    batches = -(-nodes // batch)
    overlapping = min(batches, math.ceil(jitter / scan_interval))
    return overlapping * batch / jitter


def max_nodes_total(spec: ClusterSpec) -> int:
    """The node-count ceiling: the spec's, or every pool's capacity added up."""
    return spec.autoscaler_max_nodes_total or sum(p.nodes for p in spec.node_pools)


def governor_settings(spec: ClusterSpec, addresses: AddressPlan) -> dict[str, object]:
    """The scale-up governor's settings from the stack (the host adds the scope and identity it acts
    with): every autoscaled scale set's ceiling, its planned capacity; the safe rate; and how many
    nodes may be stuck before it opens no more room (the autoscaler's own tolerance). Empty where the
    stack runs no governor."""
    if not (spec.autoscaler_enabled and spec.autoscaler_governor):
        return {}
    return {
        "ceilings": {
            s.name: s.capacity for pool in spec.node_pools for s in addresses.pool_scale_sets(pool.name)
        },
        "safe_join_rate_per_minute": spec.safe_join_rate_per_minute,
        "max_unready": spec.autoscaler_ok_total_unready_count,
    }


def flags(spec: ClusterSpec, cluster: str) -> list[str]:
    """The autoscaler's command line from the spec; every flag is one of the pinned release's.

    Where it finds its kubeconfig is the host's (the role adds it); everything the cluster's shape
    decides is here, so the plan, the policy rules and the host read one list."""
    return [
        "--cloud-provider=azure",
        f"--node-group-auto-discovery={auto_discovery_flag(cluster)}",
        "--balance-similar-node-groups=true",  # a pool is several scale sets over zones: grow them evenly
        "--expander=least-waste",
        f"--max-nodes-total={max_nodes_total(spec)}",
        f"--max-nodes-per-scaleup={spec.autoscaler_max_nodes_per_scaleup}",
        f"--scan-interval={spec.autoscaler_scan_interval_seconds}s",
        f"--max-total-unready-percentage={spec.autoscaler_max_total_unready_percentage}",
        f"--ok-total-unready-count={spec.autoscaler_ok_total_unready_count}",
        f"--new-pod-scale-up-delay={spec.autoscaler_new_pod_scale_up_delay_seconds}s",
        f"--max-node-provision-time={spec.autoscaler_max_node_provision_minutes}m",
        f"--expendable-pods-priority-cutoff={EXPENDABLE_CUTOFF}",
        # a GPU node registers behind the preflight taint, so the scale sets' templates carry it and
        # no workload tolerates it: unless it is a startup taint (left out of the simulated node, and
        # a node still carrying it counts as starting) no pod ever makes a GPU pool grow
        f"--startup-taint={PREFLIGHT_TAINT_KEY}",
        "--skip-nodes-with-local-storage=false",  # training pods use emptyDir scratch; they must not pin nodes
        "--leader-elect=true",
        f"--leader-elect-resource-namespace={NAMESPACE}",
        f"--address=:{AUTOSCALER_METRICS_PORT}",  # its /metrics, which the monitoring hosts scrape
    ]
