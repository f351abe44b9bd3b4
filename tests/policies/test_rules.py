"""Each rule on a compliant fixture (the recorded dev plan) and on it with one field changed."""

from __future__ import annotations

import base64
import copy
import dataclasses
from typing import Any

import pytest
import yaml

from policies.rules import ALL_RULES
from superkube.cluster import join
from superkube.model import policy
from superkube.plan import checks
from superkube.plan.engine import Plan
from tests.policies.mutations import BY_RULE

RULES = {r.name: r for r in ALL_RULES}


@pytest.fixture(scope="module")
def dev_doc(dev_plan: Plan) -> dict[str, Any]:
    return dev_plan.to_dict()


@pytest.fixture(scope="module")
def dev_config(dev_plan: Plan) -> policy.RuleConfig:
    return checks.rule_config(dev_plan.spec, dev_plan.addresses)


def findings(rule: policy.Rule, doc: dict[str, Any], config: policy.RuleConfig) -> list[policy.Finding]:
    return list(rule.check(checks.view_from_plan_document(doc), config))


def test_rules_are_named_area_resource_rule_and_documented() -> None:
    assert len(ALL_RULES) >= 20 and len(RULES) == len(ALL_RULES)
    for r in ALL_RULES:
        area, resource, rest = r.name.split("-", 2)
        assert (
            area in {"topology", "network", "compute", "iam", "hygiene", "wiring", "platform", "monitoring"}
            and resource
            and rest
        )
        assert r.severity in {"critical", "high", "medium", "low"}
        assert r.description.endswith(".") and r.remediation.endswith(".")


@pytest.mark.parametrize("name", sorted(RULES))
def test_rule_passes_the_compliant_fixture(
    name: str, dev_doc: dict[str, Any], dev_config: policy.RuleConfig
) -> None:
    assert findings(RULES[name], dev_doc, dev_config) == []


@pytest.mark.parametrize("name", sorted(BY_RULE))
def test_rule_fires_when_one_field_changes(
    name: str, dev_doc: dict[str, Any], dev_config: policy.RuleConfig
) -> None:
    doc = copy.deepcopy(dev_doc)
    BY_RULE[name](doc)
    found = findings(RULES[name], doc, dev_config)
    assert found, f"{name} missed {BY_RULE[name].__name__}"
    assert all(f.message for f in found)


def test_every_rule_has_a_one_field_change() -> None:
    from tests.policies.test_jobs_rules import CASES as JOBS_CASES  # teams, jobs, webhooks
    from tests.policies.test_monitoring_rules import CASES as MONITORING_CASES  # changes to the config
    from tests.policies.test_platform import CASES as PLATFORM_CASES  # the in-cluster layer's own cases
    from tests.policies.test_wiring import CASES as WIRING_CASES  # one fact changed in one layer

    cased = {c[2] for c in PLATFORM_CASES} | {c[2] for c in MONITORING_CASES} | {c[4] for c in WIRING_CASES}
    cased |= {c[2] for c in JOBS_CASES}
    assert set(BY_RULE) | cased | {
        "network-peering-group-ip-limit",
        "compute-join-token-short-lived",
        "wiring-etcd-urls",
        "wiring-component-config",
    } == set(RULES)


def test_peered_group_limit_fires_when_other_spokes_fill_the_hub(
    dev_doc: dict[str, Any], dev_config: policy.RuleConfig
) -> None:
    rule = RULES["network-peering-group-ip-limit"]
    assert findings(rule, dev_doc, dev_config) == []
    crowded = dataclasses.replace(dev_config, other_spokes_ips=127_990)
    (finding,) = findings(rule, dev_doc, crowded)
    assert "128,000" in finding.message


def test_the_terminate_rule_wants_the_os_image_notice_too(
    dev_doc: dict[str, Any], dev_config: policy.RuleConfig
) -> None:
    from tests.policies.mutations import no_os_image_notification

    rule = RULES["compute-vmss-terminate-notification"]
    doc = copy.deepcopy(dev_doc)
    no_os_image_notification(doc)
    (finding,) = findings(rule, doc, dev_config)
    assert "osImageNotificationProfile.enable" in finding.message


