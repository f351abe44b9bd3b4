"""One cluster's spoke VNet, peered with the hub and with nothing else."""

from __future__ import annotations

from dataclasses import dataclass, field

import pulumi
from pulumi_azure_native import network

from modules.common import child, require, tagged
from modules.network import vnet
from superkube.model.ipam import SubnetPlan


@dataclass(frozen=True, kw_only=True)
class SpokeArgs:
    cluster: str
    """Cluster name, used in Azure resource names."""
    location: str
    """Azure region."""
    resource_group_name: pulumi.Input[str]
    """Resource group of the cluster."""
    address_space: str
    """Spoke VNet address space (node and pod IPs, control plane, etcd)."""
    subnets: tuple[SubnetPlan, ...]
    """The spoke's subnets from the address plan."""
    hub_vnet_id: pulumi.Input[str]
    """ID of the hub VNet: the only VNet this spoke peers with."""
    hub_vnet_name: pulumi.Input[str]
    """Name of the hub VNet, for the hub-side peering."""
    hub_resource_group_name: pulumi.Input[str]
    """Resource group of the hub VNet."""
    tags: dict[str, str] = field(default_factory=dict)
    """Tags on every resource (default: none)."""

    def __post_init__(self) -> None:
        require(bool(self.subnets), "subnets", "a spoke needs at least one subnet")
        require(
            all(s.vnet == "spoke" for s in self.subnets), "subnets", "every subnet must belong to the spoke"
        )


class Spoke(pulumi.ComponentResource):
    """Spoke VNet, its subnets behind an NSG that refuses the internet, and the two hub peerings.

    The spoke creates both directions of its peering with the hub, so removing a cluster removes
    its peering and nothing else; no code path peers one spoke with another.
    """

    def __init__(self, name: str, args: SpokeArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("superkube:network:Spoke", name, None, opts)
        tags = tagged(args.tags, superkube_role="spoke")
        built = vnet.build(
            self,
            name,
            vnet_name=f"vnet-{args.cluster}",
            nsg_name=f"nsg-{args.cluster}",
            resource_group_name=args.resource_group_name,
            location=args.location,
            address_space=args.address_space,
            subnets=args.subnets,
            tags=tags,
        )
        self.vnet, self.nsg, self.subnets = built.vnet, built.nsg, built.subnets
        # Both directions, hub<->spoke only. Forwarded traffic is allowed so replies through the
        # hub's NAT host come back; gateway transit stays off.
        self.to_hub = network.VirtualNetworkPeering(
            f"{name}-to-hub",
            virtual_network_peering_name=f"{args.cluster}-to-hub",
            resource_group_name=args.resource_group_name,
            virtual_network_name=self.vnet.name,
            remote_virtual_network={"id": args.hub_vnet_id},
            allow_virtual_network_access=True,
            allow_forwarded_traffic=True,
            allow_gateway_transit=False,
            use_remote_gateways=False,
            opts=child(self, depends_on=list(self.subnets.values())),
        )
        self.from_hub = network.VirtualNetworkPeering(
            f"{name}-from-hub",
            virtual_network_peering_name=f"hub-to-{args.cluster}",
            resource_group_name=args.hub_resource_group_name,
            virtual_network_name=args.hub_vnet_name,
            remote_virtual_network={"id": self.vnet.id},
            allow_virtual_network_access=True,
            allow_forwarded_traffic=True,
            allow_gateway_transit=False,
            use_remote_gateways=False,
            opts=child(self, depends_on=list(self.subnets.values())),
        )
        self.subnet_ids = {k: s.id for k, s in self.subnets.items()}
        self.register_outputs({"vnet_id": self.vnet.id, "subnet_ids": self.subnet_ids})
