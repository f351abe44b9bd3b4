"""What health writes on a node, named once: the node agents (superkube.agents.node_health), the
controller that cordons, remediation on the API-server hosts (whose settings carry these) and the
layer's admission fences all read them from here."""

from __future__ import annotations

from pathlib import Path

from superkube.cluster.kube import SYSTEM_NAMESPACE

CORDONED = "superkube.io/health-cordoned"
"""The reason health cordoned the node; marks the nodes health cordoned."""
CORDONED_AT = "superkube.io/health-cordoned-at"
VERDICT = "superkube.io/health-verdict"
"""The node's agent's last verdict, with its reasons."""
VERDICT_AT = "superkube.io/health-verdict-at"
DRAINED_AT = "superkube.io/health-drained-at"
"""The controller: every pod a drain moves is gone from the node it cordoned."""
REMEDIATION_REQUESTED_AT = "superkube.io/remediation-requested-at"
"""Remediation asked Azure to delete the node's VM."""
GPU_TEST_RESULT = "superkube.io/gpu-test-result"
"""The periodic GPU test's last result on its node (the only annotation the test may set)."""
PROTECTED_NAMESPACES = ("kube-system", SYSTEM_NAMESPACE)
"""Never drained by health, and its eviction policy refuses them: the cluster's add-ons and
superkube's own pods (agents, balloons), which a node's drain does not need moved."""
THRESHOLDS = Path(__file__).resolve().parents[1] / "data" / "gpu_health.yaml"
"""The GPU probe's thresholds: the agents read them, the layer ships them as a ConfigMap."""
