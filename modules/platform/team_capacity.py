"""Team capacity: teams own nodes by taints, from one reviewed configuration, with "any" borrowing.

- ConfigMap `superkube-teams`: the stack's `teams` tuples (selector -> team, priority), read by both
  programs below.
- The reconciler (superkube.agents.team_taints): keeps each node's `superkube.io/team` taint equal to
  the configuration, touching no other taint. One replica (Recreate): a second copy would only race
  the first; its patches `test` the taints they read, so even that race cannot clobber a change.
- The mutating admission webhook (superkube.agents.team_webhook): a pod's team is its namespace's
  (the namespace label `superkube.io/team`, which only cluster admins can set); it gives the pod its
  team's toleration, and `any`'s when it borrows, and refuses tolerations of nodes it is not owed.
  Two replicas behind a Service, a PodDisruptionBudget keeping one up through a drain, TLS from the cluster CA (kube_pki issues the
  certificate; the layer gets it as the secret `superkube:team_webhook_tls`).

Why failurePolicy Fail: with Ignore, a team pod created while the webhook is down would be admitted
without its toleration and wait forever on no node; with Fail its creation is refused with a
message and its controller (Job, MPI Operator) creates it again once a replica answers; and with
Ignore an outage would let any pod tolerate any team's nodes. Every pod outside the system
namespaces passes (no objectSelector: an unlabelled pod is no less able to tolerate a team's taint);
the namespaceSelector leaves kube-system and superkube's own namespace out, so no system pod waits
on the webhook. reinvocationPolicy IfNeeded: if a later webhook changes a pod's tolerations ours is
asked again, and gives the same answer (it is idempotent).
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from dataclasses import dataclass, field

import pulumi
import yaml

from modules.common import require
from modules.platform import objects
from modules.platform.foundation import CLUSTER_CRITICAL, NAMESPACE
from modules.platform.objects import Manifest
from superkube.agents import AGENTS_IMAGE
from superkube.cluster.kube import (
    NAMESPACE_NAME_LABEL,
    TEAM_CAPACITY_COMPONENT,
    TEAM_TAINTS_METRICS_PORT,
    TEAM_WEBHOOK_METRICS_PORT,
    TEAM_WEBHOOK_PORT,
    TEAM_WEBHOOK_SERVICE,
)
from superkube.model import teams

COMPONENT = TEAM_CAPACITY_COMPONENT
CONFIG = "superkube-teams"
RECONCILER = "superkube-team-taints"
WEBHOOK = TEAM_WEBHOOK_SERVICE
TLS_SECRET = teams.WEBHOOK_TLS_SECRET
SERVICE_PORT = 443
CONFIG_DIR = "/etc/superkube/teams"
TLS_DIR = "/etc/superkube/tls"
EXCLUDED_NAMESPACES = ("kube-system", "kube-public", "kube-node-lease", NAMESPACE)
"""Namespaces the webhook is never called for: a webhook outage cannot block a system pod."""


@dataclass(frozen=True, kw_only=True)
class TeamCapacityArgs:
    tuples: Sequence[teams.TeamTuple]
    """The team capacity configuration (the stack's `teams`)."""
    webhook_tls: pulumi.Input[str]
    """The webhook's PEM bundle: its certificate, its key, the CA certificate (a secret)."""
    webhook_replicas: int = 2
    """Webhook replicas (default 2; the PodDisruptionBudget keeps one)."""
    dry_run: bool = False
    """The reconciler logs the taint changes it would make instead of making them."""
    interval_seconds: int = 30
    """Seconds between the reconciler's rounds."""
    timeout_seconds: int = 5
    """How long the API server waits for the webhook (1-30)."""
    image: str = AGENTS_IMAGE
    """The image both programs run from (default: the pinned agents image)."""
    excluded_namespaces: Sequence[str] = field(default=EXCLUDED_NAMESPACES)
    """Namespaces the webhook is never called for (must include kube-system)."""

    def __post_init__(self) -> None:
        require(len(self.tuples) > 0, "tuples", "is empty: with no teams there is nothing to deploy")
        require(self.webhook_replicas >= 2, "webhook_replicas", "must be at least 2 (failurePolicy is Fail)")
        require(1 <= self.timeout_seconds <= 30, "timeout_seconds", "must be 1-30 (the API server's range)")
        require("kube-system" in self.excluded_namespaces, "excluded_namespaces", "must include kube-system")
        try:
            teams.check(self.tuples)
        except teams.TeamsError as e:
            require(False, "tuples", str(e))


def config_map(args: TeamCapacityArgs) -> Manifest:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": objects.meta(CONFIG, COMPONENT, NAMESPACE),
        "data": {teams.CONFIG_FILE: yaml.safe_dump(teams.to_document(args.tuples), sort_keys=False)},
    }


