"""The network board: internal and internet traffic, by node, pod and team."""

from __future__ import annotations

from superkube.cluster.dashboards.panels import Board, C, Row, panel, q

_PODS = f'{C}, namespace=~"$namespace"'
_NODES = f'{C}, pod=""'


def _namespaces() -> Row:
    """The row "Namespaces"."""
    return Row(
        "Namespaces",
        (
            panel(
                "Internet egress by namespace",
                "Bits a second each namespace's pods send outside the cluster's and hub's ranges.",
                q(
                    "sum by (namespace) (rate(iptables_rule_bytes_total"
                    f'{{{_PODS}, traffic="internet-out"}}[$__rate_interval])) * 8',
                    "{{namespace}}",
                ),
                unit="bps",
            ),
            panel(
                "Internet ingress by namespace",
                "Bits a second each namespace's pods receive from outside.",
                q(
                    "sum by (namespace) (rate(iptables_rule_bytes_total"
                    f'{{{_PODS}, traffic="internet-in"}}[$__rate_interval])) * 8',
                    "{{namespace}}",
                ),
                unit="bps",
            ),
            panel(
                "Internal traffic by namespace, out and in",
                "To and from the cluster's and the hub's ranges (other pods, nodes, services).",
                q(
                    "sum by (namespace) (rate(iptables_rule_bytes_total"
                    f'{{{_PODS}, traffic="internal-out"}}[$__rate_interval])) * 8',
                    "{{namespace}} out",
                ),
                q(
                    "sum by (namespace) (rate(iptables_rule_bytes_total"
                    f'{{{_PODS}, traffic="internal-in"}}[$__rate_interval])) * 8',
                    "{{namespace}} in",
                ),
                unit="bps",
            ),
        ),
    )


def _teams() -> Row:
    """The row "Teams"."""
    return Row(
        "Teams",
        (
            panel(
                "Traffic by team",
                "Each namespace's traffic joined to the team its label names "
                "(superkube_namespace_team, from the team-taints reconciler); namespaces of no "
                "team are left out.",
                q(
                    "sum by (team, traffic) (sum by (namespace, traffic) (rate(iptables_rule_bytes_total"
                    f'{{{C}, namespace!=""}}[$__rate_interval])) * on (namespace) group_left (team) '
                    f"max by (namespace, team) (superkube_namespace_team{{{C}}})) * 8",
                    "{{team}} {{traffic}}",
                ),
                unit="bps",
            ),
        ),
    )


def _pods() -> Row:
    """The row "Pods"."""
    return Row(
        "Pods",
        (
            panel(
                "Top 10 pods by internet egress",
                "A pod's new sandbox is a new chain: the sum over chains keeps one series a pod.",
                q(
                    "topk(10, sum by (namespace, pod) (rate(iptables_rule_bytes_total"
                    f'{{{_PODS}, traffic="internet-out"}}[$__rate_interval]))) * 8',
                    "{{namespace}}/{{pod}}",
                ),
                unit="bps",
            ),
            panel(
                "Top 10 pods by internet ingress",
                "Bits a second received from outside.",
                q(
                    "topk(10, sum by (namespace, pod) (rate(iptables_rule_bytes_total"
                    f'{{{_PODS}, traffic="internet-in"}}[$__rate_interval]))) * 8',
                    "{{namespace}}/{{pod}}",
                ),
                unit="bps",
            ),
            panel(
                "Top 10 pods by internal traffic",
                "Out and in together.",
                q(
                    "topk(10, sum by (namespace, pod) (rate(iptables_rule_bytes_total"
                    f'{{{_PODS}, traffic=~"internal-.*"}}[$__rate_interval]))) * 8',
                    "{{namespace}}/{{pod}}",
                ),
                unit="bps",
            ),
        ),
    )


def _nodes_and_the_exporter() -> Row:
    """The row "Nodes and the exporter"."""
    return Row(
        "Nodes and the exporter",
        (
            panel(
                "Nodes' internet traffic",
                'The nodes\' own rules (pod=""), every node together: all a node sends and '
                "receives from outside, its pods' included.",
                q(
                    "sum by (traffic) (rate(iptables_rule_bytes_total"
                    f'{{{_NODES}, traffic=~"internet-.*"}}[$__rate_interval])) * 8',
                    "{{traffic}}",
                ),
                unit="bps",
            ),
            panel(
                "Top 10 nodes by internet egress",
                "NodeInternetEgressHigh fires over 1 Gbit/s for 15 minutes.",
                q(
                    "topk(10, sum by (instance) (rate(iptables_rule_bytes_total"
                    f'{{{_NODES}, traffic="internet-out"}}[$__rate_interval]))) * 8',
                    "{{instance}}",
                ),
                unit="bps",
            ),
            panel(
                "Exporters: failing scrapes and tagged rules",
                "Exporters whose last iptables-save failed, and the tagged label sets they found.",
                q(f"count(iptables_scrape_success{{{C}}} == 0) or vector(0)", "failing"),
                q(f"sum(iptables_tagged_rules{{{C}}})", "tagged rules"),
            ),
            panel(
                "Slowest exporter scrape",
                "iptables-save -c of every table and the parse, on the slowest node.",
                q(f"max(iptables_scrape_duration_seconds{{{C}}})", "slowest"),
                unit="s",
            ),
        ),
    )


def board() -> Board:
    return Board(
        "superkube-network",
        "Network use per namespace and pod",
        "What each namespace and pod sends and receives, split into internet and internal traffic, as "
        "the nodes' iptables accounting counts it (iptables_rule_bytes_total). A node's own series "
        "(pod=\"\") count its pods' internet bytes again: the pod panels read pods' series only.",
        (
            _namespaces(),
            _teams(),
            _pods(),
            _nodes_and_the_exporter(),
        ),
        variables=("cluster", "namespace"),
    )
