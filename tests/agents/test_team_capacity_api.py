"""Team capacity through the real API server (etcd and kube-apiserver at the pinned versions, on
loopback): the team webhook as a process behind the layer's webhook configuration, a namespace's
team as its pods', and what a pod is not owed refused by the server."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import pytest

from superkube.harness.apiserver import LocalApi
from superkube.model import teams
from tests.agents.conftest import (
    account,
    admin,
    apply,
    namespace,
    unique,
)

# --- team capacity through the real API server --------------------------------------------------


@pytest.fixture(scope="module")
def team_webhook_on(api: LocalApi, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalApi]:
    """The webhook as a process, and the layer's webhook configuration pointing the real API server
    at it (by URL on loopback instead of the Service: no cluster network here)."""
    import base64

    from modules.platform import team_capacity
    from tests.agents.test_team_webhook import TEAMS, Server

    server = Server(tmp_path_factory.mktemp("webhook"))
    args = team_capacity.TeamCapacityArgs(tuples=teams.parse(TEAMS), webhook_tls="")
    ca = base64.b64encode(server.pki["ca"].read_bytes()).decode()
    entries = team_capacity.webhook_entries(args, ca)
    for entry in entries:
        path = entry["clientConfig"].pop("service")["path"]
        entry["clientConfig"]["url"] = f"{server.url}{path}"
    config = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": team_capacity.WEBHOOK},
        "webhooks": entries,
    }
    apply(api, config)
    try:
        yield api
    finally:
        admin_api = admin(api)
        from kubernetes import client

        client.AdmissionregistrationV1Api(admin_api.api_client).delete_mutating_webhook_configuration(
            team_capacity.WEBHOOK
        )
        server.stop()


def create_pod(api: LocalApi, ns: str, labels: dict[str, str] | None = None, **spec: Any) -> Any:
    """Create a pod as a user would (no node set); the created pod, or the ApiException."""
    from kubernetes.client.exceptions import ApiException

    body = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"generateName": "trainer-", "labels": labels or {}},
        "spec": {"containers": [{"name": "c", "image": "registry.invalid/none:0"}], **spec},
    }
    account(api, ns, "default")
    deadline = time.monotonic() + 15
    while True:
        try:
            return admin(api).create_namespaced_pod(ns, body)
        except ApiException as e:
            if e.status == 403 or time.monotonic() > deadline:
                return e
            time.sleep(0.3)  # the webhook configuration still loading


def test_a_pods_team_is_its_namespaces(team_webhook_on: LocalApi) -> None:
    api = team_webhook_on
    research = namespace(api, unique("research"), {teams.TEAM_KEY: "research"})
    nobody = namespace(api, unique("nobody"))
    made = create_pod(api, research)
    tolerations = [t.to_dict() for t in made.spec.tolerations or []]
    assert {"key": teams.TEAM_KEY, "operator": "Equal", "value": "research", "effect": "NoSchedule"} in [
        {k: v for k, v in t.items() if v is not None} for t in tolerations
    ]
    assert made.metadata.labels[teams.TEAM_KEY] == "research"
    plain = create_pod(api, nobody)
    assert not any((t.key or "") == teams.TEAM_KEY for t in plain.spec.tolerations or [])


def test_a_teams_own_admin_cannot_change_its_namespaces_team(api: LocalApi) -> None:
    """The team is the namespace's label because a team cannot set it: even Kubernetes' widest
    namespaced role (`admin`) bound in its namespace may run pods there but not relabel it. The
    role's rules are the roles it aggregates (no controller-manager aggregates them here)."""

    from superkube.harness import apiserver

    ns = namespace(api, unique("research"), {teams.TEAM_KEY: "research"})
    apply(api, *({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
                  "metadata": {"name": f"team-{role}", "namespace": ns},
                  "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                              "name": f"system:aggregate-to-{role}"},
                  "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "alice"}]}
                 for role in ("admin", "edit", "view")))  # fmt: skip
    as_alice = ("--as", "alice")
    assert apiserver.kubectl(api, "auth", "can-i", "create", "pods", "-n", ns, *as_alice).strip() == "yes"
    with pytest.raises(subprocess.CalledProcessError) as refused:
        apiserver.kubectl(
            api, "label", "namespace", ns, f"{teams.TEAM_KEY}=pretraining", "--overwrite", *as_alice
        )
    assert "Forbidden" in refused.value.stderr or "forbidden" in refused.value.stderr, refused.value.stderr
    assert admin(api).read_namespace(ns).metadata.labels[teams.TEAM_KEY] == "research"


@pytest.mark.parametrize(
    ("where", "labels", "tolerations", "words"),
    [
        ("nobody", {}, [{"operator": "Exists"}], "reaches nodes its namespace's no team does not own"),
        ("nobody", {teams.TEAM_KEY: "research"}, [], "its namespace belongs to no team"),
        ("research", {teams.TEAM_KEY: "pretraining"}, [], "its namespace belongs to team 'research'"),
        (
            "research",
            {},
            [{"key": teams.TEAM_KEY, "operator": "Equal", "value": "pretraining", "effect": "NoSchedule"}],
            "reaches nodes its namespace's team 'research' does not own",
        ),
    ],
    ids=[
        "unlabelled pod tolerating everything",
        "self-labelled",
        "another team's label",
        "another team's toleration",
    ],
)
def test_what_a_pod_is_not_owed_is_refused_by_the_real_server(
    team_webhook_on: LocalApi, where: str, labels: dict[str, str], tolerations: list[Any], words: str
) -> None:
    api = team_webhook_on
    ns = namespace(api, unique(where), {teams.TEAM_KEY: "research"} if where == "research" else {})
    refused = create_pod(api, ns, labels, tolerations=tolerations)
    assert getattr(refused, "status", None) == 403, refused
    message = json.loads(refused.body)["message"]
    assert words in message and len(message.splitlines()) == 1, message


def test_system_namespaces_never_wait_on_the_webhook(team_webhook_on: LocalApi) -> None:
    made = create_pod(team_webhook_on, "kube-system", {}, tolerations=[{"operator": "Exists"}])
    assert made.metadata.name.startswith("trainer-")
    admin(team_webhook_on).delete_namespaced_pod(made.metadata.name, "kube-system")


def test_a_pending_pod_cannot_be_given_another_teams_toleration_nor_a_node(team_webhook_on: LocalApi) -> None:
    from kubernetes.client.exceptions import ApiException

    api = team_webhook_on
    research = namespace(api, unique("research"), {teams.TEAM_KEY: "research"})
    made = create_pod(api, research)
    other = {"key": teams.TEAM_KEY, "operator": "Equal", "value": "pretraining", "effect": "NoSchedule"}
    tolerations = [*(t.to_dict() for t in made.spec.tolerations or []), other]
    body = [{"op": "replace", "path": "/spec/tolerations", "value": [
        {k: v for k, v in t.items() if v is not None} for t in tolerations]}]  # fmt: skip
    with pytest.raises(ApiException) as refused:
        admin(api).patch_namespaced_pod(made.metadata.name, research, body)
    assert refused.value.status == 403 and "reaches nodes" in json.loads(refused.value.body)["message"]
    bound = create_pod(api, research, nodeName="some-node")
    assert (
        getattr(bound, "status", None) == 403 and "spec.nodeName is set" in json.loads(bound.body)["message"]
    )