def _container(
    name: str, image: str, module: str, flags: list[str], port: int, mounts: list[Manifest]
) -> Manifest:
    return {
        "name": name,
        "image": image,
        "command": ["python", "-m", module, *flags],
        "ports": [{"name": "https" if name == "webhook" else "metrics", "containerPort": port}],
        "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}, "limits": {"memory": "256Mi"}},
        "volumeMounts": mounts,
        "securityContext": objects.restricted(),
    }


def reconciler(args: TeamCapacityArgs) -> list[Manifest]:
    flags = [
        f"--config={CONFIG_DIR}/{teams.CONFIG_FILE}",
        f"--interval={args.interval_seconds}",
        f"--metrics-port={TEAM_TAINTS_METRICS_PORT}",
        *(["--dry-run"] if args.dry_run else []),
    ]
    container = _container(
        "reconciler",
        args.image,
        "superkube.agents.team_taints",
        flags,
        TEAM_TAINTS_METRICS_PORT,
        [{"name": "teams", "mountPath": CONFIG_DIR, "readOnly": True}],
    )
    container["livenessProbe"] = {
        "httpGet": {"path": "/metrics", "port": TEAM_TAINTS_METRICS_PORT},
        "periodSeconds": 30,
    }
    return [
        *objects.service_account_access(
            RECONCILER,
            COMPONENT,
            NAMESPACE,
            [
                {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch", "patch"]},
                # the namespaces labelled with a team, read only: their team is a metric the store
                # joins per-namespace figures (each pod's network use) with
                {"apiGroups": [""], "resources": ["namespaces"], "verbs": ["list", "watch"]},
                {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]},
            ],
        ),
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": objects.meta(RECONCILER, COMPONENT, NAMESPACE),
            "spec": {
                "replicas": 1,
                "strategy": {"type": "Recreate"},
                "selector": {"matchLabels": {"app.kubernetes.io/name": RECONCILER}},
                "template": {
                    "metadata": {"labels": objects.labels(COMPONENT, RECONCILER)},
                    "spec": {
                        "serviceAccountName": RECONCILER,
                        "priorityClassName": CLUSTER_CRITICAL,
                        "containers": [container],
                        "volumes": [{"name": "teams", "configMap": {"name": CONFIG}}],
                    },
                },
            },
        },
    ]


def webhook(args: TeamCapacityArgs, ca_bundle: pulumi.Input[str]) -> list[Manifest]:
    flags = [
        f"--config={CONFIG_DIR}/{teams.CONFIG_FILE}",
        f"--cert={TLS_DIR}/tls.crt",
        f"--key={TLS_DIR}/tls.key",
        f"--port={TEAM_WEBHOOK_PORT}",
        f"--metrics-port={TEAM_WEBHOOK_METRICS_PORT}",
    ]
    container = _container(
        "webhook",
        args.image,
        "superkube.agents.team_webhook",
        flags,
        TEAM_WEBHOOK_PORT,
        [
            {"name": "teams", "mountPath": CONFIG_DIR, "readOnly": True},
            {"name": "tls", "mountPath": TLS_DIR, "readOnly": True},
        ],
    )
    # its metrics in plain HTTP on a port of their own, named as Prometheus's pod discovery keeps them
    container["ports"].append({"name": "metrics", "containerPort": TEAM_WEBHOOK_METRICS_PORT})
    probe = {"httpGet": {"path": "/healthz", "port": TEAM_WEBHOOK_PORT, "scheme": "HTTPS"}}
    container["readinessProbe"] = {**probe, "periodSeconds": 5}
    container["livenessProbe"] = {**probe, "periodSeconds": 20, "failureThreshold": 3}
    selector = {"app.kubernetes.io/name": WEBHOOK}
    return [
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": objects.meta(WEBHOOK, COMPONENT, NAMESPACE),
        },
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": objects.meta(WEBHOOK, COMPONENT, NAMESPACE),
            "spec": {
                "replicas": args.webhook_replicas,
                "selector": {"matchLabels": selector},
                "template": {
                    "metadata": {"labels": objects.labels(COMPONENT, WEBHOOK)},
                    "spec": {
                        "serviceAccountName": WEBHOOK,
                        "automountServiceAccountToken": False,  # it never calls the API
                        "priorityClassName": CLUSTER_CRITICAL,
                        "containers": [container],
                        "volumes": [
                            {"name": "teams", "configMap": {"name": CONFIG}},
                            {"name": "tls", "secret": {"secretName": TLS_SECRET}},
                        ],
                        "affinity": {
                            "podAntiAffinity": {
                                "requiredDuringSchedulingIgnoredDuringExecution": [
                                    {
                                        "topologyKey": "kubernetes.io/hostname",
                                        "labelSelector": {"matchLabels": selector},
                                    }
                                ]
                            }
                        },
                    },
                },
            },
        },
        {
            "apiVersion": "policy/v1",
            "kind": "PodDisruptionBudget",
            "metadata": objects.meta(WEBHOOK, COMPONENT, NAMESPACE),
            "spec": {"minAvailable": 1, "selector": {"matchLabels": selector}},
        },
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": objects.meta(WEBHOOK, COMPONENT, NAMESPACE),
            "spec": {
                "selector": selector,
                "ports": [{"name": "https", "port": SERVICE_PORT, "targetPort": TEAM_WEBHOOK_PORT}],
            },
        },
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "MutatingWebhookConfiguration",
            "metadata": objects.meta(WEBHOOK, COMPONENT),
            "webhooks": [
                *webhook_entries(args, ca_bundle),
            ],
        },
    ]


