"""Single changes to the real recorded flagship plan: the right rule fires and the check fails."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest

from policies.rules import ALL_RULES
from superkube import checks
from superkube.plan import Plan
from tests.policies import mutations as m

SCENARIOS: list[tuple[str, Callable[[dict[str, Any]], None], str]] = [
    ("add a public IP", m.add_public_ip, "network-nic-no-public-ip"),
    ("peer two spokes", m.peer_two_spokes, "network-peering-hub-only"),
    ("drop events etcd", m.drop_events_etcd, "topology-etcd-events-present"),
    ("4 API servers", m.drop_one_apiserver, "topology-apiserver-count"),
    ("remove the preflight taint", m.remove_preflight_taint, "compute-vmss-preflight-taint"),
    ("4 etcd main members", m.drop_one_etcd_main, "topology-etcd-main-quorum"),
    ("events etcd on the main subnet", m.events_on_main_subnet, "topology-etcd-events-separate"),
    ("API server on a GPU size", m.apiserver_on_gpu_size, "topology-controlplane-not-on-gpu"),
    ("allow SSH from the internet", m.allow_ssh_from_internet, "network-nsg-deny-internet-inbound"),
    ("service route to the wrong hop", m.route_to_wrong_hop, "network-route-service-cidr-via-nat"),
    ("NAT host without IP forwarding", m.nat_forwarding_off, "network-nic-nat-ip-forwarding"),
    ("one pod IP short", m.drop_a_pod_ip, "network-vmss-alias-ip-count"),
    ("overlapping subnets", m.overlapping_subnet, "network-subnet-no-overlap"),
    ("password login", m.password_login, "compute-vm-no-password-login"),
    ("1,200 VMs in a scale set", m.scale_set_over_vm_limit, "compute-vmss-vm-limit"),
    ("no autoscaler discovery tag", m.remove_autoscaler_discovery, "compute-vmss-autoscaler-tags"),
    ("standard disk under etcd", m.standard_etcd_disk, "compute-disk-etcd-premium"),
    ("no owner tag", m.missing_owner_tag, "hygiene-resource-required-tags"),
    ("VNet over its IP limit", m.vnet_over_ip_limit, "network-vnet-ip-limit"),
    ("301 IPs on a NIC", m.nic_over_ip_limit, "network-nic-ip-limit"),
]


@pytest.fixture(scope="module")
def flagship(flagship_plan: Plan) -> tuple[dict[str, Any], checks.RuleConfig]:
    return flagship_plan.to_dict(), checks.rule_config(flagship_plan.spec, flagship_plan.addresses)


def test_the_unchanged_flagship_passes(flagship: tuple[dict[str, Any], checks.RuleConfig]) -> None:
    doc, config = flagship
    report = checks.evaluate(checks.view_from_plan_document(doc), ALL_RULES, config)
    assert report.violations == [] and report.passed


def test_at_least_15_scenarios() -> None:
    assert len(SCENARIOS) >= 15


@pytest.mark.parametrize(("mutate", "rule"), [s[1:] for s in SCENARIOS], ids=[s[0] for s in SCENARIOS])
def test_the_right_rule_fires(
    mutate: Callable[[dict[str, Any]], None], rule: str, flagship: tuple[dict[str, Any], checks.RuleConfig]
) -> None:
    doc, config = flagship
    changed = copy.deepcopy(doc)
    mutate(changed)
    report = checks.evaluate(checks.view_from_plan_document(changed), ALL_RULES, config)
    fired = {v.rule for v in report.violations}
    assert rule in fired, f"expected {rule}, got {sorted(fired)}"
    assert not report.passed
