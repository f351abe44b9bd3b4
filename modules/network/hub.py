"""The hub VNet: the NAT host's subnet and a shared subnet whose routes reach every cluster."""

from __future__ import annotations

from dataclasses import dataclass, field

import pulumi
from pulumi_azure_native import network

from modules.common import child, require, tagged
from modules.network import vnet
from superkube.model.ipam import SubnetPlan


@dataclass(frozen=True, kw_only=True)
class HubArgs:
    cluster: str
    """Cluster name, used in Azure resource names."""
    location: str
    """Azure region."""
    resource_group_name: pulumi.Input[str]
    """Resource group of the hub."""
    address_space: str
    """Hub VNet address space."""
    subnets: tuple[SubnetPlan, ...]
    """The hub's subnets from the address plan: `nat` and `shared`."""
    tags: dict[str, str] = field(default_factory=dict)
    """Tags on every resource (default: none)."""

    def __post_init__(self) -> None:
        names = {s.name for s in self.subnets}
        require(
            names == {"nat", "shared"},
            "subnets",
            f"the hub needs exactly nat and shared, got {sorted(names)}",
        )
        require(all(s.vnet == "hub" for s in self.subnets), "subnets", "every subnet must belong to the hub")


class Hub(pulumi.ComponentResource):
    """Hub VNet, an NSG that refuses the internet inbound, and a route table for the shared subnet.

    Clusters add their service-CIDR route to `route_table_name` (see NatHost), so traffic from the
    hub to a cluster's services goes through that cluster's NAT host.
    """

    def __init__(self, name: str, args: HubArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("superkube:network:Hub", name, None, opts)
        tags = tagged(args.tags, superkube_role="hub")
        self.route_table = network.RouteTable(
            f"{name}-routes",
            route_table_name=f"rt-{args.cluster}-hub-shared",
            resource_group_name=args.resource_group_name,
            location=args.location,
            disable_bgp_route_propagation=False,
            tags=tags,
            opts=child(self, ignore_changes=["routes"]),
        )
        built = vnet.build(
            self,
            name,
            vnet_name=f"vnet-{args.cluster}-hub",
            nsg_name=f"nsg-{args.cluster}-hub",
            resource_group_name=args.resource_group_name,
            location=args.location,
            address_space=args.address_space,
            subnets=args.subnets,
            tags=tags,
            route_tables={"shared": self.route_table.id},
        )
        self.vnet, self.nsg, self.subnets = built.vnet, built.nsg, built.subnets
        self.vnet_name = self.vnet.name
        self.route_table_name = self.route_table.name
        self.register_outputs(
            {
                "vnet_id": self.vnet.id,
                "route_table_id": self.route_table.id,
                "subnet_ids": {k: s.id for k, s in self.subnets.items()},
            }
        )
