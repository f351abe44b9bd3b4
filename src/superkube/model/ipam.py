"""The address plan: every subnet, scale set and static IP of a cluster, checked against Azure's limits.

Pods get VNet IPs (alias-IP networking), so a node's NIC carries 1 + pod_ips_per_node private IPs and
every one of them counts against the VNet and peered-group limits. The plan is pure arithmetic on the
spec; the Pulumi program only reads it, so `superkube plan` and `pulumi up` place everything alike.
"""

from __future__ import annotations

import ipaddress
import math
from dataclasses import dataclass, field
from ipaddress import IPv4Address, IPv4Network

from superkube.model.spec import NAMESPACE, ClusterSpec, NodePool, SpecError

# Azure's documented networking defaults ("networking limits"); a stack may raise one only with a
# reason, in superkube:limit_overrides.
AZURE_LIMITS: dict[str, tuple[int, str]] = {
    "vnet_private_ips": (65_536, "private IPs per VNet"),
    "peered_group_private_ips": (128_000, "private IPs per peered group"),
    "nic_private_ips": (256, "private IPs per NIC"),
    "vnet_peerings": (500, "peerings per VNet"),
    "vnet_subnets": (3_000, "subnets per VNet"),
    "vmss_vms": (1_000, "VMs per scale set"),
}

AZURE_RESERVED_PER_SUBNET = 5  # network, gateway, 2 x DNS, broadcast
FIRST_HOST_OFFSET = 4  # the first address Azure hands out in a subnet is .4
MIN_SUBNET_PREFIX = 29


@dataclass(frozen=True)
class Limit:
    name: str
    value: int
    what: str
    default: int
    reason: str | None  # set when a stack overrides Azure's default


@dataclass(frozen=True)
class SubnetPlan:
    vnet: str  # "hub" or "spoke"
    name: str
    cidr: IPv4Network
    purpose: str  # nat, shared, apiservers, etcd-main, etcd-events, pool
    nics: int  # NICs at full capacity
    ips_per_nic: int
    pool: str | None = None
    reserved: int = 0  # addresses held for hosts superkube does not place (the hub's shared subnet)

    @property
    def ips_used(self) -> int:
        return self.nics * self.ips_per_nic + self.reserved

    @property
    def usable(self) -> int:
        return self.cidr.num_addresses - AZURE_RESERVED_PER_SUBNET

    def host(self, index: int) -> IPv4Address:
        """The index-th static address Azure can hand out in this subnet."""
        return self.cidr.network_address + FIRST_HOST_OFFSET + index


@dataclass(frozen=True)
class ScaleSetPlan:
    pool: str
    index: int
    name: str
    capacity: int
    min_nodes: int  # the pool's min_nodes split over its sets like its capacity
    zones: tuple[str, ...]  # a pool that fits one set spans all its zones; split pools take one each in turn
    subnet: str

    @property
    def computer_name_prefix(self) -> str:
        """Its instances' names (their nodes'): this, then the instance ID in base 36, six digits."""
        return f"{self.pool}{self.index}-"


@dataclass(frozen=True)
class VnetPlan:
    name: str
    address_space: IPv4Network
    ips_used: int


@dataclass(frozen=True)
class GroupPlan:
    """A VNet with its peers: the scope of Azure's peered-group IP limit."""

    name: str
    members: tuple[str, ...]
    ips_used: int


@dataclass(frozen=True)
class AddressPlan:
    cluster: str
    hub: VnetPlan
    spoke: VnetPlan
    service_cidr: IPv4Network
    subnets: tuple[SubnetPlan, ...]
    scale_sets: tuple[ScaleSetPlan, ...]
    groups: tuple[GroupPlan, ...]
    limits: dict[str, Limit]
    nat_host_ip: IPv4Address
    apiserver_lb_ip: IPv4Address
    apiserver_ips: tuple[IPv4Address, ...]
    etcd_main_ips: tuple[IPv4Address, ...]
    etcd_events_ips: tuple[IPv4Address, ...]
    prometheus_ips: tuple[IPv4Address, ...]
    metrics_store_ips: tuple[IPv4Address, ...]
    hub_peerings: int
    capacity: dict[str, int] = field(default_factory=dict)

    def subnet(self, name: str) -> SubnetPlan:
        for s in self.subnets:
            if s.name == name:
                return s
        raise KeyError(name)

    def pool_scale_sets(self, pool: str) -> list[ScaleSetPlan]:
        return [s for s in self.scale_sets if s.pool == pool]


def _fmt(n: int) -> str:
    return f"{n:,}"


def prefix_for(addresses: int) -> int:
    """The longest prefix whose subnet holds `addresses` usable IPs after Azure's reserved five."""
    need = addresses + AZURE_RESERVED_PER_SUBNET
    return min(MIN_SUBNET_PREFIX, 32 - math.ceil(math.log2(need)))


