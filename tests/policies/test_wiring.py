"""Cross-layer rules: each fact changed in one place only (the Azure plan, the inventory, or a group
variable over the roles) is caught by its wiring rule, and by no other wiring rule."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from typing import Any

import pytest

from policies.rules import wiring as wiring_rules
from superkube.model import policy
from superkube.plan import checks
from superkube.plan.engine import Plan
from tests.policies import mutations as m

Doc = dict[str, Any]


def _inventory_var(name: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def change(inventory: dict[str, Any]) -> None:
        inventory["hostvar_expressions"][name] = (
            json.dumps(value) if not isinstance(value, str) else f"'{value}'"
        )

    return change


# (what changes, plan change, inventory change, group variables, the rule that must fire)
CASES: list[
    tuple[str, Callable[[Doc], None] | None, Callable[[dict[str, Any]], None] | None, dict[str, Any], str]
] = [
    ("plan: load balancer IP", m.move_apiserver_lb, None, {}, "wiring-apiserver-endpoint"),
    (
        "inventory: API URL",
        None,
        _inventory_var("superkube_apiserver_url", "https://10.65.16.9:6443"),
        {},
        "wiring-apiserver-endpoint",
    ),
    (
        "group var: kubelet's API URL",
        None,
        None,
        {"kubelet_apiserver_url": "https://10.0.0.1:6443"},
        "wiring-apiserver-endpoint",
    ),
    (
        "group var: the controller-manager through the load balancer",
        None,
        None,
        {"kube_controller_manager_apiserver_url": "https://10.65.16.4:6443"},
        "wiring-apiserver-endpoint",
    ),
    (
        "inventory: serving cert SANs",
        None,
        _inventory_var("superkube_apiserver_sans", ["10.65.16.4"]),
        {},
        "wiring-apiserver-endpoint",
    ),
    ("plan: hub route prefix", m.service_route_elsewhere, None, {}, "wiring-service-cidr"),
    (
        "inventory: service CIDR",
        None,
        _inventory_var("superkube_service_cidr", "10.129.0.0/16"),
        {},
        "wiring-service-cidr",
    ),
    (
        "group var: controller-manager service range",
        None,
        None,
        {"kube_controller_manager_extra_flags": {"service-cluster-ip-range": "10.130.0.0/16"}},
        "wiring-service-cidr",
    ),
    (
        "inventory: cluster DNS",
        None,
        _inventory_var("superkube_dns_ip", "10.1.0.10"),
        {},
        "wiring-service-cidr",
    ),
    (
        "inventory: cluster DNS where the layer serves none",
        None,
        _inventory_var("superkube_dns_ip", "10.128.0.11"),
        {},
        "wiring-service-cidr",
    ),
    ("plan: the DNS Service elsewhere", m.dns_service_elsewhere, None, {}, "wiring-service-cidr"),
    ("plan: no CoreDNS behind the Service", m.drop_the_dns_deployment, None, {}, "wiring-service-cidr"),
    (
        "group var: etcd client port",
        None,
        None,
        {"kube_apiserver_etcd_client_port": 2479},
        "wiring-etcd-urls",
    ),
    (
        "group var: Events to the main cluster",
        None,
        None,
        {"kube_apiserver_etcd_events": ["etcd-main-flagship-0"]},
        "wiring-etcd-urls",
    ),
    ("plan: one pod IP fewer", m.one_pod_ip_fewer, None, {}, "wiring-kubelet-max-pods"),
    ("group var: maxPods", None, None, {"kubelet_extra_config": {"maxPods": 110}}, "wiring-kubelet-max-pods"),
    (
        "inventory: pool facts",
        None,
        _inventory_var(
            "superkube_pools",
            {
                "gpu": {"role": "gpu", "pod_ips_per_node": 7, "max_pods": 15},
                "cpu": {"role": "cpu", "pod_ips_per_node": 30, "max_pods": 38},
            },
        ),
        {},
        "wiring-kubelet-max-pods",
    ),
    ("plan: node-template label", m.node_template_label_differs, None, {}, "wiring-node-registration"),
    ("plan: cloud-init label", m.cloud_init_label_differs, None, {}, "wiring-node-registration"),
    (
        "group var: taints in the kubelet config",
        None,
        None,
        {"kubelet_extra_config": {"registerWithTaints": [{"key": "a", "effect": "NoSchedule"}]}},
        "wiring-node-registration",
    ),
    (
        "group var: a kubelet field 1.35 lacks",
        None,
        None,
        {"kubelet_extra_config": {"maxPod": 20}},
        "wiring-component-config",
    ),
    (
        "group var: a kube-proxy value of the wrong type",
        None,
        None,
        {"kube_proxy_extra_config": {"configSyncPeriod": "15 minutes"}},
        "wiring-component-config",
    ),
    (
        "inventory: where the bootstrap kubeconfig goes",
        None,
        _inventory_var("superkube_kubelet_bootstrap_kubeconfig", "/etc/kubernetes/other.conf"),
        {},
        "wiring-node-registration",
    ),
    ("plan: a store host elsewhere", m.move_a_store_host, None, {}, "wiring-monitoring-store"),
    (
        "inventory: shards write to a store outside the plan",
        None,
        _inventory_var(
            "superkube_metrics_store_write_urls",
            ["http://10.9.9.9:8480/insert/0/prometheus/api/v1/write"] * 8,
        ),
        {},
        "wiring-monitoring-store",
    ),
    (
        "group var: every host runs shard 0",
        None,
        None,
        {"monitoring_host_shards": [0]},
        "wiring-monitoring-store",
    ),
    (
        "group var: one store host",
        None,
        None,
        {"metrics_store_hosts": ["10.65.16.68"]},
        "wiring-monitoring-store",
    ),
    (
        "group var: the lab's cgroup v1 allowance",
        None,
        None,
        {"kubelet_extra_config": {"failCgroupV1": False}},
        "wiring-lab-only",
    ),
    (
        "group var: the lab's image garbage collection off",
        None,
        None,
        {"kubelet_extra_config": {"imageGCHighThresholdPercent": 100}},
        "wiring-lab-only",
    ),
    (
        "group var: the lab's container runtime allowance",
        None,
        None,
        {"node_software_no_new_keyring": True},
        "wiring-lab-only",
    ),
    (
        "group var: pods at containerd's OOM score",
        None,
        None,
        {"node_software_restrict_oom_score_adj": True},
        "wiring-lab-only",
    ),
    (
        "group var: the lab's conntrack allowance",
        None,
        None,
        {"kube_proxy_extra_config": {"conntrack": {"maxPerCore": 0}}},
        "wiring-lab-only",
    ),
    (
        "group var: kubelets serving a self-signed certificate",
        None,
        None,
        {"kubelet_extra_config": {"serverTLSBootstrap": False}},
        "wiring-kubelet-serving-certificates",
    ),
    (
        "plan: no serving-certificate approver",
        m.drop_the_serving_approver,
        None,
        {},
        "wiring-kubelet-serving-certificates",
    ),
    ("plan: scale set's cluster tag", m.scale_set_of_another_cluster, None, {}, "wiring-cluster-name"),
    (
        "group var: controller-manager cluster name",
        None,
        None,
        {"kube_controller_manager_extra_flags": {"cluster-name": "other"}},
        "wiring-cluster-name",
    ),
]


@pytest.fixture(scope="module")
def flagship(flagship_plan: Plan) -> tuple[Doc, policy.RuleConfig]:
    return flagship_plan.to_dict(), checks.rule_config(flagship_plan.spec, flagship_plan.addresses)


def _fired(doc: Doc, config: policy.RuleConfig) -> dict[str, list[str]]:
    report = checks.evaluate(checks.view_from_plan_document(doc), wiring_rules.RULES, config)
    fired: dict[str, list[str]] = {}
    for v in report.violations:
        fired.setdefault(v.rule, []).append(v.message)
    return fired


def test_every_shipped_stack_is_wired_consistently(dev_plan: Plan, flagship_plan: Plan) -> None:
    for plan in (dev_plan, flagship_plan):
        config = checks.rule_config(plan.spec, plan.addresses)
        assert _fired(plan.to_dict(), config) == {}, plan.stack


@pytest.mark.parametrize(
    ("plan_change", "inventory_change", "group_vars", "rule"),
    [c[1:] for c in CASES],
    ids=[c[0] for c in CASES],
)
def test_one_fact_changed_in_one_place_is_caught(
    plan_change: Callable[[Doc], None] | None,
    inventory_change: Callable[[dict[str, Any]], None] | None,
    group_vars: dict[str, Any],
    rule: str,
    flagship: tuple[Doc, policy.RuleConfig],
) -> None:
    doc, config = flagship
    doc = copy.deepcopy(doc)
    inventory = copy.deepcopy(dict(config.inventory))
    if plan_change:
        plan_change(doc)
    if inventory_change:
        inventory_change(inventory)
    changed = policy.RuleConfig(**{**config.__dict__, "inventory": inventory, "group_vars": group_vars})
    fired = _fired(doc, changed)
    assert list(fired) == [rule], fired


def test_without_an_inventory_the_rules_say_so(flagship: tuple[Doc, policy.RuleConfig]) -> None:
    doc, config = flagship
    bare = policy.RuleConfig(**{**config.__dict__, "inventory": {}})
    fired = _fired(doc, bare)
    assert set(fired) == {r.name for r in wiring_rules.RULES}
    assert all("no inventory" in msgs[0] for msgs in fired.values())
