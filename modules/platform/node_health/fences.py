"""The admission fences: ValidatingAdmissionPolicies that hold each agent's service account to
its own node (and the controller, remediation and evictions to what they may change), in CEL."""

from __future__ import annotations

from dataclasses import dataclass

from modules.platform import objects
from modules.platform.foundation import NAMESPACE
from modules.platform.node_health.facts import (
    COMPONENT,
    CONTROLLER_FENCE,
    FENCE,
    GPU_RESET,
    GPU_RESET_FENCE,
    GPU_TEST,
    GPU_TEST_FENCE,
    HEALTH,
    HEALTH_CONTROLLER,
    HEALTH_EVICTION_FENCE,
    HEALTH_FENCE,
    LEDGER_NAMESPACE,
    PREFLIGHT,
    PROTECTED_NAMESPACES,
    REMEDIATION_FENCE_NAME,
    Fenced,
)
from modules.platform.objects import Manifest
from superkube.cluster import autoscaling, health, remediation
from superkube.model.spec import PREFLIGHT_RESULT_ANNOTATION, PREFLIGHT_TAINT_KEY


def _or_empty(path: str, empty: str) -> str:
    return f"(has({path}) ? {path} : {empty})"


@dataclass(frozen=True)
class Fence:
    policy: str
    account: str
    who: str
    removable: str | None
    """the taint and label it may remove (preflight's own), if any"""
    annotations: tuple[str, ...]
    """the annotations it may set"""
    may_cordon: bool = False
    """it may cordon (never uncordon) its node"""
    own_node: bool = True
    """only the node its pod runs on (by its token's node name)"""
    only_if: tuple[str, str] = ("", "")
    """a further condition on the node before the change (CEL over oldObject), and its message"""
    label: str | None = None
    """a label it may add (with the value RESET_REQUESTED) or remove, and no other"""
    uncordon_if: str = ""
    """CEL over oldObject under which it may uncordon (a cordoner only); its own annotations may then
    go in the same request"""
    extra: tuple[tuple[str, str], ...] = ()
    """further rules: (CEL over oldObject and object, what it may not do)"""
    drops_own: bool = False
    """it may take its own annotations away (the health agent: the maintenance's start, once over)"""


def _note(key: str) -> str:
    """CEL: the old node's annotation `key` ('' when it has none)."""
    notes = "oldObject.metadata.annotations"
    return f"((has({notes}) && '{key}' in {notes}) ? {notes}['{key}'] : '')"


def _reset_since_cordon(outcome: str) -> str:
    """CEL: the node's GPU reset ended in `outcome` (cleared, failed) no earlier than its cordon: an
    outcome from before the cordon is history (the time follows "<outcome> ", 20 characters)."""
    value, start = _note(health.GPU_RESET), len(outcome) + 1
    return (
        f"({value}.startsWith('{outcome} ') && {value}.size() >= {start + 20} && "
        f"{value}.substring({start}, {start + 20}) >= {_note(health.CORDONED_AT)})"
    )


RESET_CLEARED = _reset_since_cordon("cleared")
RESET_FAILED = _reset_since_cordon("failed")
CORDONED = "(has(object.spec.unschedulable) && object.spec.unschedulable)"
WAS_CORDONED = "(has(oldObject.spec.unschedulable) && oldObject.spec.unschedulable)"
REPORTED_FATAL = f"{_note(health.VERDICT)}.startsWith('fatal')"
REPORTED_MAINTENANCE = f"{_note(health.VERDICT)}.startsWith('{health.MAINTENANCE}')"
FOR_MAINTENANCE = f"({_note(health.CORDON_KIND)} == '{health.MAINTENANCE}' && {WAS_CORDONED})"
"""CEL: the node's cordon by health is maintenance's (Azure's scheduled event), not a failure's"""
MAINTENANCE_OVER = (
    f"({FOR_MAINTENANCE} && !{REPORTED_FATAL} && !{REPORTED_MAINTENANCE} && "
    f"{_note(health.VERDICT_AT)} >= {_note(health.CORDONED_AT)})"
)
"""CEL: a node cordoned for maintenance whose agent, since the cordon, reports neither maintenance
nor a failure: the event is over, and the controller may uncordon it"""


def _labelled(obj: str) -> str:
    """CEL: `obj` (object, oldObject) carries the reset label with the value that asks for a reset."""
    labels = f"{obj}.metadata.labels"
    key = health.GPU_RESET_LABEL
    return f"(has({labels}) && '{key}' in {labels} && {labels}['{key}'] == '{health.RESET_REQUESTED}')"