def split_pool(total: int, per_set: int) -> list[int]:
    """Split a pool of `total` nodes into the fewest balanced scale sets of at most `per_set` VMs."""
    count = math.ceil(total / per_set)
    base, extra = divmod(total, count)
    return [base + (1 if i < extra else 0) for i in range(count)]


def _limits(spec: ClusterSpec) -> dict[str, Limit]:
    out = {}
    for name, (default, what) in AZURE_LIMITS.items():
        override = spec.limit_overrides.get(name)
        out[name] = Limit(
            name=name,
            value=override.value if override else default,
            what=what,
            default=default,
            reason=override.reason if override else None,
        )
    return out


def _free_block(prefix: int, near: IPv4Network, avoid: list[IPv4Network]) -> IPv4Network | None:
    """The first /prefix in near's private range, from near's own address on, overlapping none of `avoid`."""
    private = next(
        (
            r
            for r in (IPv4Network("10.0.0.0/8"), IPv4Network("172.16.0.0/12"), IPv4Network("192.168.0.0/16"))
            if near.subnet_of(r) and prefix >= r.prefixlen
        ),
        None,
    )
    if private is None:
        return None
    step = 2 ** (32 - prefix)
    start = int(near.network_address) // step * step
    candidates = list(range(start, int(private.broadcast_address) + 1, step))
    candidates += list(range(int(private.network_address), start, step))
    for base in candidates:
        block = IPv4Network((base, prefix))
        if not any(block.overlaps(a) for a in avoid):
            return block
    return None


def _carve(
    vnet: str,
    space: IPv4Network,
    requests: list[tuple[str, int]],
    key: str,
    avoid: list[IPv4Network] | None = None,
) -> dict[str, IPv4Network]:
    """Place subnets largest first; with power-of-two sizes every placement is aligned, no gaps."""
    order = sorted(range(len(requests)), key=lambda i: requests[i][1])
    need = sum(2 ** (32 - prefix) for _, prefix in requests)
    if need > space.num_addresses or any(prefix < space.prefixlen for _, prefix in requests):
        largest = min(prefix for _, prefix in requests)
        wanted = min(max(32 - math.ceil(math.log2(need)), 0), largest)
        # a suggestion must itself plan: name a block of that size that overlaps no other range
        block = _free_block(wanted, space, avoid or [])
        fix = (
            f"use a /{wanted} or larger address space that overlaps no other range, e.g. {block}"
            if block
            else f"use a /{wanted} or larger address space that overlaps no other range"
        )
        raise SpecError(
            f"{NAMESPACE}:{key}",
            f"{space} ({_fmt(space.num_addresses)} addresses) cannot hold the {vnet} subnets: they need "
            f"{_fmt(need)} addresses in {len(requests)} subnets (largest /{largest})",
            fix,
        )
    cursor = int(space.network_address)
    placed: dict[str, IPv4Network] = {}
    for i in order:
        name, prefix = requests[i]
        placed[name] = IPv4Network((cursor, prefix))
        cursor += 2 ** (32 - prefix)
    return placed


def _check_overlaps(spec: ClusterSpec) -> None:
    ranges: list[tuple[str, IPv4Network]] = [
        ("hub_address_space", IPv4Network(spec.hub_address_space)),
        ("spoke_address_space", IPv4Network(spec.spoke_address_space)),
        ("service_cidr", IPv4Network(spec.service_cidr)),
    ]
    ranges += [
        (f"peered_spokes.{n}.address_space", IPv4Network(p.address_space))
        for n, p in spec.peered_spokes.items()
    ]
    for i, (key_a, a) in enumerate(ranges):
        for key_b, b in ranges[:i]:
            if a.overlaps(b):
                raise SpecError(
                    f"{NAMESPACE}:{key_a}",
                    f"{a} overlaps {NAMESPACE}:{key_b} {b}",
                    "give every VNet, peered spoke and the service CIDR its own disjoint range",
                )


def _check_nic(pool: NodePool, index: int, limit: Limit) -> None:
    per_nic = pool.pod_ips_per_node + 1
    if per_nic > limit.value:
        raise SpecError(
            f"{NAMESPACE}:node_pools[{index}].pod_ips_per_node",
            f"{pool.pod_ips_per_node} pod IPs + 1 primary = {per_nic} IPs per NIC > {_fmt(limit.value)} ({limit.what})",
            f"lower pod_ips_per_node to {limit.value - 1} or less",
        )


