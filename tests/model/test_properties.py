"""Random specs either plan cleanly (no overlaps, every limit kept) or fail with one keyed line."""

from __future__ import annotations

import ipaddress
import itertools
import re
from typing import Any

import yaml
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from superkube.model import vmsizes
from superkube.model.ipam import AddressPlan, plan_addresses
from superkube.model.spec import CONFIG_KEYS, SpecError, from_config
from superkube.plan import engine as planning
from tests.conftest import EXAMPLE_KEY, ROOT

SETTINGS = settings(
    max_examples=300, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow]
)

node_counts = st.one_of(st.integers(1, 40), st.integers(40, 3_000), st.integers(3_000, 12_000))
pod_ips = st.one_of(st.integers(1, 40), st.integers(1, 40), st.integers(1, 40), st.integers(40, 300))


@st.composite
def pool(draw: st.DrawFn, index: int) -> dict[str, Any]:
    role = draw(st.sampled_from(["gpu", "cpu"]))
    consistent = 8 if role == "gpu" else 0
    gpus = draw(st.sampled_from([0, 4, 8])) if draw(st.integers(0, 9)) == 0 else consistent
    return {
        "name": f"p{index}",
        "role": role,
        "vm_size": "Standard_ND96isr_H100_v5" if role == "gpu" else "Standard_D16s_v5",
        "nodes": draw(node_counts),
        "gpus_per_node": gpus,
        "min_nodes": draw(st.sampled_from([0, 1, 1])) if role == "cpu" else 0,
        "pod_ips_per_node": draw(pod_ips),
        "zones": draw(st.lists(st.sampled_from(["1", "2", "3"]), min_size=1, max_size=3, unique=True)),
    }


@st.composite
def config(draw: st.DrawFn) -> dict[str, Any]:
    pools = [draw(pool(i)) for i in range(draw(st.integers(1, 3)))]
    pools[0]["role"], pools[0]["gpus_per_node"] = "gpu", 8  # mostly valid; the rest still vary
    spoke_prefix = draw(st.integers(12, 24))
    spoke_base = draw(st.sampled_from(["10.64.0.0", "10.96.0.0", "10.0.0.0"]))
    cfg: dict[str, Any] = {
        "ssh_public_key": EXAMPLE_KEY,
        "in_cluster_layer": draw(st.booleans()),
        "hub_address_space": f"10.{draw(st.sampled_from([0, 1, 200]))}.0.0/{draw(st.integers(22, 26))}",
        "hub_shared_subnet_prefix": str(draw(st.integers(24, 28))),
        "spoke_address_space": str(ipaddress.IPv4Network(f"{spoke_base}/{spoke_prefix}", strict=False)),
        "service_cidr": draw(
            st.sampled_from(["10.128.0.0/16", "172.16.0.0/16", "192.168.0.0/16", "10.64.0.0/16"])
        ),
        "apiserver_count": str(draw(st.sampled_from([3, 5, 5, 5, 7, 4, 1]))),
        "etcd_main_count": str(draw(st.sampled_from([3, 5, 5, 5, 7, 2]))),
        "etcd_events_count": str(draw(st.sampled_from([3, 5, 5, 5, 4]))),
        "node_pools": yaml.safe_dump(pools),
    }
    if draw(st.booleans()):
        cfg["peered_spokes"] = yaml.safe_dump(
            {"other": {"address_space": "10.200.64.0/18", "ips": draw(st.integers(0, 120_000))}}
        )
    if draw(st.booleans()):
        cfg["limit_overrides"] = yaml.safe_dump(
            {"vnet_private_ips": {"value": 131_072, "reason": "quota raised by ticket 42"}}
        )
    return cfg


