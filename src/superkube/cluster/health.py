"""What health writes on a node, named once: the node agents (superkube.agents.node_health), the
controller that cordons, remediation on the API-server hosts (whose settings carry these) and the
layer's admission fences all read them from here."""

from __future__ import annotations

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
