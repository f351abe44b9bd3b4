"""Network: hub-and-spoke only, no public exposure, the NAT path, alias IPs and Azure's IP limits."""

from __future__ import annotations

import ipaddress
import itertools
from collections.abc import Iterator, Mapping
from typing import Any

from superkube.cluster.kube import NAT_HOST
from superkube.model.ipam import AZURE_RESERVED_PER_SUBNET
from superkube.model.policy import (
    Finding,
    PlanResource,
    Rule,
    RuleConfig,
    StackView,
    networks,
    subnet_of,
    vnet_of,
)

NIC = "azure-native:network:NetworkInterface"
VMSS = "azure-native:compute:VirtualMachineScaleSet"
VM = "azure-native:compute:VirtualMachine"
SUBNET = "azure-native:network:Subnet"
VNET = "azure-native:network:VirtualNetwork"
PEERING = "azure-native:network:VirtualNetworkPeering"
NSG = "azure-native:network:NetworkSecurityGroup"
SECURITY_RULE = "azure-native:network:SecurityRule"
ROUTE = "azure-native:network:Route"
ROUTE_TABLE = "azure-native:network:RouteTable"
LB = "azure-native:network:LoadBalancer"
INTERNET = {"internet", "*", "0.0.0.0/0", "any"}


def _vmss_nic(vmss: PlanResource) -> list[dict]:
    profile = vmss.props.get("virtualMachineProfile") or {}
    return (profile.get("networkProfile") or {}).get("networkInterfaceConfigurations") or []


def _peering_hub_only(view: StackView, config: RuleConfig) -> Iterator[Finding]:
    roles = view.vnet_roles()
    # peerings as their own resources, and peerings written inline in a VirtualNetwork
    peerings: list[tuple[PlanResource, str, Mapping[str, Any]]] = [
        (p, p.props.get("virtualNetworkName", ""), p.props) for p in view.of_type(PEERING)
    ]
    for v in view.of_type(VNET):
        for inline in v.props.get("virtualNetworkPeerings") or []:
            peerings.append((v, v.props.get("virtualNetworkName", v.name), inline))
    for resource, local, p in peerings:
        remote = vnet_of((p.get("remoteVirtualNetwork") or {}).get("id", ""))
        pair = {roles.get(local, "unknown"), roles.get(remote, "unknown")}
        if pair != {"hub", "spoke"}:
            yield Finding(
                f"peering {local} -> {remote} is not hub<->spoke (roles {sorted(pair)})", resource.urn
            )


def _nic_no_public_ip(view: StackView, config: RuleConfig) -> Iterator[Finding]:
    for r in view.of_type("azure-native:network:PublicIPAddress"):
        yield Finding("a public IP address resource exists", r.urn)
    for nic in view.of_type(NIC):
        for ipc in nic.props.get("ipConfigurations") or []:
            if ipc.get("publicIPAddress"):
                yield Finding(f"NIC IP configuration {ipc.get('name')} has a public IP", nic.urn)
    for vmss in view.of_type(VMSS):
        for nic in _vmss_nic(vmss):
            for ipc in nic.get("ipConfigurations") or []:
                if ipc.get("publicIPAddressConfiguration"):
                    yield Finding(
                        f"scale-set IP configuration {ipc.get('name')} gives every node a public IP", vmss.urn
                    )
    for vm in view.of_type(VM):  # a VM may declare its NICs inline instead of referencing them
        for nic in (vm.props.get("networkProfile") or {}).get("networkInterfaceConfigurations") or []:
            for ipc in nic.get("ipConfigurations") or []:
                if ipc.get("publicIPAddressConfiguration"):
                    yield Finding(f"VM IP configuration {ipc.get('name')} has a public IP", vm.urn)
    for lb in view.of_type(LB):
        for fe in lb.props.get("frontendIPConfigurations") or []:
            if fe.get("publicIPAddress") or fe.get("publicIPPrefix"):
                yield Finding(f"load balancer frontend {fe.get('name')} is public", lb.urn)
    for r in view.of_type("azure-native:network:PublicIPPrefix"):
        yield Finding("a public IP prefix resource exists", r.urn)


def _sources(rule: Mapping[str, Any]) -> list[str]:
    """Every source a security rule admits: Azure takes a single prefix, a list, or both."""
    single = rule.get("sourceAddressPrefix")
    return [str(p) for p in ([single] if single else []) + list(rule.get("sourceAddressPrefixes") or [])]


