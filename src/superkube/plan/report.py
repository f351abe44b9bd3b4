"""Views of a plan for people and machines: topology, address table, limits, capacity."""

from __future__ import annotations

from typing import Any, Protocol

from superkube.cluster.cloudinit import EGRESS_TAG
from superkube.model.ipam import AddressPlan
from superkube.model.spec import ClusterSpec


class PlannedStack(Protocol):
    """What these views read of a plan (`superkube.plan.engine.Plan`, which imports this module)."""

    spec: ClusterSpec
    addresses: AddressPlan

    def of_type(self, type_: str) -> list[Any]: ...


def address_rows(plan: AddressPlan) -> list[dict[str, Any]]:
    """One row per subnet: where it is, how big, how many IPs its NICs take at full capacity."""
    return [
        {
            "vnet": s.vnet,
            "subnet": s.name,
            "cidr": str(s.cidr),
            "purpose": s.purpose,
            "pool": s.pool,
            "addresses": s.cidr.num_addresses,
            "usable": s.usable,
            "nics": s.nics,
            "ips_per_nic": s.ips_per_nic,
            "reserved": s.reserved,
            "ips_used": s.ips_used,
        }
        for s in plan.subnets
    ]


def limit_rows(plan: AddressPlan) -> list[dict[str, Any]]:
    """Each Azure limit with what this cluster uses of it, in the scope where it is tightest."""
    per_nic = max(s.ips_per_nic for s in plan.subnets)
    largest_set = max(s.capacity for s in plan.scale_sets)
    spoke_subnets = sum(1 for s in plan.subnets if s.vnet == "spoke")
    used = {
        "vnet_private_ips": (max(plan.spoke.ips_used, plan.hub.ips_used), "largest VNet"),
        "peered_group_private_ips": (max(g.ips_used for g in plan.groups), "largest peered group"),
        "nic_private_ips": (per_nic, "busiest NIC"),
        "vnet_peerings": (plan.hub_peerings, "hub"),
        "vnet_subnets": (spoke_subnets, "spoke"),
        "vmss_vms": (largest_set, "largest scale set"),
    }
    rows = []
    for name, limit in plan.limits.items():
        value, scope = used[name]
        rows.append(
            {
                "limit": name,
                "what": limit.what,
                "scope": scope,
                "used": value,
                "max": limit.value,
                "headroom": limit.value - value,
                "default": limit.default,
                "override_reason": limit.reason,
            }
        )
    return rows


def capacity(plan: AddressPlan) -> dict[str, int]:
    return dict(plan.capacity)


def topology(plan: PlannedStack) -> dict[str, Any]:
    """Hub, spoke, pools and scale sets, read back from the recorded resources."""
    a = plan.addresses
    peerings = [
        {
            "name": r.inputs.get("virtualNetworkPeeringName"),
            "from": r.inputs.get("virtualNetworkName"),
            "to": (r.inputs.get("remoteVirtualNetwork") or {}).get("id", "").rsplit("/", 1)[-1],
        }
        for r in plan.of_type("azure-native:network:VirtualNetworkPeering")
    ]
    routes = [
        {
            "prefix": r.inputs.get("addressPrefix"),
            "next_hop": r.inputs.get("nextHopIpAddress"),
            "table": r.inputs.get("routeTableName"),
        }
        for r in plan.of_type("azure-native:network:Route")
    ]
    egress = {  # each pool's default pod egress limit, as its scale sets' tag carries it to the nodes
        r.inputs["tags"]["superkube-pool"]: int(r.inputs["tags"][EGRESS_TAG])
        for r in plan.of_type("azure-native:compute:VirtualMachineScaleSet")
        if EGRESS_TAG in r.inputs.get("tags", {})
    }
    pools = []
    for pool in plan.spec.node_pools:
        sets = a.pool_scale_sets(pool.name)
        pools.append(
            {
                "name": pool.name,
                "role": pool.role,
                "vm_size": pool.vm_size,
                "nodes": pool.nodes,
                "gpus": pool.nodes * pool.gpus_per_node,
                "pod_egress_limit_bits": egress.get(pool.name),
                "scale_sets": [
                    {
                        "name": s.name,
                        "capacity": s.capacity,
                        "zones": list(s.zones),
                        "subnet": str(a.subnet(s.subnet).cidr),
                    }
                    for s in sets
                ],
            }
        )
    return {
        "hub": {
            "address_space": str(a.hub.address_space),
            "nat_host": str(a.nat_host_ip),
            "routes": routes,
        },
        "spoke": {
            "address_space": str(a.spoke.address_space),
            "apiservers": {
                "load_balancer": str(a.apiserver_lb_ip),
                "members": [str(i) for i in a.apiserver_ips],
            },
            "etcd_main": [str(i) for i in a.etcd_main_ips],
            "etcd_events": [str(i) for i in a.etcd_events_ips],
            "prometheus": [str(i) for i in a.prometheus_ips],
            "metrics_store": [str(i) for i in a.metrics_store_ips],
            "pools": pools,
        },
        "service_cidr": str(a.service_cidr),
        "peerings": peerings,
        "peered_spokes": {n: p.address_space for n, p in plan.spec.peered_spokes.items()},
    }
