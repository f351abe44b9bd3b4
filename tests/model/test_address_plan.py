"""Every figure of the address table, recomputed from the recorded Azure resources."""

from __future__ import annotations

import ipaddress
import itertools

import pytest

from superkube.model.ipam import AZURE_LIMITS, prefix_for, split_pool
from superkube.plan import report
from superkube.plan.engine import Plan

SUBNET = "azure-native:network:Subnet"
VMSS = "azure-native:compute:VirtualMachineScaleSet"
NIC = "azure-native:network:NetworkInterface"
LB = "azure-native:network:LoadBalancer"


def recorded_subnets(plan: Plan) -> dict[tuple[str, str], ipaddress.IPv4Network]:
    out = {}
    for s in plan.of_type(SUBNET):
        vnet = "hub" if s.inputs["virtualNetworkName"].endswith("-hub") else "spoke"
        out[(vnet, s.inputs["subnetName"])] = ipaddress.IPv4Network(s.inputs["addressPrefix"])
    return out


def recorded_ips_by_subnet(plan: Plan) -> dict[str, tuple[int, int]]:
    """subnet name -> (NICs at full capacity, IPs per NIC), read off VMSS, NICs and the load balancer."""
    counts: dict[str, list[int]] = {}
    for vmss in plan.of_type(VMSS):
        (nic,) = vmss.inputs["virtualMachineProfile"]["networkProfile"]["networkInterfaceConfigurations"]
        subnet = nic["ipConfigurations"][0]["subnet"]["id"].rsplit("/", 1)[1]
        counts[subnet] = [int(vmss.inputs["tags"]["superkube-capacity"]), len(nic["ipConfigurations"])]
    for nic in plan.of_type(NIC):
        (ipc,) = nic.inputs["ipConfigurations"]
        subnet = ipc["subnet"]["id"].rsplit("/", 1)[1]
        counts.setdefault(subnet, [0, 1])[0] += 1
    for lb in plan.of_type(LB):
        for fe in lb.inputs["frontendIPConfigurations"]:
            counts[fe["subnet"]["id"].rsplit("/", 1)[1]][0] += 1
    return {k: (v[0], v[1]) for k, v in counts.items()}


def test_every_address_table_figure_matches_the_recorded_resources(any_plan: Plan) -> None:
    rows = report.address_rows(any_plan.addresses)
    subnets = recorded_subnets(any_plan)
    ips = recorded_ips_by_subnet(any_plan)
    assert {(r["vnet"], r["subnet"]) for r in rows} == set(subnets)
    for row in rows:
        cidr = subnets[(row["vnet"], row["subnet"])]
        assert row["cidr"] == str(cidr)
        assert row["addresses"] == cidr.num_addresses
        assert row["usable"] == cidr.num_addresses - 5
        if row["subnet"] == "shared":  # no NICs of ours; held whole for hub workloads
            assert row["nics"] == 0 and row["subnet"] not in ips
            assert row["reserved"] == cidr.num_addresses - 5
        else:
            assert (row["nics"], row["ips_per_nic"]) == ips[row["subnet"]], row
            assert row["reserved"] == 0
        assert row["ips_used"] == row["nics"] * row["ips_per_nic"] + row["reserved"]
        assert row["ips_used"] <= row["usable"], f"{row['subnet']} overfull"


def test_subnets_lie_in_their_vnet_and_never_overlap(any_plan: Plan) -> None:
    subnets = recorded_subnets(any_plan)
    spaces = {
        "hub": ipaddress.IPv4Network(any_plan.spec.hub_address_space),
        "spoke": ipaddress.IPv4Network(any_plan.spec.spoke_address_space),
    }
    for (vnet, _), cidr in subnets.items():
        assert cidr.subnet_of(spaces[vnet])
    for a, b in itertools.combinations(subnets.values(), 2):
        assert not a.overlaps(b)
    service = ipaddress.IPv4Network(any_plan.spec.service_cidr)
    assert not any(service.overlaps(s) for s in spaces.values())


def test_every_limit_row_matches_the_recorded_resources(any_plan: Plan) -> None:
    rows = {r["limit"]: r for r in report.limit_rows(any_plan.addresses)}
    table = report.address_rows(any_plan.addresses)
    spoke = sum(r["ips_used"] for r in table if r["vnet"] == "spoke")
    hub = sum(r["ips_used"] for r in table if r["vnet"] == "hub")
    peers = sum(p.ips for p in any_plan.spec.peered_spokes.values())
    vmss_caps = [int(s.inputs["tags"]["superkube-capacity"]) for s in any_plan.of_type(VMSS)]
    nic_ips = [
        len(
            s.inputs["virtualMachineProfile"]["networkProfile"]["networkInterfaceConfigurations"][0][
                "ipConfigurations"
            ]
        )
        for s in any_plan.of_type(VMSS)
    ]
    hub_peerings = [
        p
        for p in any_plan.of_type("azure-native:network:VirtualNetworkPeering")
        if p.inputs["virtualNetworkName"].endswith("-hub")
    ]
    expected = {
        "vnet_private_ips": max(spoke, hub),
        "peered_group_private_ips": hub + spoke + peers,
        "nic_private_ips": max(nic_ips),
        "vnet_peerings": len(hub_peerings) + len(any_plan.spec.peered_spokes),
        "vnet_subnets": sum(1 for r in table if r["vnet"] == "spoke"),
        "vmss_vms": max(vmss_caps),
    }
    for name, used in expected.items():
        row = rows[name]
        assert row["used"] == used, name
        assert row["max"] == AZURE_LIMITS[name][0] and row["override_reason"] is None
        assert row["headroom"] == row["max"] - used >= 0, name


def test_flagship_figures(flagship_plan: Plan) -> None:
    """The numbers the flagship's stack file promises in its header comment."""
    a = flagship_plan.addresses
    assert a.capacity["gpus"] == 60_000 and a.capacity["gpu_nodes"] == 7_500
    # + 8 Prometheus hosts and 3 metrics store hosts beside the cluster
    assert a.spoke.ips_used == 7_500 * 8 + 128 * 31 + 6 + 5 + 5 + 8 + 3 == 63_995
    assert len(a.scale_sets) == 9


def test_capacity_matches_the_spec(any_plan: Plan) -> None:
    cap = report.capacity(any_plan.addresses)
    pools = any_plan.spec.node_pools
    assert cap["nodes"] == sum(p.nodes for p in pools)
    assert cap["gpus"] == sum(p.nodes * p.gpus_per_node for p in pools)
    assert cap["pod_ips"] == sum(p.nodes * p.pod_ips_per_node for p in pools)
    assert cap["scale_sets"] == len(any_plan.of_type(VMSS))


@pytest.mark.parametrize(
    ("total", "per_set", "expected"),
    [
        (7_500, 1_000, [938] * 4 + [937] * 4),
        (1_000, 1_000, [1_000]),
        (1, 1_000, [1]),
        (2_001, 1_000, [667] * 3),
    ],
)
def test_split_pool(total: int, per_set: int, expected: list[int]) -> None:
    assert split_pool(total, per_set) == expected


@pytest.mark.parametrize(
    ("ips", "prefix"), [(1, 29), (3, 29), (4, 28), (11, 28), (12, 27), (7_504, 19), (8_187, 19), (8_188, 18)]
)
def test_prefix_for_counts_azures_five_reserved_addresses(ips: int, prefix: int) -> None:
    assert prefix_for(ips) == prefix
