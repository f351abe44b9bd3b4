"""Monitoring rules: the shipped configuration passes; an alert without a firing or a quiet test, a
drop rule without its reason and a job that says nothing about drops each fail with one line."""

from __future__ import annotations

import copy
import re
from collections.abc import Callable
from typing import Any

import pytest
import yaml

from policies.rules import ALL_RULES
from policies.rules import monitoring as monitoring_rules
from superkube.model import policy
from superkube.plan import checks
from superkube.plan.engine import Plan

Bundle = dict[str, Any]
MONITORING = {r.name for r in monitoring_rules.RULES}


@pytest.fixture(scope="module")
def flagship(flagship_plan: Plan) -> tuple[dict[str, Any], policy.RuleConfig]:
    return flagship_plan.to_dict(), checks.rule_config(flagship_plan.spec, flagship_plan.addresses)


def findings(doc: dict[str, Any], config: policy.RuleConfig) -> dict[str, list[str]]:
    report = checks.evaluate(checks.view_from_plan_document(doc), ALL_RULES, config)
    out: dict[str, list[str]] = {}
    for v in report.violations:
        out.setdefault(v.rule, []).append(v.message)
    return out


def with_bundle(config: policy.RuleConfig, change: Callable[[Bundle], None]) -> policy.RuleConfig:
    bundle = copy.deepcopy(dict(config.monitoring))
    change(bundle)
    return policy.RuleConfig.from_dict({**config.to_dict(), "monitoring": bundle})


def drop_cases(alert: str, firing: bool) -> Callable[[Bundle], None]:
    """Remove every test case of `alert` that fires (or every one that stays quiet)."""

    def change(bundle: Bundle) -> None:
        for name, text in bundle["rule_tests"].items():
            doc = yaml.safe_load(text)
            for test in doc["tests"]:
                test["alert_rule_test"] = [
                    c
                    for c in test.get("alert_rule_test", [])
                    if not (c["alertname"] == alert and bool(c.get("exp_alerts")) == firing)
                ]
            bundle["rule_tests"][name] = yaml.safe_dump(doc)

    return change


def add_alert(bundle: Bundle) -> None:
    rules = yaml.safe_load(bundle["rules"])
    rules["groups"][0]["rules"].append({"alert": "GPUFellOffTheBus", "expr": "up == 0", "for": "5m"})
    bundle["rules"] = yaml.safe_dump(rules)


def unexplained_drop(bundle: Bundle) -> None:
    # the reason above the first drop rule of the node-exporter job disappears, in every shard
    bundle["prometheus"] = [
        re.sub(r"\n *# drops: per-CPU guest time[^\n]*", "", text, count=1) for text in bundle["prometheus"]
    ]


def unreviewed_job(bundle: Bundle) -> None:
    bundle["prometheus"] = [re.sub(r"\n# reviewed: [^\n]*", "", text) for text in bundle["prometheus"]]


def new_job_without_drops(bundle: Bundle) -> None:
    extra = "- job_name: gpu-exporter\n  static_configs:\n  - targets: ['10.0.0.1:9400']\n"
    bundle["prometheus"] = [
        text.replace("scrape_configs:\n", f"scrape_configs:\n{extra}") for text in bundle["prometheus"]
    ]


def regex_after_action(bundle: Bundle) -> None:
    # written by hand, action first: the rule still finds the regex and its missing reason
    extra = "- job_name: by-hand\n  metric_relabel_configs:\n  - action: drop\n    regex: gpu_.*\n"
    bundle["prometheus"] = [
        text.replace("scrape_configs:\n", f"scrape_configs:\n{extra}") for text in bundle["prometheus"]
    ]


def drop_everything(bundle: Bundle) -> None:
    extra = "- job_name: greedy\n  metric_relabel_configs:\n  - action: drop\n"
    bundle["prometheus"] = [
        text.replace("scrape_configs:\n", f"scrape_configs:\n{extra}") for text in bundle["prometheus"]
    ]


CASES: list[tuple[str, Callable[[Bundle], None], str, str]] = [
    (
        "an alert whose firing case is gone",
        drop_cases("EtcdNoLeader", True),
        "monitoring-alerts-tested",
        "alert EtcdNoLeader has no promtool test case where it fires",
    ),
    (
        "an alert whose quiet case is gone",
        drop_cases("PreflightFailures", False),
        "monitoring-alerts-tested",
        "alert PreflightFailures has no promtool test case where it stays quiet",
    ),
    (
        "a new alert with no test",
        add_alert,
        "monitoring-alerts-tested",
        "alert GPUFellOffTheBus has no promtool test case where it fires and none where it stays quiet",
    ),
    (
        "a drop rule without its reason",
        unexplained_drop,
        "monitoring-scrape-jobs-reviewed",
        "prometheus-0.yml: scrape job node-exporter drops node_(cpu_guest_seconds_total|softnet_.*) without a reason",
    ),
    (
        "a job that drops nothing and says nothing",
        unreviewed_job,
        "monitoring-scrape-jobs-reviewed",
        "prometheus-0.yml: scrape job node-agents drops nothing and says nowhere why it needs no drop rule",
    ),
    (
        "a hand-added job",
        new_job_without_drops,
        "monitoring-scrape-jobs-reviewed",
        "prometheus-0.yml: scrape job gpu-exporter drops nothing and says nowhere why it needs no drop rule",
    ),
    (
        "a drop rule written action first",
        regex_after_action,
        "monitoring-scrape-jobs-reviewed",
        "prometheus-0.yml: scrape job by-hand drops gpu_.* without a reason",
    ),
    (
        "a drop rule with no regex drops every series",
        drop_everything,
        "monitoring-scrape-jobs-reviewed",
        "prometheus-0.yml: scrape job greedy drops every series (a drop rule without a regex) without a reason",
    ),
]


def test_the_shipped_monitoring_passes_on_every_shard(
    flagship: tuple[dict[str, Any], policy.RuleConfig],
) -> None:
    doc, config = flagship
    assert len(config.monitoring["prometheus"]) == 8  # the flagship's shards, each reviewed
    assert set(findings(doc, config)) & MONITORING == set()


@pytest.mark.parametrize(("change", "rule", "message"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_one_change_fires_its_rule_with_one_line(
    change: Callable[[Bundle], None],
    rule: str,
    message: str,
    flagship: tuple[dict[str, Any], policy.RuleConfig],
) -> None:
    doc, config = flagship
    got = findings(doc, with_bundle(config, change))
    assert set(got) & MONITORING == {rule}
    assert message in got[rule], got[rule]


def test_every_monitoring_rule_has_a_case() -> None:
    assert {c[2] for c in CASES} == MONITORING


def test_bare_resources_say_there_is_nothing_to_review(
    flagship: tuple[dict[str, Any], policy.RuleConfig],
) -> None:
    doc, config = flagship
    bare = policy.RuleConfig.from_dict({**config.to_dict(), "monitoring": {}})
    got = findings(doc, bare)
    assert set(got) & MONITORING == MONITORING
    assert all("no monitoring configuration to review" in m for r in MONITORING for m in got[r])


def test_the_policy_pack_config_carries_the_bundle(
    flagship: tuple[dict[str, Any], policy.RuleConfig],
) -> None:
    _, config = flagship
    again = policy.RuleConfig.from_dict(config.to_dict())
    assert again.monitoring == config.monitoring
