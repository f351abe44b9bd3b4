"""One etcd cluster on dedicated VMs: the main store, or the separate store for Kubernetes Events."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

import pulumi

from modules.common import require, tagged
from modules.compute.machine import Machine, members, placement
from superkube.cluster.kube import ETCD_CLIENT_PORT as CLIENT_PORT
from superkube.cluster.kube import etcd_group


@dataclass(frozen=True, kw_only=True)
class EtcdClusterArgs:
    cluster: str
    """Cluster name, used in VM names."""
    role: Literal["main", "events"]
    """Which store: `main` (everything) or `events` (Kubernetes Events only)."""
    location: str
    """Azure region."""
    resource_group_name: pulumi.Input[str]
    """Resource group of the cluster."""
    subnet_id: pulumi.Input[str]
    """This store's own subnet."""
    member_ips: Sequence[str]
    """Static IPs of the members, from the address plan; their count is the member count."""
    vm_size: str
    """Azure VM size of every member."""
    disk_sku: str
    """Managed disk SKU of the data disk (premium or ultra)."""
    disk_gb: int
    """Size of the data disk in GiB."""
    admin_username: str
    """Admin user; login by SSH key only."""
    ssh_public_key: str
    """OpenSSH public key of the admin user."""
    zones: Sequence[str] = ()
    """Zones the members are spread over in turn (default: none, regional)."""
    tags: dict[str, str] = field(default_factory=dict)
    """Tags on every resource (default: none)."""

    def __post_init__(self) -> None:
        n = len(self.member_ips)
        require(n >= 3 and n % 2 == 1, "member_ips", f"etcd needs an odd member count >= 3, got {n}")
        require(len(set(self.member_ips)) == n, "member_ips", "member IPs must be distinct")
        require(
            self.disk_sku.startswith(("Premium", "Ultra")),
            "disk_sku",
            f"{self.disk_sku} is not premium or ultra",
        )


class EtcdCluster(pulumi.ComponentResource):
    """Dedicated members, each with a premium data disk at LUN 0 for the etcd data dir."""

    def __init__(self, name: str, args: EtcdClusterArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("superkube:control_plane:EtcdCluster", name, None, opts)
        self.members: list[Machine] = members(
            self,
            name,
            vm_prefix=f"etcd-{args.role}-{args.cluster}",
            member_ips=args.member_ips,
            zones=args.zones,
            **placement(args),
            data_disk_gb=args.disk_gb,
            data_disk_sku=args.disk_sku,
            tags=tagged(args.tags, superkube_role=etcd_group(args.role)),
        )
        self.client_urls = [f"https://{ip}:{CLIENT_PORT}" for ip in args.member_ips]
        self.register_outputs({"client_urls": self.client_urls})
