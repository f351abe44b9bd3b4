"""cluster-autoscaler facts named once: discovery tags, the pinned release, and the join-rate model.

The scale sets' tags (modules/compute/node_pool.py) and the autoscaler's `--node-group-auto-discovery`
flag (modules/platform/autoscaler.py) are both made from `discovery_tags`, so they cannot drift.

The join-rate model: cluster-autoscaler adds at most `max_nodes_per_scaleup` nodes per scan (its
FAQ: not meant as a rate limit, but while pods stay pending every scan adds another batch), so a
full-pool scale-up asks Azure for nodes at r = max_nodes_per_scaleup / scan_interval per second for
N / r seconds. Each new node then waits a uniform random 0..W seconds (the join jitter) before its
kubelet bootstraps. The arrival rate at the API servers is that rectangle smoothed by a uniform
window of width W, whose peak is r * min(N / r, W) / W = min(r, N / W). `bench/join_storm.py`
simulates the same thing with the API Priority and Fairness queue and prints both.
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

from superkube.spec import ClusterSpec

VERSION = "1.35.2"
"""cluster-autoscaler release, matched to the cluster's Kubernetes minor (its release policy)."""
IMAGE = f"registry.k8s.io/autoscaling/cluster-autoscaler:v{VERSION}"
FLAGS = Path(__file__).resolve().parents[2] / "data" / "cluster-autoscaler" / f"{VERSION}.flags"
NODE_TEMPLATE = "k8s.io_cluster-autoscaler_node-template"
"""Prefix of the scale-from-zero template tags (labels, taints, resources) on a scale set."""
EXPENDABLE_CUTOFF = -10
"""`--expendable-pods-priority-cutoff`: pods below it never cause a scale-up (upstream default)."""
PRIORITY_CLASS_MAX = 1_000_000_000
"""The highest value a user-defined PriorityClass may have; above it are the system classes."""


def discovery_tags(cluster: str) -> dict[str, str]:
    """The tags that make a scale set one of this cluster's autoscaled node groups."""
    return {"cluster-autoscaler-enabled": "true", "cluster-autoscaler-name": cluster}


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


def issue_rate_per_second(spec: ClusterSpec) -> float:
    """Nodes per second the autoscaler asks Azure for while pods stay pending."""
    return spec.autoscaler_max_nodes_per_scaleup / spec.autoscaler_scan_interval_seconds


def peak_join_rate_per_minute(nodes: int, spec: ClusterSpec) -> float:
    """Peak rate (nodes/minute) at which a scale-up of `nodes` reaches the API servers' join path."""
    rate = issue_rate_per_second(spec)
    jitter = spec.autoscaler_join_jitter_seconds
    peak = rate if jitter == 0 else min(rate, nodes / jitter)
    return 60 * peak


def max_nodes_total(spec: ClusterSpec) -> int:
    """The node-count ceiling: the spec's, or every pool's capacity added up."""
    return spec.autoscaler_max_nodes_total or sum(p.nodes for p in spec.node_pools)