def _is_internet(prefix: str) -> bool:
    """The Internet service tag, any-address forms, or a public address range."""
    if prefix.strip().lower() in INTERNET:
        return True
    try:
        net = ipaddress.ip_network(prefix.strip(), strict=False)
    except ValueError:
        return False  # another service tag (VirtualNetwork, AzureLoadBalancer, ...)
    return not net.is_private


def _security_rules(view: StackView) -> dict[str, tuple[PlanResource, list[Mapping[str, Any]]]]:
    """Each NSG's rules, whether written inline or as separate SecurityRule resources."""
    nsgs = {
        n.props.get("networkSecurityGroupName", n.name): (n, list(n.props.get("securityRules") or []))
        for n in view.of_type(NSG)
    }
    for r in view.of_type(SECURITY_RULE):
        owner = r.props.get("networkSecurityGroupName", "")
        if owner in nsgs:
            nsgs[owner][1].append({**r.props, "name": r.props.get("securityRuleName", r.name)})
    return nsgs


def _nsg_deny_internet(view: StackView, config: RuleConfig) -> Iterator[Finding]:
    for subnet in view.of_type(SUBNET):
        nsg_id = (subnet.props.get("networkSecurityGroup") or {}).get("id", "")
        if not nsg_id:
            yield Finding(f"subnet {subnet.props.get('subnetName')} has no NSG", subnet.urn)
    for name, (nsg, rules) in _security_rules(view).items():
        inbound = [r for r in rules if str(r.get("direction", "")).lower() == "inbound"]
        for rule in inbound:
            internet = [p for p in _sources(rule) if _is_internet(p)]
            if internet and str(rule.get("access", "")).lower() == "allow":
                yield Finding(
                    f"NSG {name} rule {rule.get('name')} allows inbound from {', '.join(internet)}", nsg.urn
                )
        if not any(
            str(r.get("access", "")).lower() == "deny" and any(p.lower() == "internet" for p in _sources(r))
            for r in inbound
        ):
            yield Finding(f"NSG {name} has no explicit rule denying inbound from the Internet", nsg.urn)


def _nat_nics(view: StackView) -> list[PlanResource]:
    return view.with_role(NIC, NAT_HOST)


def _routes(view: StackView) -> list[tuple[PlanResource, Mapping[str, Any]]]:
    """Every route with the resource that declares it: Route resources, and routes written inline in
    a RouteTable (each then carries its table's name)."""
    out: list[tuple[PlanResource, Mapping[str, Any]]] = [(r, r.props) for r in view.of_type(ROUTE)]
    for table in view.of_type(ROUTE_TABLE):
        name = table.props.get("routeTableName", table.name)
        for route in table.props.get("routes") or []:
            out.append((table, {**route, "routeTableName": name}))
    return out


def _overlaps(prefix: Any, cidr: str) -> bool:
    try:
        return ipaddress.ip_network(str(prefix), strict=False).overlaps(ipaddress.ip_network(cidr))
    except ValueError:
        return False  # a service tag: never a private service range


def _route_via_nat(view: StackView, config: RuleConfig) -> Iterator[Finding]:
    nat_ips = {
        ipc.get("privateIPAddress")
        for nic in _nat_nics(view)
        for ipc in nic.props.get("ipConfigurations") or []
    }
    service = ipaddress.IPv4Network(config.service_cidr or "0.0.0.0/32")
    # every route that takes any part of the service range, more specific ones included (they win)
    routes = [(r, p) for r, p in _routes(view) if _overlaps(p.get("addressPrefix"), str(service))]
    if not any(
        ipaddress.IPv4Network(str(p.get("addressPrefix")), strict=False).supernet_of(service)
        for _, p in routes
    ):
        yield Finding(f"no route sends the whole service CIDR {config.service_cidr} anywhere")
    hub_tables = {
        subnet_of((s.props.get("routeTable") or {}).get("id", ""))
        for s in view.of_type(SUBNET)
        if view.vnet_roles().get(s.props.get("virtualNetworkName", "")) == "hub" and s.props.get("routeTable")
    }
    for r, route in routes:
        hop = str(route.get("nextHopType", ""))
        if hop.lower() != "virtualappliance" or route.get("nextHopIpAddress") not in nat_ips:
            yield Finding(
                f"route {route.get('addressPrefix')} goes to {hop} {route.get('nextHopIpAddress')}, not the NAT host",
                r.urn,
            )
        if route.get("routeTableName") not in hub_tables:
            yield Finding(f"route table {route.get('routeTableName')} is on no hub subnet", r.urn)


