"""policies/__main__.py builds a real PolicyPack of every rule; its validations run on real SDK objects.

Constructing a PolicyPack starts the policy server, so PolicyPack itself is replaced by a recorder;
the policies, enforcement levels, severities and the validation callbacks are the real ones.
"""

from __future__ import annotations

import copy
import json
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


def test_pack_judges_what_the_real_engine_hands_it_as_it_judges_the_plan(
    pack: dict[str, Any], flagship_plan: Plan
) -> None:
    """Under the real engine a stack policy gets each resource's outputs behind read-only proxies
    (not dicts and lists), and an object that exists comes back as the API server holds it: its status
    and server-written metadata beside what was declared, a CRD schema's x-kubernetes-* keys spelt
    x_kubernetes_*; and the config's whole numbers arrive as floats (bench/pulumi_up.py found each)."""
    from pulumi_policy.proxy import unknown_checking_proxy

    doc = flagship_plan.to_dict()
    for r in doc["resources"]:
        if r["type"].startswith("kubernetes:"):
            r["inputs"]["status"] = {"observedGeneration": 1, "conditions": [{"type": "Ready"}]}
            meta = r["inputs"].setdefault("metadata", {})
            meta.update(uid="0-1", resourceVersion="7", creationTimestamp="2026-01-01T00:00:00Z")
            meta["managedFields"] = [{"manager": "pulumi-kubernetes", "operation": "Apply"}]
            r["inputs"] = json.loads(json.dumps(r["inputs"]).replace('"x-kubernetes-', '"x_kubernetes_'))
        r["inputs"] = unknown_checking_proxy(r["inputs"])
    policies = {p.name: p for p in pack["policies"]}
    config = checks.rule_config(flagship_plan.spec, flagship_plan.addresses).to_dict()
    # through a protobuf Struct every number of the config is a float
    config = json.loads(json.dumps(config), parse_int=float)
    reported: dict[str, list[str]] = {}
    for name, policy in policies.items():
        args = StackValidationArgs(policy_resources(doc), config)
        policy.validate(
            args, lambda message, urn=None, name=name: reported.setdefault(name, []).append(message)
        )
    assert reported == {}
