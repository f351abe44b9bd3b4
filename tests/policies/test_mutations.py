"""Single changes to the real recorded flagship plan: the right rule fires and the check fails."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest

from policies.rules import ALL_RULES
from superkube.model import policy
from superkube.plan import checks
from superkube.plan.engine import Plan
from tests.policies import mutations as m

SCENARIOS: list[tuple[str, Callable[[dict[str, Any]], None], str]] = [
    ("add a public IP", m.add_public_ip, "network-nic-no-public-ip"),
    ("public IP per scale-set node", m.public_ip_on_scale_set, "network-nic-no-public-ip"),
    ("a public IP resource", m.public_ip_resource, "network-nic-no-public-ip"),
    ("a VM's inline NIC with a public IP", m.public_ip_inline_on_vm, "network-nic-no-public-ip"),
    ("a public load-balancer frontend", m.public_lb_frontend, "network-nic-no-public-ip"),
    ("peer two spokes", m.peer_two_spokes, "network-peering-hub-only"),
    ("drop events etcd", m.drop_events_etcd, "topology-etcd-events-present"),
    ("4 API servers", m.drop_one_apiserver, "topology-apiserver-count"),
    ("remove the preflight taint", m.remove_preflight_taint, "compute-vmss-preflight-taint"),
    ("4 etcd main members", m.drop_one_etcd_main, "topology-etcd-main-quorum"),
    ("events etcd on the main subnet", m.events_on_main_subnet, "topology-etcd-events-separate"),
    ("API server on a GPU size", m.apiserver_on_gpu_size, "topology-controlplane-not-on-gpu"),
    ("allow SSH from the internet", m.allow_ssh_from_internet, "network-nsg-deny-internet-inbound"),
    (
        "allow from Internet in a prefix list",
        m.allow_from("sourceAddressPrefixes", ["10.0.0.0/8", "Internet"]),
        "network-nsg-deny-internet-inbound",
    ),
    ("allow from *", m.allow_from("sourceAddressPrefix", "*"), "network-nsg-deny-internet-inbound"),
    (
        "allow from a public range",
        m.allow_from("sourceAddressPrefixes", ["20.37.0.0/16"]),
        "network-nsg-deny-internet-inbound",
    ),
    (
        "allow from the internet, lower case",
        m.allow_from("sourceAddressPrefix", "internet", access="allow", direction="inbound"),
        "network-nsg-deny-internet-inbound",
    ),
    (
        "allow from the internet as its own SecurityRule",
        m.allow_as_security_rule,
        "network-nsg-deny-internet-inbound",
    ),
    ("service route to the wrong hop", m.route_to_wrong_hop, "network-route-service-cidr-via-nat"),
    (
        "service route inline in the table",
        m.inline_route_to_the_internet,
        "network-route-service-cidr-via-nat",
    ),
    (
        "half the services routed elsewhere",
        m.more_specific_route_elsewhere,
        "network-route-service-cidr-via-nat",
    ),
    ("NAT host without IP forwarding", m.nat_forwarding_off, "network-nic-nat-ip-forwarding"),
    ("one pod IP short", m.drop_a_pod_ip, "network-vmss-alias-ip-count"),
    ("overlapping subnets", m.overlapping_subnet, "network-subnet-no-overlap"),
    ("password login", m.password_login, "compute-vm-no-password-login"),
    ("1,200 VMs in a scale set", m.scale_set_over_vm_limit, "compute-vmss-vm-limit"),
    ("no autoscaler discovery tag", m.remove_autoscaler_discovery, "compute-vmss-autoscaler-tags"),
    ("standard disk under etcd", m.standard_etcd_disk, "compute-disk-etcd-premium"),
    ("standard disk attached to etcd by ID", m.etcd_disk_attached_standard, "compute-disk-etcd-premium"),
    ("a spoke peered inline with another spoke", m.inline_spoke_to_spoke_peering, "network-peering-hub-only"),
    ("no owner tag", m.missing_owner_tag, "hygiene-resource-required-tags"),
    ("VNet over its IP limit", m.vnet_over_ip_limit, "network-vnet-ip-limit"),
    ("301 IPs on a NIC", m.nic_over_ip_limit, "network-nic-ip-limit"),
    (
        "Virtual Machine Contributor for the autoscaler",
        m.builtin_contributor_on_the_group,
        "iam-role-assignment-no-builtin-contributor",
    ),
    ("no OS image notice", m.no_os_image_notification, "compute-vmss-terminate-notification"),
]


# Scenarios whose one change is also a fault another rule exists for (the same fact seen from
# another layer, or a limit the change crosses too): every other rule must stay silent.
ALSO: dict[str, set[str]] = {
    "drop events etcd": {"wiring-etcd-urls"},  # the inventory still lists the events members
    "remove the preflight taint": {"wiring-node-registration"},  # registration no longer equals the tags
    "one pod IP short": {"wiring-kubelet-max-pods"},  # maxPods now exceeds the NIC's pod IPs
    # 200 more nodes' IPs no longer fit, and the first max opens 1,200 nodes to the autoscaler at once
    "1,200 VMs in a scale set": {"network-vnet-ip-limit", "platform-autoscaler-join-rate"},
    "VNet over its IP limit": {
        "network-peering-group-ip-limit",
        "wiring-kubelet-max-pods",
        "platform-autoscaler-join-rate",  # its first max opens 999 nodes at once
    },
    "301 IPs on a NIC": {
        "network-peering-group-ip-limit",
        "network-vmss-alias-ip-count",
        "network-vnet-ip-limit",
        "wiring-kubelet-max-pods",
    },
}


@pytest.fixture(scope="module")
def flagship(flagship_plan: Plan) -> tuple[dict[str, Any], policy.RuleConfig]:
    return flagship_plan.to_dict(), checks.rule_config(flagship_plan.spec, flagship_plan.addresses)


def test_the_unchanged_flagship_passes(flagship: tuple[dict[str, Any], policy.RuleConfig]) -> None:
    doc, config = flagship
    report = checks.evaluate(checks.view_from_plan_document(doc), ALL_RULES, config)
    assert report.violations == [] and report.passed


def test_every_expected_side_effect_belongs_to_a_scenario() -> None:
    assert set(ALSO) <= {s[0] for s in SCENARIOS}, "a stale entry would excuse nothing, silently"


@pytest.mark.parametrize(("scenario", "mutate", "rule"), SCENARIOS, ids=[s[0] for s in SCENARIOS])
def test_the_right_rule_fires(
    scenario: str,
    mutate: Callable[[dict[str, Any]], None],
    rule: str,
    flagship: tuple[dict[str, Any], policy.RuleConfig],
) -> None:
    doc, config = flagship
    changed = copy.deepcopy(doc)
    mutate(changed)
    report = checks.evaluate(checks.view_from_plan_document(changed), ALL_RULES, config)
    fired = {v.rule for v in report.violations}
    assert fired == {rule} | ALSO.get(scenario, set()), f"expected only {rule}, got {sorted(fired)}"
    assert not report.passed


def test_the_same_route_written_another_way_still_passes(
    flagship: tuple[dict[str, Any], policy.RuleConfig],
) -> None:
    """Azure reads nextHopType case-insensitively; a route table's inline copy of the same route is fine."""
    doc, config = flagship
    changed = copy.deepcopy(doc)
    route = next(r for r in m.of(changed, "azure-native:network:Route"))
    route["inputs"]["nextHopType"] = "virtualappliance"
    report = checks.evaluate(checks.view_from_plan_document(changed), ALL_RULES, config)
    assert report.violations == []


def test_tag_names_in_another_case_still_pass(flagship: tuple[dict[str, Any], policy.RuleConfig]) -> None:
    """Azure treats tag names case-insensitively: `Owner` is the owner tag."""
    doc, config = flagship
    changed = copy.deepcopy(doc)
    tags = m.of(changed, "azure-native:network:VirtualNetwork", "spoke")[0]["inputs"]["tags"]
    tags["Owner"] = tags.pop("owner")
    assert checks.evaluate(checks.view_from_plan_document(changed), ALL_RULES, config).violations == []
