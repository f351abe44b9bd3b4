"""What the join-token publisher on the API-server hosts (superkube.agents.join_tokens, the join_tokens
role) needs from inside the cluster: the plan's custom data, and a user that may do its job and
nothing else.

- The ConfigMap `superkube-node-documents`: each node scale set's #cloud-config document as the plan
  renders it, without credentials. `pulumi up` keeps it as the plan says; the publisher adds the
  current token and writes the whole into the scale set's model. So a change to the plan's custom
  data reaches new instances through the publisher, without a converge (the scale sets themselves
  ignore later changes to their custom data, which the publisher owns).
  Whoever may write that ConfigMap decides what every new node runs as root, and some workloads'
  operators may write ConfigMaps in every namespace (the MPI Operator does). So the ValidatingAdmission-
  Policy `superkube-node-documents-admins-only` refuses any change to it, a delete included, by a user
  outside system:masters: the cluster's admins, whose identity the layer's `pulumi up` uses.
- Its user (a client certificate from the controller's PKI, on the API-server hosts): in kube-system,
  create and list Secrets (bootstrap tokens must live there; RBAC cannot narrow a list or a create
  to some names, so this user can read kube-system's Secrets, and could make a service account's
  token Secret there. Its certificate lives only on the API-server hosts, which hold the cluster
  CA's key already: nothing more is exposed than was). In superkube's namespace: read that one
  ConfigMap, and get and renew its one Lease, which the layer makes (RBAC cannot narrow a create
  to a name either, so the user may create no Lease at all).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pulumi

from modules.common import require
from modules.platform import objects
from modules.platform.foundation import NAMESPACE
from modules.platform.objects import Manifest
from superkube.cluster import join

COMPONENT = "join-tokens"
NAME = join.PUBLISHER


@dataclass(frozen=True, kw_only=True)
class JoinTokensArgs:
    documents: dict[str, str] = field(default_factory=dict)
    """Node scale set name -> its #cloud-config document, as the plan renders it."""
    user: str = join.PUBLISHER
    """The Kubernetes user the publisher acts as."""

    def __post_init__(self) -> None:
        require(bool(self.documents), "documents", "give each node scale set's #cloud-config document")
        for name, doc in self.documents.items():
            require(doc.startswith("#cloud-config\n"), "documents", f"{name}: not a #cloud-config document")


def manifests(args: JoinTokensArgs) -> list[Manifest]:
    user = [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": args.user}]
    tokens = [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["create", "list"]}]
    own = [
        {"apiGroups": [""], "resources": ["configmaps"], "resourceNames": [join.DOCUMENTS_CONFIGMAP],
         "verbs": ["get"]},
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "resourceNames": [join.PUBLISHER],
         "verbs": ["get", "update"]},
    ]  # fmt: skip
    out: list[Manifest] = [
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": objects.meta(join.DOCUMENTS_CONFIGMAP, COMPONENT, NAMESPACE),
            "data": dict(sorted(args.documents.items())),
        },
        *admins_only(),
        # the publisher's Lease, without a holder: the hosts' publishers take it (its spec is theirs)
        {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": objects.meta(join.PUBLISHER, COMPONENT, NAMESPACE),
        },
    ]
    for namespace, rules in ((join.TOKEN_NAMESPACE, tokens), (NAMESPACE, own)):
        out += [
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "Role",
                "metadata": objects.meta(NAME, COMPONENT, namespace),
                "rules": rules,
            },
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "RoleBinding",
                "metadata": objects.meta(NAME, COMPONENT, namespace),
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": NAME},
                "subjects": user,
            },
        ]
    return out


ADMINS_ONLY = "superkube-node-documents-admins-only"
ADMINS = "system:masters"


def admins_only() -> list[Manifest]:
    """No one but the cluster's admins may make, change or delete the documents ConfigMap."""
    return [
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingAdmissionPolicy",
            "metadata": objects.meta(ADMINS_ONLY, COMPONENT),
            "spec": {
                "failurePolicy": "Fail",
                "matchConstraints": {"resourceRules": [{
                    "apiGroups": [""], "apiVersions": ["v1"], "resources": ["configmaps"],
                    "operations": ["CREATE", "UPDATE", "DELETE"],
                }]},
                "matchConditions": [{
                    "name": "the-node-documents",
                    "expression": f"request.namespace == '{NAMESPACE}' && request.name == '{join.DOCUMENTS_CONFIGMAP}'",
                }],
                "validations": [{
                    "expression": f"'{ADMINS}' in request.userInfo.groups",
                    "reason": "Forbidden",
                    "message": f"{join.DOCUMENTS_CONFIGMAP} is what every new node runs as root: only the cluster's "
                    "admins change it, through the in-cluster layer's `pulumi up`",
                }],
            },
        },
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingAdmissionPolicyBinding",
            "metadata": objects.meta(ADMINS_ONLY, COMPONENT),
            "spec": {"policyName": ADMINS_ONLY, "validationActions": ["Deny"]},
        },
    ]  # fmt: skip


class JoinTokens(pulumi.ComponentResource):
    """The node scale sets' plan documents, and the join-token publisher's user's rights."""

    def __init__(self, name: str, args: JoinTokensArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("superkube:platform:JoinTokens", name, None, opts)
        self.resources = objects.create(self, name, manifests(args))
        self.register_outputs({"documents": join.DOCUMENTS_CONFIGMAP, "user": args.user})
