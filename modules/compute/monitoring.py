"""The hosts beside the cluster that watch it: one per Prometheus shard, and the metrics store's hosts.

They are VMs of their own in the spoke, not pods of the cluster they watch, so the metrics of an
outage stay readable during it. Each has a premium data disk at LUN 0: a shard's recent TSDB, or the
store's vmstorage data. Ansible's `monitoring` and `metrics_store` groups find them by their role tag.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import pulumi

from modules.common import require, tagged
from modules.compute.machine import Machine, members, placement
from superkube.cluster.kube import METRICS_STORE, MONITORING


@dataclass(frozen=True, kw_only=True)
class HostsArgs:
    location: str
    """Azure region."""
    resource_group_name: pulumi.Input[str]
    """Resource group of the cluster."""
    subnet_id: pulumi.Input[str]
    """The hosts' own subnet."""
    vm_size: str
    """Azure VM size of every host."""
    admin_username: str
    """Admin user; login by SSH key only."""
    ssh_public_key: str
    """OpenSSH public key of the admin user."""


@dataclass(frozen=True, kw_only=True)
class MonitoringHostsArgs:
    cluster: str
    """Cluster name, used in VM names."""
    prometheus: HostsArgs
    """Where and how big the Prometheus hosts are."""
    prometheus_ips: Sequence[str]
    """Static IPs of the Prometheus hosts, from the address plan: one per shard, in shard order."""
    prometheus_disk_gb: int
    """Data disk of each Prometheus host in GiB."""
    store: HostsArgs
    """Where and how big the metrics store's hosts are."""
    store_ips: Sequence[str]
    """Static IPs of the store's hosts, from the address plan."""
    store_disk_gb: int
    """Data disk of each store host in GiB."""
    zones: Sequence[str] = ()
    """Zones the hosts are spread over in turn (default: none, regional)."""
    tags: dict[str, str] = field(default_factory=dict)
    """Tags on every resource (default: none)."""

    def __post_init__(self) -> None:
        require(bool(self.prometheus_ips), "prometheus_ips", "needs a host per shard, at least one")
        require(
            len(self.store_ips) >= 2,
            "store_ips",
            f"the store keeps each sample on 2 hosts, got {len(self.store_ips)}",
        )
        ips = [*self.prometheus_ips, *self.store_ips]
        require(len(set(ips)) == len(ips), "prometheus_ips", "every host needs its own IP")


class MonitoringHosts(pulumi.ComponentResource):
    """Prometheus hosts `prom-<cluster>-<shard>` and store hosts `metrics-<cluster>-<i>`."""

    def __init__(
        self, name: str, args: MonitoringHostsArgs, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        super().__init__("superkube:compute:MonitoringHosts", name, None, opts)
        built: dict[str, list[Machine]] = {}
        for part, vm_prefix, hosts, ips, disk_gb, group in (
            ("prometheus", "prom", args.prometheus, args.prometheus_ips, args.prometheus_disk_gb, MONITORING),
            ("store", "metrics", args.store, args.store_ips, args.store_disk_gb, METRICS_STORE),
        ):
            built[part] = members(
                self,
                f"{name}-{part}",
                vm_prefix=f"{vm_prefix}-{args.cluster}",
                member_ips=ips,
                zones=args.zones,
                **placement(hosts),
                data_disk_gb=disk_gb,
                tags=tagged(args.tags, superkube_role=group),
            )
        self.prometheus, self.store = built["prometheus"], built["store"]
        self.register_outputs(
            {"prometheus_ips": list(args.prometheus_ips), "metrics_store_ips": list(args.store_ips)}
        )