def _new_note(key: str) -> str:
    notes = "object.metadata.annotations"
    return f"((has({notes}) && '{key}' in {notes}) ? {notes}['{key}'] : '')"


DRAINED_SINCE_CORDON = (
    f"({_note(health.DRAINED_AT)} != '' && {_note(health.DRAINED_AT)} >= {_note(health.CORDONED_AT)})"
)
CONTROLLER_RULES_EXTRA = (
    (
        # the cordon's time is what a reset's outcome is measured against: set only by the cordon
        f"{_new_note(health.CORDONED_AT)} == {_note(health.CORDONED_AT)} || "
        f"(!{WAS_CORDONED} && {CORDONED}) || ({WAS_CORDONED} && !{CORDONED})",
        "may set the cordon's time only in the request that cordons",
    ),
    (
        # a failure's cordon is never made maintenance's (whose node it may uncordon) but by a cordon
        f"{_new_note(health.CORDON_KIND)} == {_note(health.CORDON_KIND)} || "
        f"{_new_note(health.CORDON_KIND)} == '{health.FAILURE}' || "
        f"(!{WAS_CORDONED} && {CORDONED}) || ({WAS_CORDONED} && !{CORDONED})",
        "may make a cordon maintenance's only in the request that cordons",
    ),
    (
        # a reset is asked for once per cordon: of a node it cordoned and drained, reported fatal,
        # whose reset has not ended since the cordon
        f"!(!{_labelled('oldObject')} && {_labelled('object')}) || ({WAS_CORDONED} && {CORDONED} && "
        f"{REPORTED_FATAL} && {DRAINED_SINCE_CORDON} && !{RESET_CLEARED} && !{RESET_FAILED})",
        "may label for a reset only a cordoned, drained node reported fatal whose reset has not ended since",
    ),
)


FENCES: dict[Fenced, Fence] = {
    "preflight": Fence(
        FENCE, PREFLIGHT, "the preflight agent", PREFLIGHT_TAINT_KEY, (PREFLIGHT_RESULT_ANNOTATION,)
    ),
    "gpu-test": Fence(GPU_TEST_FENCE, GPU_TEST, "the periodic GPU test", None, (health.GPU_TEST_RESULT,)),
    "health": Fence(
        HEALTH_FENCE,
        HEALTH,
        "the health agent",
        None,
        (health.VERDICT, health.VERDICT_AT, health.MAINTENANCE_AT),
        drops_own=True,
    ),
    "remediation": Fence(
        REMEDIATION_FENCE_NAME,
        remediation.USER,
        "remediation",
        None,
        (health.REMEDIATION_REQUESTED_AT,),
        own_node=False,
        only_if=(
            f"has(oldObject.metadata.annotations) && '{health.CORDONED}' in oldObject.metadata.annotations "
            f"&& !{FOR_MAINTENANCE}",
            "may change only a node health cordoned for a failure",
        ),
    ),
    "health-controller": Fence(
        CONTROLLER_FENCE,
        HEALTH_CONTROLLER,
        "the health controller",
        None,
        (health.CORDONED, health.CORDONED_AT, health.DRAINED_AT, health.CORDON_KIND),
        may_cordon=True,
        own_node=False,
        only_if=(
            f"{REPORTED_FATAL} || {REPORTED_MAINTENANCE} || {FOR_MAINTENANCE} || {RESET_CLEARED} || "
            f"{RESET_FAILED}",
            "may change only a node its health agent reported fatal or under maintenance, one cordoned "
            "for maintenance, or one whose GPU reset since its cordon has ended",
        ),
        label=health.GPU_RESET_LABEL,
        # the reset it asked for (the label is still there) cleared the GPUs since the cordon, and the
        # agent no longer reports the node fatal; or the maintenance it was cordoned for is over
        uncordon_if=f"({_labelled('oldObject')} && {RESET_CLEARED} && !{REPORTED_FATAL} && !{REPORTED_MAINTENANCE}) "
        f"|| {MAINTENANCE_OVER}",
        extra=CONTROLLER_RULES_EXTRA,
    ),
    "gpu-reset": Fence(
        GPU_RESET_FENCE,
        GPU_RESET,
        "the GPU reset",
        None,
        (health.GPU_RESET,),
        only_if=(
            f"has(oldObject.metadata.labels) && '{health.GPU_RESET_LABEL}' in oldObject.metadata.labels && "
            f"oldObject.metadata.labels['{health.GPU_RESET_LABEL}'] == '{health.RESET_REQUESTED}'",
            "may change only a node the health controller labelled for a reset",
        ),
    ),
}


