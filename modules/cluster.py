"""The whole cluster: hub, spoke, NAT host, node pools, API servers and the split etcd."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from ipaddress import IPv4Address
from typing import Any, Literal

import pulumi
from pulumi_azure_native import authorization, managedidentity, resources

from modules.common import child, require
from modules.compute.monitoring import HostsArgs, MonitoringHosts, MonitoringHostsArgs
from modules.compute.node_images import NodeImages, NodeImagesArgs
from modules.compute.node_pool import NodePool, NodePoolArgs
from modules.control_plane.apiservers import ApiServers, ApiServersArgs
from modules.control_plane.etcd import EtcdCluster, EtcdClusterArgs
from modules.network.hub import Hub, HubArgs
from modules.network.nat_host import NatHost, NatHostArgs
from modules.network.spoke import Spoke, SpokeArgs
from modules.platform.layer import InClusterLayer, InClusterLayerArgs
from superkube.agents import scale_governor
from superkube.cluster import autoscaling, inventory, kube, remediation
from superkube.model.ipam import AddressPlan
from superkube.model.spec import ClusterSpec


@dataclass(frozen=True, kw_only=True)
class ClusterArgs:
    spec: ClusterSpec
    """The validated spec of this stack."""
    plan: AddressPlan
    """The address plan made from the spec (every subnet, scale set and static IP)."""
    kubeconfig: pulumi.Input[str] | None = None
    """Admin kubeconfig for the in-cluster layer (default: none; required when spec.in_cluster_layer)."""
    team_webhook_tls: pulumi.Input[str] | None = None
    """The team webhook's PEM bundle (default: none; required when the layer has teams)."""

    def __post_init__(self) -> None:
        require(
            len(self.plan.apiserver_ips) == self.spec.apiserver_count, "plan", "was made from another spec"
        )
        require(
            self.kubeconfig is not None or not self.spec.in_cluster_layer,
            "kubeconfig",
            "the in-cluster layer needs the cluster's admin kubeconfig",
        )


def etcd_clusters(plan: AddressPlan) -> tuple[tuple[Literal["main", "events"], tuple[IPv4Address, ...]], ...]:
    """The two etcd clusters and their members' addresses."""
    return (("main", plan.etcd_main_ips), ("events", plan.etcd_events_ips))


def governed_maxes(spec: ClusterSpec, plan: AddressPlan) -> dict[str, int] | None:
    """Each autoscaled scale set's first `max` tag where the scale-up governor runs: its min plus an
    even share of one refresh's room, so the autoscaler's first look cannot see a set's whole capacity.
    None where it does not run (the tag is then the capacity)."""
    ceilings = autoscaling.governor_settings(spec, plan).get("ceilings")
    if not isinstance(ceilings, dict):
        return None
    floors = {s.name: s.min_nodes for pool in spec.node_pools for s in plan.pool_scale_sets(pool.name)}
    room = scale_governor.budget(spec.safe_join_rate_per_minute)
    return scale_governor.initial_maxes(ceilings, floors, room, floors)


def standard_tags(spec: ClusterSpec, cluster: str) -> dict[str, str]:
    """The tags every taggable resource carries: cluster, owner and environment."""
    return {
        "cluster": cluster,
        "owner": spec.team,
        "environment": spec.environment,
        "managed-by": "superkube",
    }


@dataclass(frozen=True)
class _Site:
    """What every resource of one cluster is made with: its Pulumi name's prefix, the cluster's
    name, region, tags and the hosts' admin login, and the control plane's zones."""

    name: str
    cluster: str
    location: str
    tags: dict[str, str]
    login: dict[str, str]
    zones: tuple[str, ...]


