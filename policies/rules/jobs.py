"""Jobs and teams: team capacity that says whose each node is, MPIJobs that run as one gang, and
admission webhooks that can never stand between a system pod and its node."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import yaml

from policies.rules.compute import VMSS
from policies.rules.platform import _dig, _kind, _name, _objects
from superkube.cluster import autoscaling, jobs
from superkube.cluster.kube import NAMESPACE_NAME_LABEL
from superkube.model import teams
from superkube.model.policy import Finding, Rule, RuleConfig, StackView
from superkube.model.spec import PREFLIGHT_TAINT_KEY

SYSTEM_NAMESPACE = "kube-system"
WEBHOOK_KINDS = ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration")


def _team_configs(view: StackView) -> Iterator[tuple[Any, str, Any]]:
    """(resource, key, loaded tuples) of every ConfigMap that carries a teams file."""
    for r in _objects(view):
        if _kind(r) != "ConfigMap":
            continue
        data = r.props.get("data") or {}
        if isinstance(data, Mapping) and teams.CONFIG_FILE in data:
            yield r, teams.CONFIG_FILE, data[teams.CONFIG_FILE]


def _teams_no_overlap(view: StackView, config: RuleConfig) -> Iterator[Finding]:
    for r, key, text in _team_configs(view):
        where = f"{_name(r)}:{key}"
        try:
            tuples = teams.parse(yaml.safe_load(str(text)), where, checked=False)
        except (yaml.YAMLError, teams.TeamsError) as e:
            yield Finding(f"{_name(r)}: the teams file cannot be read: {str(e).splitlines()[0]}", r.urn)
            continue
        # the spec refuses the same tuples when the stack is planned (superkube.model.teams.problems)
        for problem in teams.problems(tuples, where):
            yield Finding(problem, r.urn)


def _template_team(view: StackView, config: RuleConfig) -> Iterator[Finding]:
    """Each autoscaled scale set's node template carries the team taint the teams ConfigMap gives
    nodes with the template's labels (by the tuples those labels decide): the autoscaler plans
    pending pods onto new nodes from the template, and the reconciler taints the real ones."""
    label = autoscaling.template_tag("label", "")
    taint = autoscaling.template_tag("taint", teams.TEAM_KEY)
    # the preflight label changes once a node passes: no team may depend on it
    preflight = autoscaling.template_tag("label", PREFLIGHT_TAINT_KEY)
    for r, key, text in _team_configs(view):
        try:
            tuples = teams.parse(yaml.safe_load(str(text)), f"{_name(r)}:{key}")
        except (yaml.YAMLError, teams.TeamsError):
            continue  # platform-teams-no-overlap reports a file it cannot read
        for vmss in view.of_type(VMSS):
            tags = vmss.tags
            if not autoscaling.is_autoscaled(tags):
                continue
            # the template's labels and each selector, both in the tags' encoding ('/' as '_')
            labels = {
                k.removeprefix(label): v for k, v in tags.items() if k.startswith(label) and k != preflight
            }
            encoded = [
                t.model_copy(update={"selector": {autoscaling.template_tag("label", k).removeprefix(label): v
                                                  for k, v in t.selector.items()}})
                for t in tuples
            ]  # fmt: skip
            team = teams.template_owner(encoded, labels)
            want = f"{team}:{teams.TAINT_EFFECT}" if team else None
            if tags.get(taint) != want:
                gives = f"{teams.TEAM_KEY}={want}" if want else "no team taint"
                yield Finding(
                    f"scale set {vmss.name}: its node template's team taint is {tags.get(taint) or 'none'}, "
                    f"but {_name(r)} gives its nodes {gives}: the autoscaler would plan pods onto nodes "
                    "that then carry another taint",
                    vmss.urn,
                )


def _mpijob_pod_group(view: StackView, config: RuleConfig) -> Iterator[Finding]:
    for r in _objects(view):
        if _kind(r) != "MPIJob":
            continue
        obj = {"metadata": r.props.get("metadata") or {}, "spec": r.props.get("spec") or {}}
        for problem in jobs.pod_group_problems(obj):
            yield Finding(f"MPIJob {_name(r)}: {problem}", r.urn)


def excludes_kube_system(selector: Any) -> bool:
    """True when a namespaceSelector can never select kube-system (by its immutable name label)."""
    if not isinstance(selector, Mapping):
        return False
    labels = selector.get("matchLabels") or {}
    if NAMESPACE_NAME_LABEL in labels:
        return labels[NAMESPACE_NAME_LABEL] != SYSTEM_NAMESPACE
    for expr in selector.get("matchExpressions") or []:
        if not isinstance(expr, Mapping) or expr.get("key") != NAMESPACE_NAME_LABEL:
            continue
        values = list(expr.get("values") or [])
        if expr.get("operator") == "NotIn" and SYSTEM_NAMESPACE in values:
            return True
        if expr.get("operator") == "In" and SYSTEM_NAMESPACE not in values:
            return True
    return False


def _webhooks_exclude_system(view: StackView, config: RuleConfig) -> Iterator[Finding]:
    for r in _objects(view):
        if _kind(r) not in WEBHOOK_KINDS:
            continue
        for hook in r.props.get("webhooks") or []:
            if not excludes_kube_system(_dig(hook, "namespaceSelector")):
                yield Finding(
                    f"{_kind(r)} {_name(r)}: webhook {hook.get('name')} can be called for {SYSTEM_NAMESPACE} pods",
                    r.urn,
                )


RULES = [
    Rule(
        "platform-teams-no-overlap",
        "high",
        "No two teams' capacity tuples can select the same nodes, unless one of them is the borrowable team any "
        "(at another priority).",
        f"{teams.OVERLAP_FIX[0].upper()}{teams.OVERLAP_FIX[1:]}; against any at one priority, "
        f"{teams.ANY_PRIORITY_FIX}.",
        _teams_no_overlap,
    ),
    Rule(
        "platform-team-taint-in-node-template",
        "high",
        "Every autoscaled scale set's node template carries the team taint the teams configuration gives its nodes, as they register with it.",
        "Plan the stack again (the pool's team comes from superkube:teams), or give the pool the label its team's tuple selects on.",
        _template_team,
    ),
    Rule(
        "platform-mpijob-pod-group",
        "high",
        "Every MPIJob's launcher and worker templates carry the pod-group label naming the job, and minAvailable covers launcher + workers.",
        "Render jobs with `superkube job render`, or add scheduling.x-k8s.io/pod-group: <job name> to each template's labels.",
        _mpijob_pod_group,
    ),
    Rule(
        "platform-webhook-excludes-kube-system",
        "critical",
        "Every admission webhook's namespaceSelector leaves kube-system out, so a webhook outage never blocks a system pod.",
        "Add {key: kubernetes.io/metadata.name, operator: NotIn, values: [kube-system, ...]} to the webhook's namespaceSelector.",
        _webhooks_exclude_system,
    ),
]