def check_plan(a: AddressPlan) -> None:
    vnets = {"hub": a.hub.address_space, "spoke": a.spoke.address_space}
    for s in a.subnets:
        assert s.cidr.subnet_of(vnets[s.vnet])
        assert s.ips_used <= s.usable
    for x, y in itertools.combinations([s.cidr for s in a.subnets], 2):
        assert not x.overlaps(y)
    for x, y in itertools.combinations([a.hub.address_space, a.spoke.address_space, a.service_cidr], 2):
        assert not x.overlaps(y)
    limits = {k: v.value for k, v in a.limits.items()}
    assert a.spoke.ips_used <= limits["vnet_private_ips"]
    assert all(g.ips_used <= limits["peered_group_private_ips"] for g in a.groups)
    assert max(s.ips_per_nic for s in a.subnets) <= limits["nic_private_ips"]
    assert max(s.capacity for s in a.scale_sets) <= limits["vmss_vms"]
    statics = [
        a.nat_host_ip,
        a.apiserver_lb_ip,
        *a.apiserver_ips,
        *a.etcd_main_ips,
        *a.etcd_events_ips,
        *a.prometheus_ips,
        *a.metrics_store_ips,
    ]
    assert len(set(statics)) == len(statics)
    for name, ips in (
        ("apiservers", [a.apiserver_lb_ip, *a.apiserver_ips]),
        ("etcd-main", a.etcd_main_ips),
        ("etcd-events", a.etcd_events_ips),
        ("prometheus", a.prometheus_ips),
        ("metrics-store", a.metrics_store_ips),
    ):
        cidr = a.subnet(name).cidr
        assert all(ip in cidr and ip not in (cidr.network_address, cidr.broadcast_address) for ip in ips)


def plan_or_error(cfg: dict[str, Any]) -> AddressPlan | SpecError:
    try:
        spec = from_config(cfg)
        vmsizes.check(spec)  # as planning.load does: VM-size facts for the in-cluster layer
        return plan_addresses(spec, "prop")
    except SpecError as exc:
        return exc


def test_random_specs_plan_cleanly_or_fail_with_one_keyed_line() -> None:
    planned: list[bool] = []

    @SETTINGS
    @given(config())
    def each(cfg: dict[str, Any]) -> None:
        result = plan_or_error(cfg)
        planned.append(not isinstance(result, SpecError))
        if isinstance(result, SpecError):
            line = str(result)
            assert "\n" not in line
            assert line.startswith("superkube:"), line
            assert re.split(r"[.\[:]", line.removeprefix("superkube:"))[0] in CONFIG_KEYS, line
            assert "; " in line, line
        else:
            check_plan(result)

    each()
    # a planner that rejected everything would pass every check above: a fair share must plan. The
    # share depends on the order Hypothesis draws examples in, which other test modules run before
    # this one change (29 to 53 of 300 seen since the monitoring hosts joined the plan), so the bar
    # is one in twenty.
    assert sum(planned) >= len(planned) // 20, f"only {sum(planned)} of {len(planned)} random specs planned"


@settings(
    max_examples=12,
    deadline=None,
    derandomize=True,
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.filter_too_much,
        HealthCheck.function_scoped_fixture,
    ],
)
@given(cfg=config())
def test_random_valid_specs_run_through_the_real_program(tmp_path_factory: Any, cfg: dict[str, Any]) -> None:
    assume(not isinstance(plan_or_error(cfg), SpecError))
    path = tmp_path_factory.mktemp("prop") / "Pulumi.prop.yaml"
    path.write_text(yaml.safe_dump({"config": {f"superkube:{k}": v for k, v in cfg.items()}}))
    result = planning.run(ROOT, str(path))
    recorded = [
        ipaddress.IPv4Network(s.inputs["addressPrefix"])
        for s in result.of_type("azure-native:network:Subnet")
    ]
    assert sorted(recorded) == sorted(s.cidr for s in result.addresses.subnets)
    sets = result.of_type("azure-native:compute:VirtualMachineScaleSet")
    assert (
        sum(int(s.inputs["tags"]["superkube-capacity"]) for s in sets) == result.addresses.capacity["nodes"]
    )
    assert all(int(s.inputs["tags"]["superkube-capacity"]) <= 1_000 for s in sets)
