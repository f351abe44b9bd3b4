"""Monitoring: what the cluster's Prometheus shards would load, reviewed like the rest of the change.
Every alert has a promtool test where it fires and one where it stays quiet, and every scrape job
says why it drops what it drops (or why it needs no drop rule): at 7,500 nodes an unreviewed job
is how a series explosion gets in."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import yaml

from superkube.cluster.monitoring import DROPS_COMMENT, REVIEWED_COMMENT
from superkube.model.policy import Finding, Rule, RuleConfig, StackView


def _bundle(config: RuleConfig) -> Mapping[str, Any] | None:
    return config.monitoring if config.monitoring.get("prometheus") else None


def _no_bundle() -> Finding:
    return Finding(
        "no monitoring configuration to review: check a stack (or a plan with its policy config), not bare resources"
    )


def _load(text: str, what: str) -> tuple[Any, Finding | None]:
    try:
        return yaml.safe_load(text), None
    except yaml.YAMLError as e:
        return None, Finding(f"{what} is not YAML: {str(e).splitlines()[0]}")


def _alerts(rules: Any) -> list[str]:
    groups = rules.get("groups") if isinstance(rules, Mapping) else None
    return [
        str(rule["alert"])
        for group in groups or []
        for rule in (group.get("rules") or [])
        if isinstance(rule, Mapping) and "alert" in rule
    ]


def _alert_cases(tests: Mapping[str, Any]) -> tuple[set[str], set[str]]:
    """Alerts with a case where they fire, and alerts with a case where they stay quiet."""
    fires: set[str] = set()
    quiet: set[str] = set()
    for doc in tests.values():
        for test in (doc or {}).get("tests") or []:
            for case in test.get("alert_rule_test") or []:
                name = str(case.get("alertname", ""))
                (fires if case.get("exp_alerts") else quiet).add(name)
    return fires, quiet


def _alerts_tested(view: StackView, config: RuleConfig) -> Iterator[Finding]:
    bundle = _bundle(config)
    if bundle is None:
        yield _no_bundle()
        return
    rules, problem = _load(str(bundle.get("rules", "")), "the alert rules")
    if problem:
        yield problem
        return
    tests: dict[str, Any] = {}
    for name, text in (bundle.get("rule_tests") or {}).items():
        tests[name], problem = _load(str(text), f"rule test file {name}")
        if problem:
            yield problem
            return
    fires, quiet = _alert_cases(tests)
    for alert in _alerts(rules):
        missing = [what for what, seen in (("fires", fires), ("stays quiet", quiet)) if alert not in seen]
        if missing:
            yield Finding(
                f"alert {alert} has no promtool test case where it {' and none where it '.join(missing)}"
            )


def _job_blocks(text: str) -> Iterator[tuple[str, list[str], str]]:
    """Each scrape job of a rendered prometheus.yml: its name, its lines, and the comment above it."""
    lines = text.splitlines()
    starts = [i for i, line in enumerate(lines) if line.lstrip().startswith("- job_name:")]
    for n, start in enumerate(starts):
        end = starts[n + 1] if n + 1 < len(starts) else len(lines)
        block = lines[start:end]
        # the job ends where the next top-level key starts
        for i, line in enumerate(block[1:], 1):
            if line and not line.startswith((" ", "-", "#")):
                block = block[:i]
                break
        above = lines[start - 1].strip() if start else ""
        name = block[0].split("job_name:", 1)[1].strip().strip("'\"")
        yield name, block, above


def _key(line: str) -> str:
    """A line of YAML without its indent and list dash: `- action: drop` and `action: drop` alike."""
    return line.strip().removeprefix("- ").strip()


def _entry_start(line: str) -> bool:
    """A list item that is a mapping (`- regex: ...`), not a list of strings (`- __name__`)."""
    stripped = line.strip()
    return stripped.startswith("- ") and ":" in stripped


def _drop_rules_unexplained(block: list[str]) -> list[str]:
    """The regexes of a job's drop rules with no reason comment directly above them."""
    unexplained = []
    for i, line in enumerate(block):
        if _key(line) != "action: drop":
            continue
        start = i
        while start > 0 and not _entry_start(block[start]):
            start -= 1
        indent = len(block[start]) - len(block[start].lstrip(" -"))
        end = start + 1
        while (
            end < len(block)
            and not _entry_start(block[end])
            and len(block[end]) - len(block[end].lstrip(" ")) >= indent
        ):
            end += 1
        entry = list(enumerate(block[start:end], start))
        regex = [(j, _key(text)) for j, text in entry if _key(text).startswith("regex:")]
        if not regex:
            unexplained.append("every series (a drop rule without a regex)")
            continue
        j, text = regex[0]
        if not block[j - 1].strip().startswith(DROPS_COMMENT.strip()):
            unexplained.append(text.removeprefix("regex:").strip())
    return unexplained


def _jobs_reviewed(view: StackView, config: RuleConfig) -> Iterator[Finding]:
    bundle = _bundle(config)
    if bundle is None:
        yield _no_bundle()
        return
    for shard, text in enumerate(bundle["prometheus"]):
        for name, block, above in _job_blocks(str(text)):
            drops = [line for line in block if _key(line) == "action: drop"]
            if not drops and not above.startswith(REVIEWED_COMMENT.strip()):
                yield Finding(
                    f"prometheus-{shard}.yml: scrape job {name} drops nothing and says nowhere why it needs no drop rule"
                )
            for regex in _drop_rules_unexplained(block):
                yield Finding(f"prometheus-{shard}.yml: scrape job {name} drops {regex} without a reason")


RULES = [
    Rule(
        "monitoring-alerts-tested",
        "high",
        "Every alert has a promtool test case where it fires and one where it stays quiet.",
        "Add alert_rule_test cases for the alert to data/monitoring/tests/ (a firing one with exp_alerts, "
        "a quiet one with exp_alerts: []); run promtool test rules on them.",
        _alerts_tested,
    ),
    Rule(
        "monitoring-scrape-jobs-reviewed",
        "medium",
        "Every scrape job says why it drops each series it drops, or why it needs no drop rule.",
        "Give the job's drop rules a reason (superkube.cluster.monitoring.DROP) or the job a `reviewed` reason "
        "(superkube.cluster.monitoring.jobs).",
        _jobs_reviewed,
    ),
]
