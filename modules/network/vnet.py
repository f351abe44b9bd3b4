"""What the hub and every spoke build alike: a VNet, an NSG that refuses the internet, and the
planned subnets behind it. A helper, not a component: the resources stay children of their VNet's
component, under the names they always had."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import pulumi
from pulumi_azure_native import network

from modules.common import child, deny_internet_inbound
from superkube.model.ipam import SubnetPlan


@dataclass(frozen=True)
class Vnet:
    vnet: network.VirtualNetwork
    nsg: network.NetworkSecurityGroup
    subnets: dict[str, network.Subnet]


def build(
    owner: pulumi.ComponentResource,
    name: str,
    *,
    vnet_name: str,
    nsg_name: str,
    resource_group_name: pulumi.Input[str],
    location: str,
    address_space: str,
    subnets: Iterable[SubnetPlan],
    tags: Mapping[str, str],
    route_tables: Mapping[str, pulumi.Input[str]] | None = None,
) -> Vnet:
    """The VNet, its NSG and its subnets; `route_tables` maps a subnet name to its route table's ID."""
    vnet = network.VirtualNetwork(
        f"{name}-vnet",
        virtual_network_name=vnet_name,
        resource_group_name=resource_group_name,
        location=location,
        address_space=network.AddressSpaceArgs(address_prefixes=[address_space]),
        tags=dict(tags),
        opts=child(owner, ignore_changes=["subnets", "virtualNetworkPeerings"]),
    )
    nsg = network.NetworkSecurityGroup(
        f"{name}-nsg",
        network_security_group_name=nsg_name,
        resource_group_name=resource_group_name,
        location=location,
        security_rules=[deny_internet_inbound()],
        tags=dict(tags),
        opts=child(owner),
    )
    tables = route_tables or {}
    placed: dict[str, network.Subnet] = {}
    for plan in subnets:
        table = tables.get(plan.name)
        placed[plan.name] = network.Subnet(
            f"{name}-{plan.name}",
            subnet_name=plan.name,
            resource_group_name=resource_group_name,
            virtual_network_name=vnet.name,
            address_prefix=str(plan.cidr),
            network_security_group={"id": nsg.id},
            route_table={"id": table} if table is not None else None,
            opts=child(owner),
        )
    return Vnet(vnet, nsg, placed)
