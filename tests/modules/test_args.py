"""Component args fail at construction, naming the field, before any resource exists."""

from __future__ import annotations

import ipaddress
from typing import Any

import pytest

from modules.compute.machine import MachineArgs
from modules.compute.node_pool import NodePoolArgs
from modules.control_plane.apiservers import ApiServersArgs
from modules.control_plane.etcd import EtcdClusterArgs
from modules.network.hub import HubArgs
from modules.network.nat_host import NatHostArgs
from superkube.model.ipam import ScaleSetPlan, SubnetPlan
from superkube.model.spec import NodePool
from tests.conftest import EXAMPLE_KEY

LOGIN = {"admin_username": "superkube", "ssh_public_key": EXAMPLE_KEY}
POOL = NodePool(
    name="gpu", role="gpu", vm_size="Standard_ND96isr_H100_v5", nodes=10, gpus_per_node=8, pod_ips_per_node=7
)


def sset(capacity: int, pool: str = "gpu") -> ScaleSetPlan:
    return ScaleSetPlan(
        pool=pool, index=0, name="vmss-x-gpu-0", capacity=capacity, min_nodes=0, zones=("1",), subnet="gpu-0"
    )


NAT_SUBNET = SubnetPlan("hub", "nat", ipaddress.IPv4Network("10.0.0.0/29"), "nat", 1, 1)

# Arguments each component accepts; every case below changes one field of these.
GOOD: dict[type, dict[str, Any]] = {
    EtcdClusterArgs: dict(
        cluster="x",
        role="main",
        location="eastus",
        resource_group_name="rg",
        subnet_id="s",
        member_ips=["a", "b", "c"],
        vm_size="Standard_E8s_v5",
        disk_sku="Premium_LRS",
        disk_gb=64,
        **LOGIN,
    ),
    ApiServersArgs: dict(
        cluster="x",
        location="eastus",
        subscription_id="s",
        resource_group_name="rg",
        subnet_id="s",
        frontend_ip="10.0.0.4",
        member_ips=["a", "b", "c"],
        vm_size="Standard_D8s_v5",
        **LOGIN,
    ),
    MachineArgs: dict(
        vm_name="v",
        location="eastus",
        resource_group_name="rg",
        subnet_id="s",
        private_ip="10.0.0.4",
        vm_size="Standard_D2s_v5",
        tags={"superkube-role": "x"},
        **LOGIN,
    ),
    NatHostArgs: dict(
        cluster="x",
        location="eastus",
        resource_group_name="rg",
        subnet_id="s",
        private_ip="10.0.0.4",
        route_table_name="rt",
        service_cidr="10.128.0.0/16",
        vm_size="Standard_D2s_v5",
        **LOGIN,
    ),
    HubArgs: dict(
        cluster="x",
        location="eastus",
        resource_group_name="rg",
        address_space="10.0.0.0/24",
        subnets=(
            NAT_SUBNET,
            SubnetPlan("hub", "shared", ipaddress.IPv4Network("10.0.0.128/25"), "shared", 1, 1),
        ),
    ),
    NodePoolArgs: dict(
        cluster="x",
        location="eastus",
        resource_group_name="rg",
        pool=POOL,
        scale_sets=[sset(10)],
        subnet_ids={"gpu-0": "s"},
        apiserver_endpoint="https://a:6443",
        kubernetes_version="1.31.4",
        **LOGIN,
    ),
}


@pytest.mark.parametrize(
    ("cls", "change", "field"),
    [
        (EtcdClusterArgs, {"member_ips": ["10.0.0.4"] * 3}, "member_ips"),
        (EtcdClusterArgs, {"member_ips": ["a", "b", "c", "d"]}, "member_ips"),
        (EtcdClusterArgs, {"role": "events", "disk_sku": "Standard_LRS"}, "disk_sku"),
        (ApiServersArgs, {"member_ips": ["a", "b", "c", "d"]}, "member_ips"),
        (ApiServersArgs, {"frontend_ip": "a"}, "frontend_ip"),
        (MachineArgs, {"vm_name": "v" * 65}, "vm_name"),
        (MachineArgs, {"tags": {}}, "tags"),
        (NatHostArgs, {"service_cidr": "10.128.0.0"}, "service_cidr"),
        (HubArgs, {"subnets": (NAT_SUBNET,)}, "subnets"),
        (NodePoolArgs, {"scale_sets": [sset(9)]}, "scale_sets"),
        (NodePoolArgs, {"scale_sets": [sset(10, pool="cpu")]}, "scale_sets"),
        (NodePoolArgs, {"subnet_ids": {}}, "subnet_ids"),
    ],
)
def test_bad_args_name_the_field(cls: type, change: dict[str, Any], field: str) -> None:
    with pytest.raises(ValueError, match=rf"^{field}: "):
        cls(**{**GOOD[cls], **change})


@pytest.mark.parametrize("cls", list(GOOD), ids=lambda c: c.__name__)
def test_each_case_breaks_only_the_field_it_changes(cls: type) -> None:
    cls(**GOOD[cls])  # the unchanged arguments construct, so each failure above is its field's


def test_good_args_construct() -> None:
    args = NodePoolArgs(**GOOD[NodePoolArgs])
    assert args.join_jitter_seconds == 300 and args.autoscaler is True