def webhook_entries(args: TeamCapacityArgs, ca_bundle: pulumi.Input[str]) -> list[Manifest]:
    """One entry per team, calling `/mutate/<team>` for the namespaces labelled with it, and one
    calling `/mutate` for every other namespace outside the excluded ones (no label, or a team the
    configuration does not name): the selectors are disjoint, so each pod is asked about once, and
    together they cover every pod outside the system namespaces."""
    owners = sorted({t.team for t in args.tuples} - {teams.ANY})
    outside = {"key": NAMESPACE_NAME_LABEL, "operator": "NotIn", "values": list(args.excluded_namespaces)}

    def entry(name: str, path: str, selector: Manifest | None) -> Manifest:
        return {
            "name": name,
            "admissionReviewVersions": ["v1"],
            "clientConfig": {
                "service": {"namespace": NAMESPACE, "name": WEBHOOK, "path": path, "port": SERVICE_PORT},
                "caBundle": ca_bundle,
            },
            "rules": [
                {
                    "operations": ["CREATE", "UPDATE"],
                    "apiGroups": [""],
                    "apiVersions": ["v1"],
                    "resources": ["pods"],
                    "scope": "Namespaced",
                }
            ],
            "failurePolicy": "Fail",
            "matchPolicy": "Equivalent",
            "sideEffects": "None",
            "timeoutSeconds": args.timeout_seconds,
            "reinvocationPolicy": "IfNeeded",
            "namespaceSelector": {"matchExpressions": [outside, *([selector] if selector else [])]},
        }

    return [
        *(
            entry(
                f"{team}.teams.superkube.io",
                f"/mutate/{team}",
                {"key": teams.TEAM_KEY, "operator": "In", "values": [team]},
            )
            for team in owners
        ),
        # no team: unlabelled, or a team the configuration does not name (NotIn matches both; with
        # no team but `any` configured, every namespace is of no team)
        entry(
            "teams.superkube.io",
            "/mutate",
            {"key": teams.TEAM_KEY, "operator": "NotIn", "values": owners} if owners else None,
        ),
    ]


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def manifests(
    args: TeamCapacityArgs,
    cert_b64: pulumi.Input[str],
    key_b64: pulumi.Input[str],
    ca_b64: pulumi.Input[str],
) -> list[Manifest]:
    """Every object; the TLS material base64-encoded as the Secret and the webhook's caBundle take it."""
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "kubernetes.io/tls",
        "metadata": objects.meta(TLS_SECRET, COMPONENT, NAMESPACE),
        "data": {"tls.crt": cert_b64, "tls.key": key_b64},
    }
    return [config_map(args), secret, *reconciler(args), *webhook(args, ca_b64)]


class TeamCapacity(pulumi.ComponentResource):
    """The teams ConfigMap, the taint reconciler, and the team admission webhook."""

    def __init__(self, name: str, args: TeamCapacityArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("superkube:platform:TeamCapacity", name, None, opts)
        parts = pulumi.Output.secret(args.webhook_tls).apply(teams.split_bundle)
        # the key stays secret; the certificate and the CA are public
        cert, key, ca = (pulumi.Output.unsecret(parts[i].apply(_b64)) for i in (0, 1, 2))
        self.resources = objects.create(self, name, manifests(args, cert, pulumi.Output.secret(key), ca))
        self.register_outputs({"teams": sorted({t.team for t in args.tuples}), "webhook": WEBHOOK})
