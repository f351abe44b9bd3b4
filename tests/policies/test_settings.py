"""A documented setting either passes `check` or says which rule to relax: autoscaler_enabled false
is a supported way to run fixed-size pools, and the rules count capacity from what the plan creates."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from policies.rules import ALL_RULES
from policies.rules.network import ips_by_vnet
from superkube.model import policy
from superkube.plan import checks
from superkube.plan import engine as planning
from superkube.plan.engine import Plan
from tests.conftest import ROOT


def flagship_config() -> dict[str, Any]:
    import yaml

    return dict(yaml.safe_load((ROOT / "stacks" / "Pulumi.flagship.yaml").read_text())["config"])


@pytest.fixture(scope="module")
def fixed_size(tmp_path_factory: pytest.TempPathFactory) -> Plan:
    import yaml

    path = tmp_path_factory.mktemp("fixed") / "Pulumi.fixed.yaml"
    path.write_text(yaml.safe_dump({"config": {**flagship_config(), "superkube:autoscaler_enabled": False}}))
    return planning.run(ROOT, str(path))


def report(plan_doc: dict[str, Any], config: policy.RuleConfig) -> checks.Report:
    return checks.evaluate(checks.view_from_plan_document(plan_doc), ALL_RULES, config)


def test_fixed_size_pools_pass_check(fixed_size: Plan) -> None:
    result = report(fixed_size.to_dict(), checks.rule_config(fixed_size.spec, fixed_size.addresses))
    assert [f"{v.rule}: {v.message}" for v in result.violations] == []


def test_capacity_is_counted_from_the_plan_with_or_without_the_autoscaler(
    fixed_size: Plan, flagship_plan: Plan
) -> None:
    def spoke_ips(plan: Plan) -> int:
        view = checks.view_from_plan_document(plan.to_dict())
        used = ips_by_vnet(view)
        return max(used.values())  # the spoke: every node and pod IP lives there

    assert spoke_ips(fixed_size) == spoke_ips(flagship_plan) == flagship_plan.addresses.spoke.ips_used


def test_fixed_size_pools_must_not_carry_discovery_tags(fixed_size: Plan) -> None:
    doc = copy.deepcopy(fixed_size.to_dict())
    vmss = next(r for r in doc["resources"] if r["type"] == "azure-native:compute:VirtualMachineScaleSet")
    vmss["inputs"]["tags"]["cluster-autoscaler-enabled"] = "true"
    result = report(doc, checks.rule_config(fixed_size.spec, fixed_size.addresses))
    fired = {v.rule for v in result.violations}
    # the registration rule sees the same half-tagged set: tagged for discovery, without a template
    assert (
        "compute-vmss-autoscaler-tags"
        in fired
        <= {"compute-vmss-autoscaler-tags", "wiring-node-registration"}
    )


def test_remediations_name_only_settings_that_exist() -> None:
    """A fix that says `set superkube:<key>` must name a key the spec has."""
    import re

    from superkube.model.spec import CONFIG_KEYS

    for rule in ALL_RULES:
        for key in re.findall(r"superkube:([a-z_]+)", rule.remediation):
            assert key in CONFIG_KEYS, f"{rule.name} tells users to set superkube:{key}, which does not exist"


def test_a_one_node_gpu_cluster_autoscales_with_no_cpu_pool(write_stack: Any) -> None:
    """One GPU pool that may scale to zero, the autoscaler on: it runs on the API-server hosts, which
    are always there, so the stack plans and passes every rule."""
    import yaml

    from superkube.cluster.inventory import cluster_facts
    from tests.conftest import dev_config

    config = dev_config()
    (gpu,) = [p for p in yaml.safe_load(config["superkube:node_pools"]) if p["role"] == "gpu"]
    config["superkube:node_pools"] = yaml.safe_dump([{**gpu, "nodes": 1, "min_nodes": 0}], sort_keys=False)
    plan = planning.run(ROOT, str(write_stack(config)))
    assert plan.spec.autoscaler_enabled and [p.role for p in plan.spec.node_pools] == ["gpu"]
    result = report(plan.to_dict(), checks.rule_config(plan.spec, plan.addresses))
    assert [f"{v.rule}: {v.message}" for v in result.violations] == []
    assert cluster_facts(plan.spec, plan.addresses)["autoscaler_flags"]  # the host service has its flags
    assert not any(
        r.inputs.get("identity") for r in plan.of_type("azure-native:compute:VirtualMachineScaleSet")
    )


def test_the_autoscaler_identity_rule_fires_on_a_node_pool_identity(
    fixed_size: Plan, flagship_plan: Plan
) -> None:
    doc = copy.deepcopy(flagship_plan.to_dict())
    vmss = next(r for r in doc["resources"] if r["type"] == "azure-native:compute:VirtualMachineScaleSet")
    vmss["inputs"]["identity"] = {"type": "UserAssigned", "userAssignedIdentities": ["/subscriptions/x/id"]}
    fired = {
        v.rule
        for v in report(doc, checks.rule_config(flagship_plan.spec, flagship_plan.addresses)).violations
    }
    assert fired == {"compute-autoscaler-identity-on-apiservers"}
    # with the autoscaler off, the API servers carry no autoscaler identity tag
    doc = copy.deepcopy(fixed_size.to_dict())
    vm = next(
        r
        for r in doc["resources"]
        if r["type"] == "azure-native:compute:VirtualMachine" and "apiservers" in r["name"]
    )
    vm["inputs"]["tags"]["superkube-autoscaler-identity"] = "x"
    fired = {
        v.rule for v in report(doc, checks.rule_config(fixed_size.spec, fixed_size.addresses)).violations
    }
    assert fired == {"compute-autoscaler-identity-on-apiservers"}
