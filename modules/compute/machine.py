"""One dedicated VM with its NIC: the NAT host, an API server or an etcd member."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pulumi
from pulumi_azure_native import compute, network

from modules.common import child, image_reference, linux_ssh_only, require

DEFAULT_IMAGE = "Canonical:ubuntu-24_04-lts:server:latest"


@dataclass(frozen=True, kw_only=True)
class MachineArgs:
    vm_name: str
    """Azure VM name (also the hostname)."""
    location: str
    """Azure region."""
    resource_group_name: pulumi.Input[str]
    """Resource group of the VM and its NIC."""
    subnet_id: pulumi.Input[str]
    """Subnet of the NIC."""
    private_ip: str
    """Static private IP from the address plan."""
    vm_size: str
    """Azure VM size."""
    admin_username: str
    """Admin user; login by SSH key only."""
    ssh_public_key: str
    """OpenSSH public key of the admin user."""
    tags: Mapping[str, pulumi.Input[str]]
    """Tags on the VM and NIC (must include the superkube-role tag)."""
    image: str = DEFAULT_IMAGE
    """Marketplace image publisher:offer:sku:version (default: Ubuntu 24.04 LTS)."""
    zone: str | None = None
    """Availability zone (default: none, regional)."""
    ip_forwarding: bool = False
    """Let the NIC forward traffic not addressed to it (default: off; on for the NAT host)."""
    backend_pool_ids: Sequence[pulumi.Input[str]] = ()
    """Load-balancer backend pools the NIC joins (default: none)."""
    data_disk_gb: int = 0
    """Size of one empty data disk at LUN 0 in GiB (default: 0, no data disk)."""
    data_disk_sku: str = "Premium_LRS"
    """Managed disk SKU of the data disk (default: Premium_LRS)."""
    os_disk_gb: int = 128
    """OS disk size in GiB (default: 128)."""
    depends_on: Sequence[pulumi.Resource] = field(default_factory=tuple)
    """Extra dependencies of the NIC (default: none)."""
    identity_ids: Sequence[pulumi.Input[str]] = ()
    """Resource IDs of the user-assigned identities the VM carries (default: none)."""

    def __post_init__(self) -> None:
        require(len(self.vm_name) <= 64, "vm_name", f"{self.vm_name!r} is longer than Azure's 64 characters")
        require("superkube-role" in self.tags, "tags", "a machine must carry the superkube-role tag")
        require(self.data_disk_gb >= 0, "data_disk_gb", "must not be negative")


class Machine(pulumi.ComponentResource):
    """A NIC with a static private IP and no public IP, and a Linux VM that only takes SSH keys."""

    def __init__(self, name: str, args: MachineArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("superkube:compute:Machine", name, None, opts)
        # written as the TypedDict form: the subnet is a bare reference, without SubnetArgs' defaults
        ip_configuration: network.NetworkInterfaceIPConfigurationArgsDict = {
            "name": "primary",
            "primary": True,
            "subnet": {"id": args.subnet_id},
            "private_ip_allocation_method": "Static",
            "private_ip_address": args.private_ip,
        }
        if args.backend_pool_ids:
            ip_configuration["load_balancer_backend_address_pools"] = [
                {"id": i} for i in args.backend_pool_ids
            ]
        self.nic = network.NetworkInterface(
            f"{name}-nic",
            network_interface_name=f"nic-{args.vm_name}",
            resource_group_name=args.resource_group_name,
            location=args.location,
            enable_ip_forwarding=args.ip_forwarding,
            enable_accelerated_networking=True,
            ip_configurations=[ip_configuration],
            tags=args.tags,
            opts=child(self, depends_on=list(args.depends_on)),
        )
        storage = compute.StorageProfileArgs(
            image_reference=image_reference(args.image),
            os_disk=compute.OSDiskArgs(
                create_option="FromImage",
                caching=compute.CachingTypes.READ_WRITE,
                disk_size_gb=args.os_disk_gb,
                managed_disk=compute.ManagedDiskParametersArgs(storage_account_type="Premium_LRS"),
                delete_option="Delete",
            ),
            data_disks=[
                compute.DataDiskArgs(
                    lun=0,
                    create_option="Empty",
                    disk_size_gb=args.data_disk_gb,
                    caching=compute.CachingTypes.NONE,
                    managed_disk=compute.ManagedDiskParametersArgs(storage_account_type=args.data_disk_sku),
                    delete_option="Detach",
                )
            ]
            if args.data_disk_gb
            else None,
        )
        self.vm = compute.VirtualMachine(
            f"{name}-vm",
            vm_name=args.vm_name,
            resource_group_name=args.resource_group_name,
            location=args.location,
            zones=[args.zone] if args.zone else None,
            hardware_profile=compute.HardwareProfileArgs(vm_size=args.vm_size),
            network_profile=compute.NetworkProfileArgs(
                network_interfaces=[compute.NetworkInterfaceReferenceArgs(id=self.nic.id, primary=True)]
            ),
            os_profile=compute.OSProfileArgs(
                computer_name=args.vm_name,
                admin_username=args.admin_username,
                linux_configuration=linux_ssh_only(args.admin_username, args.ssh_public_key),
            ),
            storage_profile=storage,
            additional_capabilities=compute.AdditionalCapabilitiesArgs(ultra_ssd_enabled=True)
            if args.data_disk_sku == "UltraSSD_LRS"
            else None,
            identity=compute.VirtualMachineIdentityArgs(
                type=compute.ResourceIdentityType.USER_ASSIGNED,
                user_assigned_identities=list(args.identity_ids),
            )
            if args.identity_ids
            else None,
            tags=args.tags,
            opts=child(self),
        )
        self.private_ip = args.private_ip
        self.register_outputs({"vm_id": self.vm.id, "nic_id": self.nic.id, "private_ip": args.private_ip})


PLACEMENT = ("location", "resource_group_name", "subnet_id", "vm_size", "admin_username", "ssh_public_key")
"""MachineArgs fields that every machine of a group takes from its component's args, by the same name."""


def placement(args: object) -> dict[str, Any]:
    """The PLACEMENT fields of a component's args (API servers, etcd, NAT host), for MachineArgs."""
    return {name: getattr(args, name) for name in PLACEMENT}


def members(
    owner: pulumi.ComponentResource,
    name: str,
    *,
    vm_prefix: str,
    member_ips: Sequence[str],
    zones: Sequence[str],
    **common: Any,
) -> list[Machine]:
    """One Machine per address, named `<vm_prefix>-<i>` and spread over `zones` in turn (API servers and
    etcd members alike); `common` holds the MachineArgs every member shares."""
    return [
        Machine(
            f"{name}-{i}",
            MachineArgs(
                vm_name=f"{vm_prefix}-{i}",
                private_ip=ip,
                zone=zones[i % len(zones)] if zones else None,
                **common,
            ),
            opts=child(owner),
        )
        for i, ip in enumerate(member_ips)
    ]
