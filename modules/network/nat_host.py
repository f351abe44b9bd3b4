"""The NAT host: a hub VM that forwards traffic from outside the cluster into its service CIDR."""

from __future__ import annotations

from dataclasses import dataclass, field

import pulumi
from pulumi_azure_native import network

from modules.common import child, require, tagged
from modules.compute.machine import Machine, MachineArgs, placement
from superkube.cluster.kube import NAT_HOST


@dataclass(frozen=True, kw_only=True)
class NatHostArgs:
    cluster: str
    """Cluster name, used in Azure resource names."""
    location: str
    """Azure region."""
    resource_group_name: pulumi.Input[str]
    """Resource group of the hub (the NAT host lives in the hub)."""
    subnet_id: pulumi.Input[str]
    """The hub's nat subnet."""
    private_ip: str
    """Static IP of the NAT host: the next hop of the service-CIDR route."""
    route_table_name: pulumi.Input[str]
    """The hub route table that gets the service-CIDR route."""
    service_cidr: str
    """The cluster's Kubernetes service CIDR."""
    vm_size: str
    """Azure VM size of the NAT host."""
    admin_username: str
    """Admin user; login by SSH key only."""
    ssh_public_key: str
    """OpenSSH public key of the admin user."""
    tags: dict[str, str] = field(default_factory=dict)
    """Tags on every resource (default: none)."""

    def __post_init__(self) -> None:
        require("/" in self.service_cidr, "service_cidr", f"{self.service_cidr!r} is not a CIDR")


class NatHost(pulumi.ComponentResource):
    """A VM with IP forwarding on its NIC, and the hub route that sends the service CIDR to it.

    The host itself (forwarding sysctl and NAT rules) is configured by the nat_host Ansible role.
    """

    def __init__(self, name: str, args: NatHostArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("superkube:network:NatHost", name, None, opts)
        self.machine = Machine(
            f"{name}-host",
            MachineArgs(
                vm_name=f"nat-{args.cluster}",
                private_ip=args.private_ip,
                **placement(args),
                ip_forwarding=True,
                tags=tagged(args.tags, superkube_role=NAT_HOST),
            ),
            opts=child(self),
        )
        self.route = network.Route(
            f"{name}-service-route",
            route_name=f"{args.cluster}-services",
            resource_group_name=args.resource_group_name,
            route_table_name=args.route_table_name,
            address_prefix=args.service_cidr,
            next_hop_type="VirtualAppliance",
            next_hop_ip_address=args.private_ip,
            opts=child(self, depends_on=[self.machine]),
        )
        self.register_outputs({"private_ip": args.private_ip, "route_id": self.route.id})
