"""Component args fail at construction, naming the field, before any resource exists."""

from __future__ import annotations

import ipaddress

import pytest

from modules.compute.machine import MachineArgs
from modules.compute.node_pool import NodePoolArgs
from modules.control_plane.apiservers import ApiServersArgs
from modules.control_plane.etcd import EtcdClusterArgs
from modules.network.hub import HubArgs
from modules.network.nat_host import NatHostArgs
from superkube.ipam import ScaleSetPlan, SubnetPlan
from superkube.spec import NodePool
from tests.conftest import EXAMPLE_KEY

LOGIN = {"admin_username": "superkube", "ssh_public_key": EXAMPLE_KEY}
POOL = NodePool(
    name="gpu", role="gpu", vm_size="Standard_ND96isr_H100_v5", nodes=10, gpus_per_node=8, pod_ips_per_node=7
)


def sset(capacity: int, pool: str = "gpu") -> ScaleSetPlan:
    return ScaleSetPlan(
        pool=pool, index=0, name="vmss-x-gpu-0", capacity=capacity, min_nodes=0, zones=("1",), subnet="gpu-0"
    )


@pytest.mark.parametrize(
    ("build", "field"),
    [
        (
            lambda: EtcdClusterArgs(
                cluster="x",
                role="main",
                location="eastus",
                resource_group_name="rg",
                subnet_id="s",
                member_ips=["10.0.0.4"] * 3,
                vm_size="Standard_E8s_v5",
                disk_sku="Premium_LRS",
                disk_gb=64,
                **LOGIN,
            ),
            "member_ips",
        ),
        (
            lambda: EtcdClusterArgs(
                cluster="x",
                role="main",
                location="eastus",
                resource_group_name="rg",
                subnet_id="s",
                member_ips=["a", "b", "c", "d"],
                vm_size="Standard_E8s_v5",
                disk_sku="Premium_LRS",
                disk_gb=64,
                **LOGIN,
            ),
            "member_ips",
        ),
        (
            lambda: EtcdClusterArgs(
                cluster="x",
                role="events",
                location="eastus",
                resource_group_name="rg",
                subnet_id="s",
                member_ips=["a", "b", "c"],
                vm_size="Standard_E8s_v5",
                disk_sku="Standard_LRS",
                disk_gb=64,
                **LOGIN,
            ),
            "disk_sku",
        ),
        (
            lambda: ApiServersArgs(
                cluster="x",
                location="eastus",
                subscription_id="s",
                resource_group_name="rg",
                subnet_id="s",
                frontend_ip="10.0.0.4",
                member_ips=["a", "b", "c", "d"],
                vm_size="Standard_D8s_v5",
                **LOGIN,
            ),
            "member_ips",
        ),
        (
            lambda: ApiServersArgs(
                cluster="x",
                location="eastus",
                subscription_id="s",
                resource_group_name="rg",
                subnet_id="s",
                frontend_ip="a",
                member_ips=["a", "b", "c"],
                vm_size="Standard_D8s_v5",
                **LOGIN,
            ),
            "frontend_ip",
        ),
        (
            lambda: MachineArgs(
                vm_name="v" * 65,
                location="eastus",
                resource_group_name="rg",
                subnet_id="s",
                private_ip="10.0.0.4",
                vm_size="Standard_D2s_v5",
                tags={"superkube-role": "x"},
                **LOGIN,
            ),
            "vm_name",
        ),
        (
            lambda: MachineArgs(
                vm_name="v",
                location="eastus",
                resource_group_name="rg",
                subnet_id="s",
                private_ip="10.0.0.4",
                vm_size="Standard_D2s_v5",
                tags={},
                **LOGIN,
            ),
            "tags",
        ),
        (
            lambda: NatHostArgs(
                cluster="x",
                location="eastus",
                resource_group_name="rg",
                subnet_id="s",
                private_ip="10.0.0.4",
                route_table_name="rt",
                service_cidr="10.128.0.0",
                vm_size="Standard_D2s_v5",
                **LOGIN,
            ),
            "service_cidr",
        ),
        (
            lambda: HubArgs(
                cluster="x",
                location="eastus",
                resource_group_name="rg",
                address_space="10.0.0.0/24",
                subnets=(SubnetPlan("hub", "nat", ipaddress.IPv4Network("10.0.0.0/29"), "nat", 1, 1),),
            ),
            "subnets",
        ),
        (
            lambda: NodePoolArgs(
                cluster="x",
                location="eastus",
                resource_group_name="rg",
                pool=POOL,
                scale_sets=[sset(9)],
                subnet_ids={"gpu-0": "s"},
                apiserver_endpoint="https://a:6443",
                kubernetes_version="1.31.4",
                **LOGIN,
            ),
            "scale_sets",
        ),
        (
            lambda: NodePoolArgs(
                cluster="x",
                location="eastus",
                resource_group_name="rg",
                pool=POOL,
                scale_sets=[sset(10, pool="cpu")],
                subnet_ids={"gpu-0": "s"},
                apiserver_endpoint="https://a:6443",
                kubernetes_version="1.31.4",
                **LOGIN,
            ),
            "scale_sets",
        ),
        (
            lambda: NodePoolArgs(
                cluster="x",
                location="eastus",
                resource_group_name="rg",
                pool=POOL,
                scale_sets=[sset(10)],
                subnet_ids={},
                apiserver_endpoint="https://a:6443",
                kubernetes_version="1.31.4",
                **LOGIN,
            ),
            "subnet_ids",
        ),
    ],
)
def test_bad_args_name_the_field(build: object, field: str) -> None:
    with pytest.raises(ValueError, match=rf"^{field}: "):
        build()  # type: ignore[operator]


def test_good_args_construct() -> None:
    args = NodePoolArgs(
        cluster="x",
        location="eastus",
        resource_group_name="rg",
        pool=POOL,
        scale_sets=[sset(10)],
        subnet_ids={"gpu-0": "s"},
        apiserver_endpoint="https://a:6443",
        kubernetes_version="1.31.4",
        **LOGIN,
    )
    assert args.join_jitter_seconds == 300 and args.autoscaler is True