def fence_validations(agent: Fenced = "preflight") -> list[dict[str, str]]:
    """CEL over the node before (oldObject) and after (object) the agent's change: its own node, no
    taint or label change but removing the one it may remove, no annotation but its own, no uncordon
    (and no cordon but by the health agent)."""
    f = FENCES[agent]
    removable, who = f.removable, f.who
    taints, old_taints = _or_empty("object.spec.taints", "[]"), _or_empty("oldObject.spec.taints", "[]")
    labels, old_labels = (
        _or_empty("object.metadata.labels", "{}"),
        _or_empty("oldObject.metadata.labels", "{}"),
    )
    notes, old_notes = (
        _or_empty("object.metadata.annotations", "{}"),
        _or_empty("oldObject.metadata.annotations", "{}"),
    )
    may_drop_taint = f"t.key == '{removable}' || " if removable else ""
    may_drop_label = f"k == '{removable}' || " if removable else ""
    taint_rule = f"may only remove the {removable} taint" if removable else "may not change taints"
    label_rule = f"may only remove the {removable} label" if removable else "may not change labels"
    may_set_label = ""
    if f.label:
        may_drop_label += f"k == '{f.label}' || "
        may_set_label = f"(k == '{f.label}' && {labels}[k] == '{health.RESET_REQUESTED}') || "
        label_rule = f"may only set the {f.label} label to {health.RESET_REQUESTED} or remove it"
    own = " || ".join(f"k == '{a}'" for a in f.annotations)
    cordoned, was_cordoned = CORDONED, WAS_CORDONED
    # its own annotations may go only with the uncordon it may make
    may_drop_note = f"(({own}) && {was_cordoned} && !{cordoned}) || " if f.uncordon_if else ""
    if f.drops_own:
        may_drop_note = f"({own}) || "
    own_node = {
        "expression": "'authentication.kubernetes.io/node-name' in request.userInfo.extra && "
        "request.userInfo.extra['authentication.kubernetes.io/node-name'] == [object.metadata.name]",
        "message": f"{who} may change only the node its pod runs on",
    }
    condition, why = f.only_if
    rules = [
        *([own_node] if f.own_node else []),
        *([{"expression": condition, "message": f"{who} {why}"}] if condition else []),
        {
            "expression": f"{taints}.all(t, t in {old_taints}) && "
            f"{old_taints}.all(t, {may_drop_taint}t in {taints})",
            "message": f"{who} {taint_rule}",
        },
        {
            "expression": f"{labels}.all(k, {may_set_label}(k in {old_labels} && {old_labels}[k] == {labels}[k])) && "
            f"{old_labels}.all(k, {may_drop_label}k in {labels})",
            "message": f"{who} {label_rule}",
        },
        {
            "expression": f"{notes}.all(k, {own} || (k in {old_notes} && {old_notes}[k] == {notes}[k])) "
            f"&& {old_notes}.all(k, {may_drop_note}k in {notes})",
            "message": f"{who} may only set the {' and '.join(f.annotations)} annotation"
            + ("s" if len(f.annotations) > 1 else ""),
        },
        {
            "expression": " && ".join(
                f"{_or_empty(f'object.metadata.{k}', '[]')} == {_or_empty(f'oldObject.metadata.{k}', '[]')}"
                for k in ("ownerReferences", "finalizers")
            ),
            "message": f"{who} may not change the node's owners or finalizers",
        },
        {
            "expression": (
                f"!{was_cordoned} || {cordoned}" + (f" || ({f.uncordon_if})" if f.uncordon_if else "")
            )
            if f.may_cordon
            else f"{cordoned} == {was_cordoned}",
            "message": (
                f"{who} may cordon, and uncordon only a node whose GPU reset cleared it since its cordon "
                "or whose maintenance is over"
                if f.uncordon_if
                else f"{who} may cordon but never uncordon"
            )
            if f.may_cordon
            else f"{who} may not cordon or uncordon",
        },
        *({"expression": expression, "message": f"{who} {why}"} for expression, why in f.extra),
    ]
    # a denial is 403 Forbidden, as RBAC's would be (a validation's default reason, Invalid, answers 422)
    return [{**rule, "reason": "Forbidden"} for rule in rules]


