"""The in-cluster layer: every Kubernetes object superkube puts into a cluster, through one provider.

Deployed by the same `pulumi up` once the control plane answers: `pulumi up` (Azure) -> `superkube
converge` (control plane; writes pki/admin.kubeconfig) -> `pulumi config set --secret
kubernetes:kubeconfig` -> `pulumi up` again. Each part is one component; later parts (node agents,
gang scheduling, team capacity, monitoring) are one more component each.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pulumi
import pulumi_kubernetes as k8s

from modules.common import require
from modules.platform.autoscaler import Autoscaler, AutoscalerArgs
from modules.platform.balloons import Balloons, BalloonsArgs
from modules.platform.dns import ClusterDns, ClusterDnsArgs
from modules.platform.flowcontrol import NodeJoinFlow, NodeJoinFlowArgs
from modules.platform.foundation import Foundation, FoundationArgs
from modules.platform.gang import GangScheduling, GangSchedulingArgs
from modules.platform.gpu_devices import GpuDevices, GpuDevicesArgs
from modules.platform.join_tokens import JoinTokens, JoinTokensArgs
from modules.platform.monitoring_access import MonitoringAccess, MonitoringAccessArgs
from modules.platform.node_health import NodeHealth, NodeHealthArgs
from modules.platform.serving_certs import ServingCerts, ServingCertsArgs
from modules.platform.team_capacity import TeamCapacity, TeamCapacityArgs
from superkube.cluster import autoscaling, kube, remediation
from superkube.model import vmsizes
from superkube.model.spec import ClusterSpec

SKIP_AWAIT = "pulumi.com/skipAwait"


def skip_await(args: pulumi.ResourceTransformationArgs) -> pulumi.ResourceTransformationResult | None:
    """Each Kubernetes object annotated so that the provider does not wait for it to become ready."""
    if not args.type_.startswith("kubernetes:") or args.type_.startswith("pulumi:providers:"):
        return None
    given = args.props.get("metadata")
    metadata: dict[str, Any] = dict(given) if isinstance(given, dict) else {}
    annotations = metadata.get("annotations")
    metadata["annotations"] = {**(annotations if isinstance(annotations, dict) else {}), SKIP_AWAIT: "true"}
    return pulumi.ResourceTransformationResult({**args.props, "metadata": metadata}, args.opts)


@dataclass(frozen=True, kw_only=True)
class InClusterLayerArgs:
    spec: ClusterSpec
    """The validated spec of this stack."""
    cluster: str
    """Cluster name (the autoscaler's discovery tag value)."""
    kubeconfig: pulumi.Input[str]
    """Admin kubeconfig of the cluster (the secret `kubernetes:kubeconfig`)."""
    team_webhook_tls: pulumi.Input[str] | None = None
    """The team webhook's PEM bundle: certificate, key, CA (required when spec.teams is not empty)."""
    node_documents: dict[str, str] = field(default_factory=dict)
    """Node scale set -> its #cloud-config document (for the join-token publisher; empty: none)."""
    apiserver_address: str = ""
    """HOST:PORT of the API servers' load balancer (the health agents check they reach it)."""
    await_ready: bool = True
    """The provider waits for workloads and Services to become ready (default True); False: every
    object is annotated `pulumi.com/skipAwait` (spec.kubernetes_await false: a cluster with no nodes)."""

    def __post_init__(self) -> None:
        require(
            self.team_webhook_tls is not None or not self.spec.teams,
            "team_webhook_tls",
            "the team webhook (spec.teams) needs its certificate bundle",
        )


class InClusterLayer(pulumi.ComponentResource):
    """Provider, foundation (namespace, PriorityClasses), cluster DNS, autoscaler, join flow control, balloons,
    the node agents, the monitoring hosts' access, and the kubelets' serving-certificate approver."""

    def __init__(
        self, name: str, args: InClusterLayerArgs, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        if not args.await_ready:  # a transformation of the layer applies to all its children
            opts = pulumi.ResourceOptions.merge(opts, pulumi.ResourceOptions(transformations=[skip_await]))
        super().__init__("superkube:platform:InClusterLayer", name, None, opts)
        spec = args.spec
        self.provider = k8s.Provider(
            f"{name}-provider",
            kubeconfig=pulumi.Output.secret(args.kubeconfig),
            enable_server_side_apply=True,
            # the layer's ConfigMaps and Secrets have fixed names that running agents read: a change
            # updates them in place (as kubectl apply does), where the provider would otherwise
            # replace them, deleting and re-creating the object under the same name
            enable_config_map_mutable=True,
            enable_secret_mutable=True,
            opts=pulumi.ResourceOptions(parent=self),
        )
        inherit = pulumi.ResourceOptions(parent=self, providers=[self.provider])
        self.foundation = Foundation(f"{name}-foundation", FoundationArgs(), opts=inherit)
        after = pulumi.ResourceOptions.merge(inherit, pulumi.ResourceOptions(depends_on=[self.foundation]))
        # the kubelets' clusterDNS address (the kubelet role's default, superkube.cluster.kube)
        self.dns = ClusterDns(
            f"{name}-dns",
            ClusterDnsArgs(
                service_ip=kube.service_ip(spec.service_cidr, kube.DNS_SERVICE_INDEX),
                domain=kube.CLUSTER_DOMAIN,
                pools=spec.node_pools,
                # each on a node of its own: a stack of fewer nodes gets one per node
                replicas=min(spec.dns_replicas, sum(pool.nodes for pool in spec.node_pools)),
            ),
            opts=after,
        )
        self.join_flow = NodeJoinFlow(
            f"{name}-flowcontrol", NodeJoinFlowArgs(shares=spec.apf_node_join_shares), opts=inherit
        )
        # with autoscaler_enabled false the scale sets carry no discovery tags: nothing to permit
        self.autoscaler = None
        if spec.autoscaler_enabled:
            governor = autoscaling.GOVERNOR_USER if spec.autoscaler_governor else None
            self.autoscaler = Autoscaler(
                f"{name}-autoscaler", AutoscalerArgs(governor_user=governor), opts=after
            )
        sized = [
            (pool, vmsizes.size(pool.vm_size, f"node_pools[{pool.name}].vm_size")) for pool in spec.node_pools
        ]
        self.balloons = Balloons(
            f"{name}-balloons", BalloonsArgs(pools=sized, hold_nodes=spec.balloons_enabled), opts=after
        )
        self.node_health = NodeHealth(
            f"{name}-node-health",
            NodeHealthArgs(
                pools=sized,
                api_address=args.apiserver_address,
                remediation=remediation.enabled(spec),
                max_cordoned_share=spec.health_max_cordoned_share,
                dry_run=spec.health_dry_run,
                dcgm_url=spec.health_dcgm_exporter_url,
                burn_seconds=spec.gpu_burn_seconds,
                test_schedule=spec.gpu_test_schedule,
                test_nodes=spec.gpu_test_nodes,
            ),
            opts=after,
        )
        self.gpu_devices = GpuDevices(
            f"{name}-gpu-devices",
            GpuDevicesArgs(pools=[pool.name for pool, _ in sized if pool.role == "gpu"]),
            opts=after,
        )
        self.monitoring_access = MonitoringAccess(
            f"{name}-monitoring-access", MonitoringAccessArgs(), opts=after
        )
        self.serving_certs = ServingCerts(f"{name}-serving-certs", ServingCertsArgs(), opts=after)
        self.join_tokens = None
        if args.node_documents:
            self.join_tokens = JoinTokens(
                f"{name}-join-tokens", JoinTokensArgs(documents=args.node_documents), opts=after
            )
        self.gang = GangScheduling(
            f"{name}-gang", GangSchedulingArgs(kubernetes_version=spec.kubernetes_version), opts=after
        )
        self.team_capacity = None
        if spec.teams and args.team_webhook_tls is not None:
            self.team_capacity = TeamCapacity(
                f"{name}-teams",
                TeamCapacityArgs(tuples=spec.teams, webhook_tls=args.team_webhook_tls),
                opts=after,
            )
        components = [
            "foundation",
            "dns",
            "flowcontrol",
            "balloons",
            "gpu-devices",
            "node-health",
            "monitoring-access",
            "serving-certs",
        ]
        components += ["gang"] + (["join-tokens"] if self.join_tokens else [])
        components += (["autoscaler"] if self.autoscaler else []) + (
            ["team-capacity"] if self.team_capacity else []
        )
        self.components = components
        self.register_outputs({"components": components})
