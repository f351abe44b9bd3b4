"""IAM: what the stack's role assignments may grant."""

from __future__ import annotations

import re
from collections.abc import Iterator

from superkube.cluster import autoscaling, remediation
from superkube.model.policy import Finding, Rule, RuleConfig, StackView

ROLE_ASSIGNMENT = "azure-native:authorization:RoleAssignment"

# Azure's built-in roles that may change or delete what they do not need to, or hand out access,
# by ID (https://learn.microsoft.com/azure/role-based-access-control/built-in-roles)
BROAD_BUILTIN_ROLES = {
    "8e3af657-a8ff-443c-a75c-2fe8c4bcb635": "Owner",
    "b24988ac-6180-42a0-ab88-20f7382dd24c": "Contributor",
    "18d7d88d-d35e-4fb5-a5c3-7773c20a72d9": "User Access Administrator",
    "f58310d9-a9f6-439a-9e8d-f62e7b41a168": "Role Based Access Control Administrator",
    "9980e02c-c2be-4d73-94e8-173b1dc7cf3c": "Virtual Machine Contributor",
    "d73bb868-a0df-4d4d-bd69-98a00b01fccb": "Classic Virtual Machine Contributor",
    "4d97b98b-1d4f-4787-a291-c67834d212e7": "Network Contributor",
    "b34d265f-36f7-4a0d-a4d4-e158ca92e90f": "Classic Network Contributor",
    "17d1049b-9a84-46fb-8f53-869881c3d3ab": "Storage Account Contributor",
    "86e8f5dc-a6e9-4c67-9d15-de283e8eac25": "Classic Storage Account Contributor",
    "4a9ae827-6dc8-4573-8ac7-8239d42aa03f": "Tag Contributor",
    "e40ec5ca-96e0-45a2-b4ff-59039f2c2b59": "Managed Identity Contributor",
}
"""Built-in role ID -> its name in Azure's list of built-in roles."""

_ROLE_ID = re.compile(r"(?:^|/providers/Microsoft\.Authorization/roleDefinitions/)([0-9a-f-]{36})/?$", re.I)
_BROAD_SCOPES = (
    ("resource group", re.compile(r"^/subscriptions/[^/]+/resourceGroups/[^/]+/?$", re.I)),
    ("subscription", re.compile(r"^/subscriptions/[^/]+/?$", re.I)),
    (
        "management group",
        re.compile(r"^/providers/Microsoft\.Management/managementGroups/[^/]+/?$", re.I),
    ),
    ("tenant root", re.compile(r"^/$")),
)
FIX = (
    "replace it with a custom role (an authorization.RoleDefinition assigned at the same scope) holding "
    "only the actions that identity calls, as the cluster's own identities do: the autoscaler's "
    f"{', '.join(autoscaling.ROLE_ACTIONS + autoscaling.GOVERNOR_ACTIONS)}; remediation's "
    f"{', '.join(remediation.ROLE_ACTIONS)}"
)


def broad_builtin_role(role_definition_id: object) -> tuple[str, str] | None:
    """(ID, name) of the broad built-in role a role definition ID names; None for any other role."""
    m = _ROLE_ID.search(str(role_definition_id or ""))
    if not m:
        return None
    guid = m.group(1).lower()
    return (guid, BROAD_BUILTIN_ROLES[guid]) if guid in BROAD_BUILTIN_ROLES else None


def broad_scope(scope: object) -> str | None:
    """What kind of wide scope (resource group or wider) `scope` is; None for a narrower one."""
    text = str(scope or "")
    return next((kind for kind, pattern in _BROAD_SCOPES if text and pattern.match(text)), None)


def _no_builtin_contributor(view: StackView, config: RuleConfig) -> Iterator[Finding]:
    for r in view.of_type(ROLE_ASSIGNMENT):
        role = broad_builtin_role(r.props.get("roleDefinitionId"))
        kind = broad_scope(r.props.get("scope"))
        if role is None or kind is None:
            continue
        guid, role_name = role
        yield Finding(
            f"role assignment {r.name} grants the built-in {role_name} ({guid}) on the {kind} "
            f"{r.props.get('scope')}: {FIX}",
            r.urn,
        )


RULES = [
    Rule(
        "iam-role-assignment-no-builtin-contributor",
        "critical",
        "No role assignment of the stack grants a built-in Contributor-class role (Owner, Contributor, "
        "User Access Administrator, Role Based Access Control Administrator, Virtual Machine, Network, "
        "Storage Account, Tag or Managed Identity Contributor, or a classic one) on a resource group or a "
        "wider scope: Virtual Machine Contributor alone may delete every VM of the group, etcd and the "
        "API servers included.",
        "Give the identity a custom role with only the actions it calls, assigned on the cluster's resource "
        "group: superkube.cluster.autoscaling.ROLE_ACTIONS (plus GOVERNOR_ACTIONS) for the autoscaler's, "
        "superkube.cluster.remediation.ROLE_ACTIONS for remediation's; modules/cluster.py builds both.",
        _no_builtin_contributor,
    ),
]