def _nat_ip_forwarding(view: StackView, config: RuleConfig) -> Iterator[Finding]:
    nics = _nat_nics(view)
    if len(nics) != 1:
        yield Finding(f"{len(nics)} NAT host NICs; the hub needs exactly one per cluster")
    roles = view.vnet_roles()
    for nic in nics:
        if nic.props.get("enableIPForwarding") is not True:
            yield Finding("the NAT host's NIC does not forward IP traffic", nic.urn)
        for ipc in nic.props.get("ipConfigurations") or []:
            vnet = vnet_of((ipc.get("subnet") or {}).get("id", ""))
            if roles.get(vnet) != "hub":
                yield Finding(f"the NAT host is in {vnet or 'no VNet'}, not the hub", nic.urn)


def _alias_ip_count(view: StackView, config: RuleConfig) -> Iterator[Finding]:
    for vmss in view.of_type(VMSS):
        pod_ips = vmss.tags.get("superkube-pod-ips")
        nics = _vmss_nic(vmss)
        if pod_ips is None or not pod_ips.isdigit():
            yield Finding("scale set lacks its superkube-pod-ips tag", vmss.urn)
            continue
        if len(nics) != 1:
            yield Finding(f"{len(nics)} NIC configurations; alias-IP pods need exactly one", vmss.urn)
            continue
        ipcs = nics[0].get("ipConfigurations") or []
        if len(ipcs) != int(pod_ips) + 1:
            yield Finding(
                f"{len(ipcs)} IP configurations per NIC, expected {pod_ips} pod IPs + 1 = {int(pod_ips) + 1}",
                vmss.urn,
            )
        if sum(1 for c in ipcs if c.get("primary")) != 1:
            yield Finding("a NIC needs exactly one primary IP configuration", vmss.urn)
        if len({(c.get("subnet") or {}).get("id") for c in ipcs}) > 1:
            yield Finding("pod IPs must come from the node's own subnet", vmss.urn)


def ips_by_vnet(view: StackView) -> dict[str, int]:
    """Private IPs the stack's NICs take at full capacity, per VNet; subnets it leaves empty count whole."""
    used: dict[str, int] = {}
    filled: set[str] = set()

    def add(subnet_id: str, n: int) -> None:
        used[vnet_of(subnet_id)] = used.get(vnet_of(subnet_id), 0) + n
        filled.add(subnet_id.rsplit("/", 1)[-1] + "@" + vnet_of(subnet_id))

    for vmss in view.of_type(VMSS):
        for nic in _vmss_nic(vmss):
            ipcs = nic.get("ipConfigurations") or []
            if ipcs:
                add((ipcs[0].get("subnet") or {}).get("id", ""), vmss.capacity * len(ipcs))
    for nic in view.of_type(NIC):
        for ipc in nic.props.get("ipConfigurations") or []:
            add((ipc.get("subnet") or {}).get("id", ""), 1)
    for lb in view.of_type(LB):
        for fe in lb.props.get("frontendIPConfigurations") or []:
            if fe.get("subnet"):
                add(fe["subnet"].get("id", ""), 1)
    for s in view.of_type(SUBNET):
        vnet = s.props.get("virtualNetworkName", "")
        if f"{s.props.get('subnetName')}@{vnet}" not in filled and s.props.get("addressPrefix"):
            used[vnet] = (
                used.get(vnet, 0)
                + ipaddress.IPv4Network(s.props["addressPrefix"]).num_addresses
                - AZURE_RESERVED_PER_SUBNET
            )
    return used


def _vnet_ip_limit(view: StackView, config: RuleConfig) -> Iterator[Finding]:
    limit = config.limits["vnet_private_ips"]
    vnets = {v.props.get("virtualNetworkName"): v for v in view.of_type(VNET)}
    for vnet, n in ips_by_vnet(view).items():
        if n > limit:
            yield Finding(
                f"VNet {vnet} would hold {n:,} private IPs > {limit:,}",
                vnets[vnet].urn if vnet in vnets else None,
            )


def _peered_group_ip_limit(view: StackView, config: RuleConfig) -> Iterator[Finding]:
    limit = config.limits["peered_group_private_ips"]
    used = ips_by_vnet(view)
    roles = view.vnet_roles()
    hub = sum(n for v, n in used.items() if roles.get(v) == "hub")
    spokes = sum(n for v, n in used.items() if roles.get(v) == "spoke")
    total = hub + spokes + config.other_spokes_ips
    if total > limit:
        yield Finding(
            f"the hub's peered group would hold {hub:,} + {spokes:,} + {config.other_spokes_ips:,} (other spokes) = {total:,} private IPs > {limit:,}"
        )