def _policy(
    name: str, account: str, rule: Manifest, validations: list[dict[str, str]], user: str = ""
) -> list[Manifest]:
    """A ValidatingAdmissionPolicy for one service account's requests (or `user`'s), and its binding."""
    who = user or f"system:serviceaccount:{NAMESPACE}:{account}"
    return [
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingAdmissionPolicy",
            "metadata": objects.meta(name, COMPONENT),
            "spec": {
                "failurePolicy": "Fail",
                "matchConstraints": {"resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"], **rule}]},
                "matchConditions": [
                    {
                        "name": "its-service-account",
                        "expression": f"request.userInfo.username == '{who}'",
                    }
                ],
                "validations": validations,
            },
        },
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingAdmissionPolicyBinding",
            "metadata": objects.meta(name, COMPONENT),
            "spec": {"policyName": name, "validationActions": ["Deny"]},
        },
    ]


def eviction_validations() -> list[dict[str, str]]:
    """What an Eviction the health controller creates may be. An Eviction names a pod, not its node,
    so admission cannot hold it to the pods of nodes it cordoned (it lists only those, by field
    selector); it holds it to workload namespaces and to the pod's own grace period."""
    protected = ", ".join(f"'{n}'" for n in PROTECTED_NAMESPACES)
    rules = [
        {
            # the balloons are the exception: placeholders, which a cordoned node would otherwise keep
            "expression": f"!(request.namespace in [{protected}]) || (request.namespace == '{NAMESPACE}' "
            f"&& request.name.startsWith('{autoscaling.BALLOON_PREFIX}'))",
            "message": f"the health controller may not evict pods of {' or '.join(PROTECTED_NAMESPACES)} "
            "but the balloons",
        },
        {
            "expression": "!has(object.deleteOptions) || !has(object.deleteOptions.gracePeriodSeconds) || "
            "object.deleteOptions.gracePeriodSeconds > 0",
            "message": "the health controller may not shorten a pod's grace period to 0",
        },
    ]
    return [{**rule, "reason": "Forbidden"} for rule in rules]


def remediation_access() -> list[Manifest]:
    """Remediation's user (a host service on the API servers, superkube.agents.remediation): read
    nodes, mark one it asked Azure to delete, delete that Node once its VM is gone; fenced to nodes
    health cordoned, and to its one annotation."""
    name = user = remediation.USER
    cordoned = (
        f"has(oldObject.metadata.annotations) && '{health.CORDONED}' in oldObject.metadata.annotations "
        "&& has(oldObject.spec.unschedulable) && oldObject.spec.unschedulable"
    )
    marked = f"'{health.REMEDIATION_REQUESTED_AT}' in oldObject.metadata.annotations"
    updates = fence_validations("remediation")
    deletes = [
        {"expression": f"{cordoned} && {marked}", "reason": "Forbidden",
         "message": "remediation may delete only a node health cordoned whose VM it asked Azure to delete"},
    ]  # fmt: skip
    return [
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": objects.meta(name, COMPONENT),
            "rules": remediation.NODE_RULES,
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": objects.meta(name, COMPONENT),
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}],
        },
        *_policy(
            REMEDIATION_FENCE_NAME, "", {"operations": ["UPDATE"], "resources": ["nodes"]}, updates, user
        ),
        *_policy(
            f"{REMEDIATION_FENCE_NAME}-delete",
            "",
            {"operations": ["DELETE"], "resources": ["nodes"]},
            deletes,
            user,
        ),
        # its hourly budget, counted in the cluster: one ConfigMap in kube-system, which it may create
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": {**objects.meta(name, COMPONENT), "namespace": LEDGER_NAMESPACE},
            "rules": remediation.LEDGER_RULES,
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {**objects.meta(name, COMPONENT), "namespace": LEDGER_NAMESPACE},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}],
        },
        *_policy(
            f"{REMEDIATION_FENCE_NAME}-ledger",
            "",
            {"operations": ["CREATE"], "resources": ["configmaps"]},
            [
                {
                    "expression": f"request.namespace == '{LEDGER_NAMESPACE}' && object.metadata.name == "
                    f"'{remediation.LEDGER}'",
                    "reason": "Forbidden",
                    "message": f"remediation may create only its ledger, {LEDGER_NAMESPACE}/{remediation.LEDGER}",
                }
            ],
            user,
        ),
    ]


def fence(agent: Fenced = "preflight") -> list[Manifest]:
    """The admission policies and bindings that hold `agent` to fence_validations (its node updates),
    and the health controller also to eviction_validations."""
    f = FENCES[agent]
    nodes = {"operations": ["UPDATE"], "resources": ["nodes"]}
    out = _policy(f.policy, f.account, nodes, fence_validations(agent))
    if agent == "health-controller":
        evictions = {"operations": ["CREATE"], "resources": ["pods/eviction"]}
        out += _policy(HEALTH_EVICTION_FENCE, f.account, evictions, eviction_validations())
    return out