def _pool_error(spec: ClusterSpec, total: int, limit: Limit, scope: str) -> SpecError:
    """Name the biggest pool and the pod_ips_per_node that would bring `total` under `limit`."""
    index, pool = max(enumerate(spec.node_pools), key=lambda ip: ip[1].nodes * (ip[1].pod_ips_per_node + 1))
    others = total - pool.nodes * (pool.pod_ips_per_node + 1)
    best = (limit.value - others) // pool.nodes - 1
    key = f"{NAMESPACE}:node_pools[{index}].pod_ips_per_node"
    arithmetic = f"{_fmt(pool.nodes)} nodes x {pool.pod_ips_per_node + 1} IPs"
    if others:
        arithmetic += f" + {_fmt(others)} other IPs"
    problem = f"{scope}{arithmetic} = {_fmt(total)} > {_fmt(limit.value)} {limit.what}"
    fix = (
        f"lower pod_ips_per_node of pool {pool.name!r} to {best}"
        if best >= 1
        else f"shrink pool {pool.name!r}"
    )
    return SpecError(
        key, problem, f"{fix} or raise {limit.name} with a reason in {NAMESPACE}:limit_overrides"
    )


def plan_addresses(spec: ClusterSpec, stack: str) -> AddressPlan:
    """Lay out every subnet and static IP of the cluster, or raise SpecError naming the key to change."""
    cluster = spec.name(stack)
    limits = _limits(spec)
    _check_overlaps(spec)

    # Node pools: one subnet per scale set, sized for its capacity x IPs per NIC.
    pool_requests: list[tuple[str, int]] = []
    scale_sets: list[ScaleSetPlan] = []
    pool_subnets: list[tuple[str, str, int, int]] = []
    for index, pool in enumerate(spec.node_pools):
        _check_nic(pool, index, limits["nic_private_ips"])
        sizes = split_pool(pool.nodes, limits["vmss_vms"].value)
        minima = [
            pool.min_nodes // len(sizes) + (1 if i < pool.min_nodes % len(sizes) else 0)
            for i in range(len(sizes))
        ]
        for i, size in enumerate(sizes):
            subnet = f"{pool.name}-{i}"
            scale_sets.append(
                ScaleSetPlan(
                    pool=pool.name,
                    index=i,
                    name=f"vmss-{cluster}-{pool.name}-{i}",
                    capacity=size,
                    min_nodes=minima[i],
                    zones=tuple(pool.zones) if len(sizes) == 1 else (pool.zones[i % len(pool.zones)],),
                    subnet=subnet,
                )
            )
            per_nic = pool.pod_ips_per_node + 1
            pool_requests.append((subnet, prefix_for(size * per_nic)))
            pool_subnets.append((subnet, pool.name, size, per_nic))

    control = [
        ("apiservers", "apiservers", spec.apiserver_count + 1),  # + the internal load balancer's frontend
        ("etcd-main", "etcd-main", spec.etcd_main_count),
        ("etcd-events", "etcd-events", spec.etcd_events_count),
        # beside the cluster, each in a subnet of its own so neither count moves the other's addresses
        ("prometheus", "prometheus", spec.prometheus_shards),
        ("metrics-store", "metrics-store", spec.metrics_store_count),
    ]
    spoke_requests = [(name, prefix_for(n)) for name, _, n in control] + pool_requests
    if len(spoke_requests) > limits["vnet_subnets"].value:
        raise SpecError(
            f"{NAMESPACE}:node_pools",
            f"{len(spoke_requests)} subnets > {_fmt(limits['vnet_subnets'].value)} {limits['vnet_subnets'].what}",
            "use fewer, larger pools or raise vnet_subnets with a reason in superkube:limit_overrides",
        )
    spoke_space = IPv4Network(spec.spoke_address_space)
    hub_space = IPv4Network(spec.hub_address_space)
    others = [IPv4Network(spec.service_cidr)] + [
        IPv4Network(p.address_space) for p in spec.peered_spokes.values()
    ]
    # The VNet's IP limit first: no address space can lift it, so a bigger one must not be suggested.
    vnet_limit = limits["vnet_private_ips"]
    spoke_nics = sum(n for _, _, n in control) + sum(size * per_nic for _, _, size, per_nic in pool_subnets)
    if spoke_nics > vnet_limit.value:
        raise _pool_error(spec, spoke_nics, vnet_limit, f"spoke VNet {spoke_space}: ")
    spoke_cidrs = _carve("spoke", spoke_space, spoke_requests, "spoke_address_space", [hub_space, *others])

    hub_requests = [("nat", MIN_SUBNET_PREFIX), ("shared", spec.hub_shared_subnet_prefix)]
    hub_cidrs = _carve("hub", hub_space, hub_requests, "hub_address_space", [spoke_space, *others])

    subnets: list[SubnetPlan] = [
        SubnetPlan("hub", "nat", hub_cidrs["nat"], "nat", nics=1, ips_per_nic=1),
        SubnetPlan(
            "hub",
            "shared",
            hub_cidrs["shared"],
            "shared",
            nics=0,
            ips_per_nic=1,
            # other teams' hosts may fill it, so every usable address counts against the limits
            reserved=hub_cidrs["shared"].num_addresses - AZURE_RESERVED_PER_SUBNET,
        ),
    ]
    subnets += [
        SubnetPlan("spoke", name, spoke_cidrs[name], purpose, nics=n, ips_per_nic=1)
        for name, purpose, n in control
    ]
    subnets += [
        SubnetPlan("spoke", name, spoke_cidrs[name], "pool", nics=size, ips_per_nic=per_nic, pool=pool)
        for name, pool, size, per_nic in pool_subnets
    ]

    spoke_ips = sum(s.ips_used for s in subnets if s.vnet == "spoke")
    hub_ips = sum(s.ips_used for s in subnets if s.vnet == "hub")
    if spoke_ips > vnet_limit.value:
        raise _pool_error(spec, spoke_ips, vnet_limit, f"spoke VNet {spoke_space}: ")
    if hub_ips > vnet_limit.value:
        raise SpecError(
            f"{NAMESPACE}:hub_shared_subnet_prefix",
            f"hub VNet: {_fmt(hub_ips)} IPs > {_fmt(vnet_limit.value)} {vnet_limit.what}",
            "use a longer prefix for the shared subnet",
        )

    group_limit = limits["peered_group_private_ips"]
    spoke_group = GroupPlan("spoke+hub", ("spoke", "hub"), spoke_ips + hub_ips)
    peers_ips = sum(p.ips for p in spec.peered_spokes.values())
    hub_group = GroupPlan(
        "hub+spokes", ("hub", "spoke", *spec.peered_spokes), hub_ips + spoke_ips + peers_ips
    )
    if spoke_group.ips_used > group_limit.value:
        raise _pool_error(spec, spoke_group.ips_used, group_limit, "spoke and hub: ")
    if hub_group.ips_used > group_limit.value:
        raise SpecError(
            f"{NAMESPACE}:peered_spokes",
            f"the hub's peered group (hub {_fmt(hub_ips)} + this spoke {_fmt(spoke_ips)} + other spokes "
            f"{_fmt(peers_ips)}) = {_fmt(hub_group.ips_used)} IPs > {_fmt(group_limit.value)} per peered group",
            "move this cluster to another hub, shrink a spoke, or raise peered_group_private_ips with a reason",
        )
    hub_peerings = 1 + len(spec.peered_spokes)
    if hub_peerings > limits["vnet_peerings"].value:
        raise SpecError(
            f"{NAMESPACE}:peered_spokes",
            f"the hub would have {hub_peerings} peerings > {limits['vnet_peerings'].value} {limits['vnet_peerings'].what}",
            "start a second hub or raise vnet_peerings with a reason",
        )

    by_name = {s.name: s for s in subnets}
    capacity = {
        "nodes": sum(p.nodes for p in spec.node_pools),
        "gpu_nodes": sum(p.nodes for p in spec.node_pools if p.role == "gpu"),
        "gpus": sum(p.nodes * p.gpus_per_node for p in spec.node_pools),
        "pod_ips": sum(p.nodes * p.pod_ips_per_node for p in spec.node_pools),
        "scale_sets": len(scale_sets),
        "control_plane_vms": spec.apiserver_count + spec.etcd_main_count + spec.etcd_events_count + 1,
        "monitoring_vms": spec.prometheus_shards + spec.metrics_store_count,
    }
    apis = by_name["apiservers"]
    return AddressPlan(
        cluster=cluster,
        hub=VnetPlan("hub", hub_space, hub_ips),
        spoke=VnetPlan("spoke", spoke_space, spoke_ips),
        service_cidr=ipaddress.IPv4Network(spec.service_cidr),
        subnets=tuple(subnets),
        scale_sets=tuple(scale_sets),
        groups=(spoke_group, hub_group),
        limits=limits,
        nat_host_ip=by_name["nat"].host(0),
        apiserver_lb_ip=apis.host(0),
        apiserver_ips=tuple(apis.host(1 + i) for i in range(spec.apiserver_count)),
        etcd_main_ips=tuple(by_name["etcd-main"].host(i) for i in range(spec.etcd_main_count)),
        etcd_events_ips=tuple(by_name["etcd-events"].host(i) for i in range(spec.etcd_events_count)),
        prometheus_ips=tuple(by_name["prometheus"].host(i) for i in range(spec.prometheus_shards)),
        metrics_store_ips=tuple(by_name["metrics-store"].host(i) for i in range(spec.metrics_store_count)),
        hub_peerings=hub_peerings,
        capacity=capacity,
    )
