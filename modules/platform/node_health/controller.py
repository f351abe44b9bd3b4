"""The health controller's Deployment and access."""

from __future__ import annotations

from modules.platform import objects
from modules.platform.foundation import NAMESPACE, NODE_AGENT_PRIORITY
from modules.platform.node_health.facts import (
    COMPONENT,
    CONTROLLER_LEASE_RULES,
    CONTROLLER_RULES,
    HEALTH,
    HEALTH_CONTROLLER,
    PREFLIGHT,
    RULES,
    Agent,
    NodeHealthArgs,
)
from modules.platform.objects import Manifest
from superkube.cluster.kube import NODE_AGENTS_METRICS_PORT


def controller(args: NodeHealthArgs) -> list[Manifest]:
    """The health controller: two replicas, one leading (its Lease), the breaker's figures on the
    node agents' metrics port so the same scrape job finds them."""
    name = HEALTH_CONTROLLER
    pools = ",".join(pool.name for pool, _ in args.pools)
    flags = [f"--pools={pools}", f"--max-cordoned-share={args.max_cordoned_share}",
             f"--metrics-port={NODE_AGENTS_METRICS_PORT}", *(["--dry-run"] if args.dry_run else [])]  # fmt: skip
    env = [
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
    ]
    container = {
        "name": "controller",
        "image": args.image,
        "command": ["python", "-m", "superkube.agents.health_controller", *flags],
        "env": env,
        "ports": [{"name": "metrics", "containerPort": NODE_AGENTS_METRICS_PORT}],
        "resources": {"requests": {"cpu": "100m", "memory": "256Mi"}, "limits": {"memory": "512Mi"}},
        "livenessProbe": {
            "httpGet": {"path": "/metrics", "port": NODE_AGENTS_METRICS_PORT},
            "periodSeconds": 30,
        },
        "securityContext": objects.restricted(),
    }
    labels = objects.labels(COMPONENT, name)
    return [
        *objects.service_account_access(name, COMPONENT, NAMESPACE, CONTROLLER_RULES),
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": objects.meta(f"{name}-lease", COMPONENT, NAMESPACE),
            "rules": CONTROLLER_LEASE_RULES,
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": objects.meta(f"{name}-lease", COMPONENT, NAMESPACE),
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": f"{name}-lease"},
            "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": NAMESPACE}],
        },
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": objects.meta(name, COMPONENT, NAMESPACE),
            "spec": {
                "replicas": 2,
                "selector": {"matchLabels": {"app.kubernetes.io/name": name}},
                "template": {
                    "metadata": {"labels": labels},
                    "spec": {
                        "serviceAccountName": name,
                        "priorityClassName": NODE_AGENT_PRIORITY,
                        "affinity": {
                            "podAntiAffinity": {
                                "preferredDuringSchedulingIgnoredDuringExecution": [
                                    {
                                        "weight": 100,
                                        "podAffinityTerm": {
                                            "topologyKey": "kubernetes.io/hostname",
                                            "labelSelector": {
                                                "matchLabels": {"app.kubernetes.io/name": name}
                                            },
                                        },
                                    }
                                ]
                            }
                        },
                        "containers": [container],
                    },
                },
            },
        },
    ]


def agent_access(agent: Agent) -> list[Manifest]:
    return objects.service_account_access(
        HEALTH if agent == "health" else PREFLIGHT, COMPONENT, NAMESPACE, RULES[agent]
    )