def _nic_ip_limit(view: StackView, config: RuleConfig) -> Iterator[Finding]:
    limit = config.limits["nic_private_ips"]
    for vmss in view.of_type(VMSS):
        for nic in _vmss_nic(vmss):
            n = len(nic.get("ipConfigurations") or [])
            if n > limit:
                yield Finding(f"{n} IP configurations per NIC > {limit}", vmss.urn)
    for nic in view.of_type(NIC):
        n = len(nic.props.get("ipConfigurations") or [])
        if n > limit:
            yield Finding(f"{n} IP configurations > {limit}", nic.urn)


def _subnet_no_overlap(view: StackView, config: RuleConfig) -> Iterator[Finding]:
    vnets = {
        v.props.get("virtualNetworkName"): networks(
            (v.props.get("addressSpace") or {}).get("addressPrefixes") or []
        )
        for v in view.of_type(VNET)
    }
    subnets = [
        (s, ipaddress.IPv4Network(s.props["addressPrefix"]))
        for s in view.of_type(SUBNET)
        if s.props.get("addressPrefix")
    ]
    for s, cidr in subnets:
        spaces = vnets.get(s.props.get("virtualNetworkName"), [])
        if not any(cidr.subnet_of(space) for space in spaces):
            yield Finding(f"subnet {cidr} lies outside its VNet's address space", s.urn)
    for (a, ca), (b, cb) in itertools.combinations(subnets, 2):
        if ca.overlaps(cb):
            yield Finding(
                f"subnet {ca} ({a.props.get('subnetName')}) overlaps {cb} ({b.props.get('subnetName')})",
                b.urn,
            )
    spaces = [(name, net) for name, nets in vnets.items() for net in nets]
    if config.service_cidr:
        spaces.append(("service CIDR", ipaddress.IPv4Network(config.service_cidr)))
    for (na, a), (nb, b) in itertools.combinations(spaces, 2):
        if a.overlaps(b):
            yield Finding(f"{na} {a} overlaps {nb} {b}")


RULES = [
    Rule(
        "network-peering-hub-only",
        "critical",
        "Every peering joins the hub and a spoke; no cluster has a path to another cluster.",
        "Peer spokes only with the hub; remove the spoke-to-spoke peering.",
        _peering_hub_only,
    ),
    Rule(
        "network-nic-no-public-ip",
        "critical",
        "No node, control-plane or load-balancer IP configuration is public.",
        "Remove the public IP; reach nodes through the hub (bastion or VPN) instead.",
        _nic_no_public_ip,
    ),
    Rule(
        "network-nsg-deny-internet-inbound",
        "high",
        "Every subnet has an NSG that denies inbound traffic from the Internet and allows none.",
        "Attach the component's NSG to the subnet and drop any rule allowing Internet inbound.",
        _nsg_deny_internet,
    ),
    Rule(
        "network-route-service-cidr-via-nat",
        "high",
        "The hub's route table sends the service CIDR to the NAT host.",
        "Keep the NatHost component's route: service CIDR -> VirtualAppliance at the NAT host's IP, on the hub's shared subnet.",
        _route_via_nat,
    ),
    Rule(
        "network-nic-nat-ip-forwarding",
        "high",
        "Exactly one NAT host NIC, in the hub, with IP forwarding on.",
        "Create the NAT host with NatHost (it enables IP forwarding) in the hub's nat subnet.",
        _nat_ip_forwarding,
    ),
    Rule(
        "network-vmss-alias-ip-count",
        "high",
        "Each node NIC carries one primary IP plus one IP per pod, all in the node's subnet.",
        "Let NodePool build the IP configurations from pod_ips_per_node; do not edit them by hand.",
        _alias_ip_count,
    ),
    Rule(
        "network-vnet-ip-limit",
        "critical",
        "No VNet holds more private IPs than Azure's per-VNet limit.",
        "Lower pod_ips_per_node or node counts, or raise vnet_private_ips in superkube:limit_overrides with a reason.",
        _vnet_ip_limit,
    ),
    Rule(
        "network-peering-group-ip-limit",
        "critical",
        "The hub and its peered spokes hold no more private IPs than Azure's peered-group limit.",
        "Shrink a spoke, move this cluster to another hub, or raise peered_group_private_ips with a reason.",
        _peered_group_ip_limit,
    ),
    Rule(
        "network-nic-ip-limit",
        "high",
        "No NIC has more IP configurations than Azure allows per NIC.",
        "Lower pod_ips_per_node to 255 or below.",
        _nic_ip_limit,
    ),
    Rule(
        "network-subnet-no-overlap",
        "critical",
        "Subnets lie inside their VNet and overlap nothing; VNets and the service CIDR are disjoint.",
        "Re-plan addresses from the spec (superkube plan) instead of editing prefixes by hand.",
        _subnet_no_overlap,
    ),
]
