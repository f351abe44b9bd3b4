"""policies/__main__.py builds a real PolicyPack of every rule; its validations run on real SDK objects.

Constructing a PolicyPack starts the policy server, so PolicyPack itself is replaced by a recorder;
the policies, enforcement levels, severities and the validation callbacks are the real ones.
"""

from __future__ import annotations

import copy
import runpy
from pathlib import Path
from typing import Any

import pulumi_policy
import pytest
from pulumi_policy.policy import PolicyResource, PolicyResourceOptions, StackValidationArgs

from policies.rules import ALL_RULES
from superkube.plan import checks
from superkube.plan.engine import Plan
from tests.policies import mutations as m


@pytest.fixture(scope="module")
def pack(root: Path) -> dict[str, Any]:
    captured: dict[str, Any] = {}

    class Recorder:
        def __init__(self, **kwargs: Any) -> None:
            captured.update(kwargs)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(pulumi_policy, "PolicyPack", Recorder)
        runpy.run_path(str(root / "policies" / "__main__.py"), run_name="__main__")
    return captured


def policy_resources(doc: dict[str, Any]) -> list[PolicyResource]:
    opts = PolicyResourceOptions(
        protect=False,
        ignore_changes=[],
        delete_before_replace=None,
        aliases=[],
        additional_secret_outputs=[],
        custom_timeouts=None,
        parent=None,
    )
    return [
        PolicyResource(r["type"], r["inputs"], r["urn"], r["name"], opts, None, None, [], {})
        for r in doc["resources"]
    ]


def test_pack_has_every_rule_as_a_stack_policy(pack: dict[str, Any]) -> None:
    assert pack["name"] == "superkube"
    policies = pack["policies"]
    assert [p.name for p in policies] == [r.name for r in ALL_RULES]
    for policy, rule in zip(policies, ALL_RULES, strict=True):
        assert isinstance(policy, pulumi_policy.StackValidationPolicy)
        assert policy.severity.value == rule.severity
        assert policy.enforcement_level.value == rule.enforcement
        assert policy.remediation_steps == rule.remediation


def test_pack_validations_report_through_crossguard(pack: dict[str, Any], flagship_plan: Plan) -> None:
    doc = flagship_plan.to_dict()
    policies = {p.name: p for p in pack["policies"]}
    # the config `superkube policy-config` writes: the cross-layer rules need the stack's inventory
    config = checks.rule_config(flagship_plan.spec, flagship_plan.addresses).to_dict()

    def run(name: str, document: dict[str, Any]) -> list[tuple[str, str | None]]:
        reported: list[tuple[str, str | None]] = []
        args = StackValidationArgs(policy_resources(document), config)
        policies[name].validate(args, lambda message, urn=None: reported.append((message, urn)))
        return reported

    assert all(run(name, doc) == [] for name in policies)
    changed = copy.deepcopy(doc)
    m.add_public_ip(changed)
    ((message, urn),) = run("network-nic-no-public-ip", changed)
    assert "public IP" in message and urn and "NetworkInterface" in urn