@pytest.mark.parametrize(
    ("role", "scope", "fires"),
    [
        ("b24988ac-6180-42a0-ab88-20f7382dd24c", "/subscriptions/s", "Contributor"),
        ("8e3af657-a8ff-443c-a75c-2fe8c4bcb635", "/subscriptions/s/resourceGroups/rg-dev", "Owner"),
        (
            "4A9AE827-6DC8-4573-8AC7-8239D42AA03F",
            "/subscriptions/s/resourceGroups/rg-dev/",
            "Tag Contributor",
        ),
        (
            "4d97b98b-1d4f-4787-a291-c67834d212e7",
            "/providers/Microsoft.Management/managementGroups/m",
            "Network",
        ),
        # a built-in role on one resource, and a reader anywhere, are left alone
        ("4d97b98b-1d4f-4787-a291-c67834d212e7", "/subscriptions/s/resourceGroups/rg/providers/x/y/z", None),
        ("acdd72a7-3385-48ef-bd42-f606fba81ae7", "/subscriptions/s", None),
    ],
)
def test_a_broad_builtin_role_on_a_group_or_wider_is_refused(
    dev_doc: dict[str, Any], dev_config: policy.RuleConfig, role: str, scope: str, fires: str | None
) -> None:
    rule = RULES["iam-role-assignment-no-builtin-contributor"]
    doc = copy.deepcopy(dev_doc)
    assignment = next(r for r in doc["resources"] if r["type"] == "azure-native:authorization:RoleAssignment")
    assignment["inputs"]["roleDefinitionId"] = (
        f"/subscriptions/s/providers/Microsoft.Authorization/roleDefinitions/{role}"
    )
    assignment["inputs"]["scope"] = scope
    found = findings(rule, doc, dev_config)
    if fires is None:
        assert found == []
        return
    (finding,) = found
    assert (
        assignment["name"] in finding.message and fires in finding.message and role.lower() in finding.message
    )
    assert (
        "custom role" in finding.message
        and "Microsoft.Compute/virtualMachineScaleSets/write" in finding.message
    )


@pytest.mark.parametrize(
    ("settings", "says"),
    [
        ({"ttl_s": 0, "rotate_s": 0}, "must expire"),
        ({"ttl_s": 7 * 24 * 3600, "rotate_s": 3600}, "short-lived"),
        ({"ttl_s": 3600, "rotate_s": 3600}, "leave each token"),
        ("forever", "no lifetime settings"),
    ],
)
def test_a_join_token_that_never_expires_or_outlives_a_day_is_refused(
    dev_doc: dict[str, Any], dev_config: policy.RuleConfig, settings: Any, says: str
) -> None:
    rule = RULES["compute-join-token-short-lived"]
    assert findings(rule, dev_doc, dev_config) == []  # the inventory's own settings
    changed = dataclasses.replace(dev_config, group_vars={"superkube_join_tokens": settings})
    (finding,) = findings(rule, dev_doc, changed)
    assert says in finding.message


@pytest.mark.parametrize(
    ("hours", "refused"), [(0, True), (24 * 7, True), ("never", True), (0.5, True), (24, False), (6, False)]
)
def test_converges_own_bootstrap_token_must_expire_within_a_day(
    dev_doc: dict[str, Any], dev_config: policy.RuleConfig, hours: Any, refused: bool
) -> None:
    rule = RULES["compute-join-token-short-lived"]
    changed = dataclasses.replace(dev_config, group_vars={"kube_pki_bootstrap_token_hours": hours})
    found = findings(rule, dev_doc, changed)
    assert [f.message for f in found] == (
        [f"converge's bootstrap token: kube_pki_bootstrap_token_hours {hours!r} must be whole hours, above 0 and at most 24: "
         "a bootstrap token must be short-lived"] if refused else []
    )  # fmt: skip


@pytest.mark.parametrize(
    "where",
    ["runcmd", "user data", "key file"],
)
def test_a_credential_anywhere_in_custom_data_or_any_user_data_is_refused(
    dev_doc: dict[str, Any], dev_config: policy.RuleConfig, where: str
) -> None:
    rule = RULES["compute-vmss-custom-data-no-credentials"]
    assert findings(rule, dev_doc, dev_config) == []
    doc = copy.deepcopy(dev_doc)
    vmss = next(r for r in doc["resources"] if r["type"] == "azure-native:compute:VirtualMachineScaleSet")
    profile = vmss["inputs"]["virtualMachineProfile"]
    text = base64.b64decode(profile["osProfile"]["customData"]).decode()
    cloud = yaml.safe_load(text)
    if where == "runcmd":
        cloud["runcmd"].append(["sh", "-c", f"echo {join.new_token().value} > /tmp/t"])
    elif where == "key file":
        cloud["write_files"].append({"path": "/etc/k.pem", "content": "-----BEGIN EC PRIVATE KEY-----\nx\n"})
    else:
        profile["userData"] = base64.b64encode(b"anything").decode()
    profile["osProfile"]["customData"] = base64.b64encode(
        ("#cloud-config\n" + yaml.safe_dump(cloud)).encode()
    ).decode()
    (finding,) = findings(rule, doc, dev_config)
    assert {"runcmd": "bootstrap token", "key file": "private key", "user data": "user data"}[
        where
    ] in finding.message


def test_apiserver_rule_rejects_a_configured_even_count(
    dev_doc: dict[str, Any], dev_config: policy.RuleConfig
) -> None:
    found = findings(
        RULES["topology-apiserver-count"], dev_doc, dataclasses.replace(dev_config, apiserver_count=4)
    )
    assert any("odd" in f.message for f in found)
