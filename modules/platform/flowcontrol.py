"""API Priority and Fairness for joining nodes: their bootstrap and registration queue on their own level.

A burst of new kubelets first talks to the API servers as a bootstrap token (group
system:bootstrappers: create and watch a CertificateSigningRequest), then as the node (group
system:nodes: create its Node object). Without these objects, bootstrap requests land in the
built-in `global-default` level beside every user's requests, and the burst competes with them.
With them, joins get a fixed share of each API server's concurrency and wait in the level's queues
when more arrive than that share serves; nobody else's requests wait behind them. The flows are by
user: every node bootstraps with the cluster's one token, so all bootstrap requests are one flow
(spread over `hand_size` queues: hand_size x queue_length_limit of them wait before a 429), and
each node's registration is a flow of its own.

What the level bounds is seats and queues, not CPU: part of what a join costs a server is outside
it (the TLS handshakes, the controller-manager's review, approval and signature in its own level,
the Lease, watch fan-out). At 10 shares an unpaced storm of 2,000 still filled a lab server's core
(a user's p99 3.2x its idle value, bench/join_flow.py); at 1 share with 16 queues of 4 the same
storm took it to 1.2x, the joins slowed to about 10 a second, taking 429s and retrying, and none
failed. So the level ships at 1 share: at the flagship's safe rate (300 a minute over 5 servers, one
join a second per server) it is far from full. Pacing the arrivals (the scale-up governor) is what
keeps everyone else's latency first; the level is the floor under a storm that pacing did not stop.

Only joining traffic is matched. A joined node's status updates and lease renewals stay in the
built-in `system-node-high` level (precedence 400): throttling those would mark healthy nodes
NotReady. Our schemas match at a lower precedence number (350) and only on the join's own verbs.
"""

from __future__ import annotations

from dataclasses import dataclass

import pulumi

from modules.common import require
from modules.platform import objects
from modules.platform.objects import Manifest
from superkube.cluster.kube import APF_NODE_HIGH_PRECEDENCE, APF_NODE_JOIN_LEVEL

LEVEL = APF_NODE_JOIN_LEVEL
COMPONENT = "flowcontrol"
API = "flowcontrol.apiserver.k8s.io/v1"


@dataclass(frozen=True, kw_only=True)
class NodeJoinFlowArgs:
    shares: int = 1
    """nominalConcurrencyShares of the join level (default: 1; bench/join_flow.py measured 10 letting
    a storm take a user's p99 to 3.2x its idle value, 1 with short queues to 1.2x)."""
    queues: int = 16
    """Fair queues of the level (default: 16; the bootstrap token's requests are one flow, each
    joining node's registration another)."""
    hand_size: int = 6
    """Queues each flow is shuffle-sharded over (default: 6)."""
    queue_length_limit: int = 4
    """Requests one queue holds before the API server answers 429 (default: 4: a storm beyond what
    the level serves is told to retry at once, and its kubelets do, rather than queue for minutes)."""
    matching_precedence: int = 350
    """Below system-node-high's 400, so registration is matched before the built-in schema."""

    def __post_init__(self) -> None:
        require(self.shares >= 1, "shares", "must be at least 1")
        require(1 <= self.hand_size <= self.queues, "hand_size", "must be between 1 and queues")
        require(self.queue_length_limit >= 1, "queue_length_limit", "must be at least 1")
        require(
            1 < self.matching_precedence < APF_NODE_HIGH_PRECEDENCE,
            "matching_precedence",
            f"must be above 1 (exempt) and below {APF_NODE_HIGH_PRECEDENCE} (system-node-high), or "
            "node registration is matched by the built-in schema first",
        )


def manifests(args: NodeJoinFlowArgs) -> list[Manifest]:
    def schema(name: str, subject_group: str, rules: list[dict[str, object]]) -> Manifest:
        return {
            "apiVersion": API,
            "kind": "FlowSchema",
            "metadata": objects.meta(name, COMPONENT),
            "spec": {
                "priorityLevelConfiguration": {"name": LEVEL},
                "matchingPrecedence": args.matching_precedence,
                "distinguisherMethod": {"type": "ByUser"},
                "rules": [
                    {
                        "subjects": [{"kind": "Group", "group": {"name": subject_group}}],
                        "resourceRules": rules,
                    }
                ],
            },
        }

    return [
        {
            "apiVersion": API,
            "kind": "PriorityLevelConfiguration",
            "metadata": objects.meta(LEVEL, COMPONENT),
            "spec": {
                "type": "Limited",
                "limited": {
                    "nominalConcurrencyShares": args.shares,
                    # joins neither lend their seats nor borrow others': without a borrowing limit
                    # (unset is no limit) a storm borrows the idle seats of every other level and
                    # the level bounds nothing (bench/join_flow.py saw 1 seat run 7 requests at once)
                    "lendablePercent": 0,
                    "borrowingLimitPercent": 0,
                    "limitResponse": {
                        "type": "Queue",
                        "queuing": {
                            "queues": args.queues,
                            "handSize": args.hand_size,
                            "queueLengthLimit": args.queue_length_limit,
                        },
                    },
                },
            },
        },
        schema(
            "superkube-node-bootstrap",
            "system:bootstrappers",
            [
                {
                    "verbs": ["*"],
                    "apiGroups": ["certificates.k8s.io"],
                    "resources": ["certificatesigningrequests"],
                    "clusterScope": True,
                }
            ],
        ),
        schema(
            "superkube-node-registration",
            "system:nodes",
            [
                {"verbs": ["create"], "apiGroups": [""], "resources": ["nodes"], "clusterScope": True},
                {
                    "verbs": ["create"],
                    "apiGroups": ["certificates.k8s.io"],
                    "resources": ["certificatesigningrequests"],
                    "clusterScope": True,
                },
            ],
        ),
    ]


class NodeJoinFlow(pulumi.ComponentResource):
    """A priority level and two flow schemas that bound and queue joining nodes' requests."""

    def __init__(self, name: str, args: NodeJoinFlowArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("superkube:platform:NodeJoinFlow", name, None, opts)
        self.resources = objects.create(self, name, manifests(args))
        self.register_outputs({"priority_level": LEVEL})