class Cluster(pulumi.ComponentResource):
    """Everything one `pulumi up -s <cluster>` creates, tier by tier: the network, the host
    services' identities, the control plane (and the monitoring hosts beside it), the node pools,
    and the in-cluster layer."""

    def __init__(self, name: str, args: ClusterArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("superkube:cluster:Cluster", name, None, opts)
        spec, plan = args.spec, args.plan
        site = _Site(
            name=name,
            cluster=plan.cluster,
            location=spec.region,
            tags=standard_tags(spec, plan.cluster),
            login={"admin_username": spec.admin_username, "ssh_public_key": spec.ssh_public_key},
            zones=tuple(spec.control_plane_zones),
        )
        subscription_id = authorization.get_client_config_output(
            opts=pulumi.InvokeOutputOptions(parent=self)
        ).subscription_id
        self._network(site, spec, plan)
        identity_ids, host_tags = self._host_identities(site, spec)
        self._control_plane(site, spec, plan, subscription_id, identity_ids, host_tags)
        self._compute(site, spec, plan)
        self.in_cluster = None
        if spec.in_cluster_layer and args.kubeconfig is not None:
            self.in_cluster = InClusterLayer(
                f"{name}-in-cluster",
                InClusterLayerArgs(
                    spec=spec,
                    cluster=site.cluster,
                    kubeconfig=args.kubeconfig,
                    team_webhook_tls=args.team_webhook_tls,
                    node_documents={k: v for pool in self.pools for k, v in pool.documents.items()},
                    apiserver_address=f"{plan.apiserver_lb_ip}:{kube.APISERVER_PORT}",
                    await_ready=spec.kubernetes_await,
                ),
                opts=child(self),
            )
        self.outputs = {
            "apiserver_endpoint": self.apiservers.endpoint,
            "etcd_servers": ",".join(self.etcd["main"].client_urls),
            "etcd_servers_overrides": "/events#" + ";".join(self.etcd["events"].client_urls),
            "nat_host_ip": str(plan.nat_host_ip),
            "service_cidr": str(plan.service_cidr),
            "hub_vnet_id": self.hub.vnet.id,
            "spoke_vnet_id": self.spoke.vnet.id,
            "scale_sets": [s.name for s in plan.scale_sets],
        }
        self.register_outputs(self.outputs)

    def _network(self, site: _Site, spec: ClusterSpec, plan: AddressPlan) -> None:
        """The two resource groups, the hub, the spoke peered with it, and the NAT host."""
        name, cluster, location, tags = site.name, site.cluster, site.location, site.tags
        self.hub_group = resources.ResourceGroup(
            f"{name}-hub-rg",
            resource_group_name=inventory.resource_group(cluster, hub=True),
            location=location,
            tags=tags,
            opts=child(self),
        )
        self.group = resources.ResourceGroup(
            f"{name}-rg",
            resource_group_name=inventory.resource_group(cluster),
            location=location,
            tags=tags,
            opts=child(self),
        )
        self.hub = Hub(
            f"{name}-hub",
            HubArgs(
                cluster=cluster,
                location=location,
                resource_group_name=self.hub_group.name,
                address_space=str(plan.hub.address_space),
                subnets=tuple(s for s in plan.subnets if s.vnet == "hub"),
                tags=tags,
            ),
            opts=child(self),
        )
        self.spoke = Spoke(
            f"{name}-spoke",
            SpokeArgs(
                cluster=cluster,
                location=location,
                resource_group_name=self.group.name,
                address_space=str(plan.spoke.address_space),
                subnets=tuple(s for s in plan.subnets if s.vnet == "spoke"),
                hub_vnet_id=self.hub.vnet.id,
                hub_vnet_name=self.hub.vnet_name,
                hub_resource_group_name=self.hub_group.name,
                tags=tags,
            ),
            opts=child(self),
        )
        self.nat_host = NatHost(
            f"{name}-nat",
            NatHostArgs(
                cluster=cluster,
                location=location,
                resource_group_name=self.hub_group.name,
                subnet_id=self.hub.subnets["nat"].id,
                private_ip=str(plan.nat_host_ip),
                route_table_name=self.hub.route_table_name,
                service_cidr=str(plan.service_cidr),
                vm_size=spec.nat_host_vm_size,
                tags=tags,
                **site.login,
            ),
            opts=child(self),
        )

    def _user_identity(self, site: _Site, what: str) -> managedidentity.UserAssignedIdentity:
        """A user-assigned identity of the cluster's, for one host service."""
        return managedidentity.UserAssignedIdentity(
            f"{site.name}-{what}-identity",
            resource_name_=f"id-{site.cluster}-{what}",
            resource_group_name=self.group.name,
            location=site.location,
            tags=site.tags,
            opts=child(self),
        )

    def _custom_role(
        self,
        site: _Site,
        what: str,
        assignment: str,
        actions: Sequence[str],
        description: str,
        identity: managedidentity.UserAssignedIdentity,
    ) -> tuple[authorization.RoleDefinition, authorization.RoleAssignment]:
        """A custom role with only `actions` on the cluster's resource group, and its assignment
        to `identity` (stable names: the role's and `assignment`'s, made from the cluster's)."""
        name, cluster = site.name, site.cluster
        definition = authorization.RoleDefinition(
            f"{name}-{what}-role-definition",
            role_definition_id=str(uuid.uuid5(uuid.NAMESPACE_URL, f"superkube/{cluster}/{what}-role")),
            role_name=f"superkube {cluster} {what}",
            description=description,
            role_type="CustomRole",
            permissions=[authorization.PermissionArgs(actions=list(actions))],
            assignable_scopes=[self.group.id],
            scope=self.group.id,
            opts=child(self),
        )
        granted = authorization.RoleAssignment(
            f"{name}-{what}-role",
            role_assignment_name=str(uuid.uuid5(uuid.NAMESPACE_URL, f"superkube/{cluster}/{assignment}")),
            principal_id=identity.principal_id,
            principal_type="ServicePrincipal",
            role_definition_id=definition.id,
            scope=self.group.id,
            opts=child(self),
        )
        return definition, granted

    def _host_identities(
        self, site: _Site, spec: ClusterSpec
    ) -> tuple[list[pulumi.Output[str]], dict[str, pulumi.Input[str]]]:
        """The identities the API-server hosts' services act on Azure as (cluster-autoscaler and
        remediation, each with a custom role on the resource group), and the tags that tell those
        services who they are: (identity IDs, tags)."""
        # cluster-autoscaler runs on the API-server hosts (superkube.cluster.autoscaling says why) and
        # resizes the scale sets as this identity, which those VMs carry; their tags tell the host
        # service the identity's client ID and the resource group it may act in.
        self.autoscaler_identity: managedidentity.UserAssignedIdentity | None = None
        self.autoscaler_role_definition: authorization.RoleDefinition | None = None
        self.autoscaler_role: authorization.RoleAssignment | None = None
        host_tags: dict[str, pulumi.Input[str]] = {}
        if spec.autoscaler_enabled:
            self.autoscaler_identity = self._user_identity(site, "autoscaler")
            # one custom role with what the autoscaler, the join-token publisher and the governor
            # call (superkube.cluster.autoscaling.ROLE_ACTIONS says which call needs which), where a
            # built-in role such as Virtual Machine Contributor could delete any VM of the group; the
            # assignment's name is new (an assignment cannot change its role in place)
            self.autoscaler_role_definition, self.autoscaler_role = self._custom_role(
                site, "autoscaler", "autoscaler-custom-role", autoscaling.role_actions(spec),
                "Resize, list and delete instances of the cluster's scale sets; nothing else.",
                self.autoscaler_identity,
            )  # fmt: skip
            host_tags = {
                autoscaling.IDENTITY_TAG: self.autoscaler_identity.client_id,
                autoscaling.SCOPE_TAG: self.group.id,
            }
        # remediation beside them deletes the VMs of nodes health cordoned, as an identity of its own
        # whose custom role may only read the scale sets and delete their instances
        self.remediation_identity: managedidentity.UserAssignedIdentity | None = None
        self.remediation_role: authorization.RoleAssignment | None = None
        if remediation.enabled(spec):
            self.remediation_identity = self._user_identity(site, "remediation")
            _, self.remediation_role = self._custom_role(
                site, "remediation", "remediation", remediation.ROLE_ACTIONS,
                "Read the cluster's scale sets and delete their instances; nothing else.",
                self.remediation_identity,
            )  # fmt: skip
            host_tags = {
                **host_tags,
                remediation.IDENTITY_TAG: self.remediation_identity.client_id,
                autoscaling.SCOPE_TAG: self.group.id,
            }
        identities = [i.id for i in (self.autoscaler_identity, self.remediation_identity) if i is not None]
        return identities, host_tags

    def _control_plane(
        self,
        site: _Site,
        spec: ClusterSpec,
        plan: AddressPlan,
        subscription_id: pulumi.Output[str],
        identity_ids: list[pulumi.Output[str]],
        host_tags: dict[str, pulumi.Input[str]],
    ) -> None:
        """The API servers behind their load balancer, both etcd clusters, and the monitoring hosts."""
        name, cluster, location, tags, zones = site.name, site.cluster, site.location, site.tags, site.zones
        self.apiservers = ApiServers(
            f"{name}-apiservers",
            ApiServersArgs(
                cluster=cluster,
                location=location,
                subscription_id=subscription_id,
                resource_group_name=inventory.resource_group(cluster),
                subnet_id=self.spoke.subnets["apiservers"].id,
                frontend_ip=str(plan.apiserver_lb_ip),
                member_ips=[str(ip) for ip in plan.apiserver_ips],
                vm_size=spec.apiserver_vm_size,
                zones=zones,
                tags=tags,
                identity_ids=identity_ids,
                autoscaler_tags=host_tags,
                **site.login,
            ),
            opts=child(self, depends_on=[self.group]),
        )
        self.etcd = {
            role: EtcdCluster(
                f"{name}-etcd-{role}",
                EtcdClusterArgs(
                    cluster=cluster,
                    role=role,
                    location=location,
                    resource_group_name=self.group.name,
                    subnet_id=self.spoke.subnets[f"etcd-{role}"].id,
                    member_ips=[str(ip) for ip in ips],
                    vm_size=spec.etcd_vm_size,
                    disk_sku=spec.etcd_disk_sku,
                    disk_gb=spec.etcd_disk_gb,
                    zones=zones,
                    tags=tags,
                    **site.login,
                ),
                opts=child(self),
            )
            for role, ips in etcd_clusters(plan)
        }
        where: dict[str, Any] = {"location": location, "resource_group_name": self.group.name, **site.login}
        self.monitoring = MonitoringHosts(
            f"{name}-monitoring",
            MonitoringHostsArgs(
                cluster=cluster,
                prometheus=HostsArgs(
                    subnet_id=self.spoke.subnets["prometheus"].id, vm_size=spec.prometheus_vm_size, **where
                ),
                prometheus_ips=[str(ip) for ip in plan.prometheus_ips],
                prometheus_disk_gb=spec.prometheus_disk_gb,
                store=HostsArgs(
                    subnet_id=self.spoke.subnets["metrics-store"].id,
                    vm_size=spec.metrics_store_vm_size,
                    **where,
                ),
                store_ips=[str(ip) for ip in plan.metrics_store_ips],
                store_disk_gb=spec.metrics_store_disk_gb,
                zones=zones,
                tags=tags,
            ),
            opts=child(self),
        )

    def _compute(self, site: _Site, spec: ClusterSpec, plan: AddressPlan) -> None:
        """The pools' node images (a gallery image per kind) and the node pools' scale sets."""
        name, cluster, location, tags = site.name, site.cluster, site.location, site.tags
        self.node_images = NodeImages(
            f"{name}-node-images",
            NodeImagesArgs(
                cluster=cluster,
                location=location,
                resource_group_name=self.group.name,
                kinds=sorted({pool.role for pool in spec.node_pools}),
                tags=tags,
            ),
            opts=child(self),
        )
        self.pools = [
            NodePool(
                f"{name}-pool-{pool.name}",
                NodePoolArgs(
                    cluster=cluster,
                    location=location,
                    resource_group_name=self.group.name,
                    pool=pool,
                    scale_sets=plan.pool_scale_sets(pool.name),
                    subnet_ids=self.spoke.subnet_ids,
                    apiserver_endpoint=self.apiservers.endpoint,
                    kubernetes_version=spec.kubernetes_version,
                    join_jitter_seconds=spec.autoscaler_join_jitter_seconds,
                    terminate_notice_minutes=spec.terminate_notice_minutes,
                    autoscaler=spec.autoscaler_enabled,
                    tags=tags,
                    team=spec.pool_team(pool, cluster),
                    initial_max=governed_maxes(spec, plan),
                    image_id=self.node_images.image_ids[pool.role],
                    **site.login,
                ),
                opts=child(self),
            )
            for pool in spec.node_pools
        ]
