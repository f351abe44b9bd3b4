"""Jobs and teams rules: the flagship plan (three teams, one of them `any`, and the webhook) passes;
one changed field makes exactly the expected rule fire. MPIJobs are not in a cluster's plan, so the
MPIJob rule is shown on a rendered job added to it, as a stack that deploys jobs through Pulumi has."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest
import yaml

from policies.rules import jobs as job_rules
from superkube.cluster import jobs
from superkube.model import policy
from superkube.plan import checks
from superkube.plan.engine import Plan
from tests.conftest import ROOT
from tests.policies.test_platform import fired

Doc = dict[str, Any]
RULES = {r.name for r in job_rules.RULES}


def inputs(doc: Doc, kind: str) -> list[dict[str, Any]]:
    return [
        r["inputs"]
        for r in doc["resources"]
        if r["type"].startswith("kubernetes:") and r["inputs"].get("kind") == kind
    ]


def teams_config(doc: Doc) -> dict[str, Any]:
    (cm,) = [c for c in inputs(doc, "ConfigMap") if c["metadata"]["name"] == "superkube-teams"]
    return cm


def set_teams(tuples: list[dict[str, Any]]) -> Callable[[Doc], None]:
    return lambda doc: teams_config(doc)["data"].__setitem__("teams.yaml", yaml.safe_dump(tuples))


def webhook(doc: Doc) -> dict[str, Any]:
    """The team webhook's entry for namespaces of no team (the last: one per team comes first)."""
    hook: dict[str, Any] = inputs(doc, "MutatingWebhookConfiguration")[0]["webhooks"][-1]
    assert hook["name"] == "teams.superkube.io"
    return hook


def with_job(change: Callable[[dict[str, Any]], None]) -> Callable[[Doc], None]:
    def mutate(doc: Doc) -> None:
        job = copy.deepcopy(JOB)  # rendered for the flagship by the fixture below
        change(job)
        doc["resources"].append(
            {
                "urn": "urn:pulumi:flagship::superkube::kubernetes:kubeflow.org/v2beta1:MPIJob::job",
                "name": "job",
                "type": "kubernetes:kubeflow.org/v2beta1:MPIJob",
                "custom": True,
                "inputs": job,
            }
        )

    return mutate


def drop_worker_label(job: dict[str, Any]) -> None:
    job["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["metadata"]["labels"].pop(
        "scheduling.x-k8s.io/pod-group"
    )


JOB: dict[str, Any] = {}
ANY_GPU = {"selector": {"superkube.io/pool": "gpu"}, "team": "any", "priority": 100}

CASES: list[tuple[str, Callable[[Doc], None], str]] = [
    (
        # (the pool stays any's, as its node template says, so only the overlap is wrong)
        "two teams on one pool",
        set_teams(
            [
                ANY_GPU,
                {"selector": {"superkube.io/pool": "gpu"}, "team": "research", "priority": 0},
                {"selector": {"superkube.io/pool": "gpu"}, "team": "pretraining", "priority": 5},
            ]
        ),
        "platform-teams-no-overlap",
    ),
    (
        "a rack of one team inside another team's pool",
        set_teams(
            [
                ANY_GPU,
                {"selector": {"superkube.io/pool": "gpu"}, "team": "research", "priority": 0},
                {
                    "selector": {"superkube.io/pool": "gpu", "superkube.io/rack-group": "a"},
                    "team": "pretraining",
                    "priority": 5,
                },
            ]
        ),
        "platform-teams-no-overlap",
    ),
    (
        "the GPU pool made a team's while its template says any",
        set_teams([{"selector": {"superkube.io/pool": "gpu"}, "team": "research", "priority": 0}]),
        "platform-team-taint-in-node-template",
    ),
    (
        "a CPU pool made a team's while its template has no team taint",
        set_teams(
            [
                {"selector": {"superkube.io/pool": "gpu"}, "team": "any", "priority": 0},
                {"selector": {"superkube.io/role": "cpu"}, "team": "research", "priority": 5},
            ]
        ),
        "platform-team-taint-in-node-template",
    ),
    (
        "a worker template without its pod-group label",
        with_job(drop_worker_label),
        "platform-mpijob-pod-group",
    ),
    (
        "a gang smaller than the job",
        with_job(lambda j: j["spec"]["runPolicy"]["schedulingPolicy"].__setitem__("minAvailable", 4)),
        "platform-mpijob-pod-group",
    ),
    (
        "a webhook without a namespace selector",
        lambda d: webhook(d).pop("namespaceSelector"),
        "platform-webhook-excludes-kube-system",
    ),
    (
        "a webhook whose exclusions leave kube-system in",
        lambda d: webhook(d)["namespaceSelector"]["matchExpressions"][0].__setitem__(
            "values", ["kube-public"]
        ),
        "platform-webhook-excludes-kube-system",
    ),
    (
        "a webhook that selects kube-system by name",
        lambda d: webhook(d).__setitem__(
            "namespaceSelector", {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}}
        ),
        "platform-webhook-excludes-kube-system",
    ),
]


@pytest.fixture(scope="module")
def flagship(flagship_plan: Plan) -> tuple[Doc, policy.RuleConfig]:
    job = jobs.render(jobs.load(ROOT / "examples/jobs/borrowing.yaml"), flagship_plan.spec)
    JOB.clear()
    JOB.update(job)
    return flagship_plan.to_dict(), checks.rule_config(flagship_plan.spec, flagship_plan.addresses)


def test_the_flagship_and_a_rendered_job_pass(flagship: tuple[Doc, policy.RuleConfig]) -> None:
    doc, config = flagship
    assert inputs(doc, "MutatingWebhookConfiguration") and teams_config(doc)
    changed = copy.deepcopy(doc)
    with_job(lambda j: None)(changed)
    assert fired(changed, config) == set()


@pytest.mark.parametrize(("mutate", "rule"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_one_change_fires_its_rule(
    mutate: Callable[[Doc], None], rule: str, flagship: tuple[Doc, policy.RuleConfig]
) -> None:
    doc, config = flagship
    changed = copy.deepcopy(doc)
    mutate(changed)
    got = fired(changed, config)
    assert got == {rule}, sorted(got)


def test_every_rule_has_a_case() -> None:
    assert {c[2] for c in CASES} == RULES


def test_the_rule_says_what_the_spec_says(flagship: tuple[Doc, policy.RuleConfig]) -> None:
    """platform-teams-no-overlap and the spec run one check (superkube.model.teams.problems): what the
    one refuses the other does, with one fix, so the advice `plan` gives is what `check` accepts."""
    from superkube.model import teams
    from superkube.model.spec import SpecError, from_config
    from tests.conftest import dev_config

    tuples = [
        {"selector": {"superkube.io/pool": "gpu"}, "team": "research", "priority": 0},
        {"selector": {"superkube.io/pool": "gpu"}, "team": "pretraining", "priority": 5},
    ]
    doc, config = flagship
    changed = copy.deepcopy(doc)
    set_teams(tuples)(changed)
    findings = [
        f.message for f in job_rules._teams_no_overlap(checks.view_from_plan_document(changed), config)
    ]
    where = findings[0].partition("[")[0]
    assert findings == teams.problems(teams.parse(tuples, checked=False), where)
    stack = {k.partition(":")[2]: v for k, v in dev_config().items()}
    with pytest.raises(SpecError) as refused:
        from_config({**stack, "teams": yaml.safe_dump(tuples)})
    assert refused.value.fix == teams.OVERLAP_FIX and findings[0].endswith(f"; {teams.OVERLAP_FIX}")
