"""The team webhook as the API server meets it: a real HTTPS server (uvicorn, TLS from a CA made with
openssl) answering real admission.k8s.io/v1 AdmissionReviews. Each patch is applied with a JSON
Patch library and the patched pod validated against the official pod schema; bad reviews get a
clear allowed/denied answer, never a server error."""

from __future__ import annotations

import base64
import copy
import json
import ssl
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import jsonpatch
import pytest
import yaml

from superkube.agents import team_webhook
from superkube.cluster import render
from superkube.model import teams
from tests.tls import issue

VERSION = "1.35.0"
TEAMS = [
    {"selector": {"superkube.io/pool": "gpu", "rack": "a"}, "team": "research", "priority": 10},
    {"selector": {"superkube.io/pool": "gpu", "rack": "b"}, "team": "pretraining", "priority": 10},
    {"selector": {"superkube.io/pool": "gpu"}, "team": "any", "priority": 0},
]


def trusting(ca: Path) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=str(ca))


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    def __init__(self, d: Path) -> None:
        self.pki = issue(d)
        self.config = d / "teams.yaml"
        self.config.write_text(yaml.safe_dump(TEAMS))
        self.port, self.metrics_port = free_port(), free_port()
        self.url = f"https://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "superkube.agents.team_webhook", "--config", str(self.config),
             "--cert", str(self.pki["cert"]), "--key", str(self.pki["key"]),
             "--address", "127.0.0.1", "--port", str(self.port),
             "--metrics-address", "127.0.0.1", "--metrics-port", str(self.metrics_port)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        self.client = httpx.Client(base_url=self.url, verify=trusting(self.pki["ca"]), timeout=10)
        try:
            self._wait_up()
        except BaseException:
            self.stop()  # a server that never came up is not left running
            raise

    def _wait_up(self) -> None:
        end = time.monotonic() + 30
        while True:
            try:
                if self.client.get("/healthz").status_code == 200:
                    return
            except httpx.TransportError:
                pass
            assert self.proc.poll() is None, "the webhook exited at start"
            assert time.monotonic() < end, "the webhook did not come up"
            time.sleep(0.1)

    def post(self, body: bytes | dict[str, Any], team: str | None = None) -> httpx.Response:
        """As the API server calls it for a namespace of `team` (None: of no team)."""
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        path = f"/mutate/{team}" if team else "/mutate"
        return self.client.post(path, content=data, headers={"Content-Type": "application/json"})

    def metrics(self) -> dict[str, float]:
        """Its /metrics samples, by name and labels as served (plain HTTP, a port of their own)."""
        text = httpx.get(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=10).text
        return {
            line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line and not line.startswith("#")
        }

    def stop(self) -> None:
        self.client.close()
        self.proc.terminate()
        self.proc.communicate(timeout=10)  # reaps it and closes its pipes


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    s = Server(tmp_path_factory.mktemp("webhook"))
    yield s
    s.stop()


def pod(labels: dict[str, str] | None = None, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "trainer-0", "namespace": "research", "labels": labels or {}},
        "spec": {"containers": [{"name": "main", "image": "registry.example.com/trainer:1.0"}], **spec},
    }


def review_of(
    obj: dict[str, Any],
    operation: str = "CREATE",
    kind: str = "Pod",
    old: dict[str, Any] | None = None,
    user: str = "system:serviceaccount:kube-system:job-controller",
) -> dict[str, Any]:
    request = {
        "uid": str(uuid.uuid4()),
        "kind": {"group": "", "version": "v1", "kind": kind},
        "resource": {"group": "", "version": "v1", "resource": kind.lower() + "s"},
        "namespace": "research",
        "operation": operation,
        "userInfo": {"username": user},
        "object": obj,
        "dryRun": False,
    }
    if operation == "UPDATE":
        request["oldObject"] = old if old is not None else copy.deepcopy(obj)
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}


def answer(server: Server, body: bytes | dict[str, Any], team: str | None = "research") -> dict[str, Any]:
    resp = server.post(body, team)
    assert resp.status_code == 200, resp.text  # every answer is a review, never a server error
    doc: dict[str, Any] = resp.json()
    assert (doc["apiVersion"], doc["kind"]) == ("admission.k8s.io/v1", "AdmissionReview")
    if isinstance(body, dict):
        assert doc["response"]["uid"] == body["request"]["uid"]
    return doc["response"]


def patched(obj: dict[str, Any], response: dict[str, Any]) -> dict[str, Any]:
    assert response["allowed"] is True and response["patchType"] == "JSONPatch"
    ops = json.loads(base64.b64decode(response["patch"]))
    result: dict[str, Any] = jsonpatch.apply_patch(obj, ops)
    assert render.validate(result, VERSION) == [], "the patched pod is not a valid Pod"
    return result


def test_a_team_pod_gets_its_teams_toleration_and_label_and_nothing_else(server: Server) -> None:
    obj = pod()
    out = patched(obj, answer(server, review_of(obj), team="research"))
    assert out["spec"]["tolerations"] == [teams.toleration("research")]
    assert out["metadata"]["labels"] == {teams.TEAM_KEY: "research"}  # its team, said on the pod
    assert {k: v for k, v in out.items() if k not in ("spec", "metadata")} == {
        k: v for k, v in obj.items() if k not in ("spec", "metadata")
    }
    assert {k: v for k, v in out["spec"].items() if k != "tolerations"} == obj["spec"]


def test_a_borrowing_pod_also_tolerates_any(server: Server) -> None:
    obj = pod({teams.BORROW_LABEL: "true"})
    out = patched(obj, answer(server, review_of(obj), team="pretraining"))
    assert out["spec"]["tolerations"] == [teams.toleration("pretraining"), teams.toleration("any")]
    # the same pod without the opt-in does not borrow
    plain = pod({teams.BORROW_LABEL: "false"})
    assert patched(plain, answer(server, review_of(plain), team="pretraining"))["spec"]["tolerations"] == [
        teams.toleration("pretraining")
    ]


UNOWED = [
    {"key": teams.TEAM_KEY, "operator": "Equal", "value": "pretraining", "effect": "NoSchedule"},
    {"key": teams.TEAM_KEY, "operator": "Exists"},
    {"operator": "Exists"},
    teams.toleration("any"),  # borrowing without the opt-in
]


@pytest.mark.parametrize("unowed", UNOWED, ids=["another team", "any team", "every taint", "any, unasked"])
def test_a_toleration_of_nodes_the_pod_is_not_owed_is_refused_in_one_line(
    server: Server, unowed: dict[str, Any]
) -> None:
    own = {
        "key": "node.kubernetes.io/not-ready",
        "operator": "Exists",
        "effect": "NoExecute",
        "tolerationSeconds": 300,
    }
    for team in ("research", None):
        response = answer(server, review_of(pod(tolerations=[own, unowed])), team=team)
        assert response["allowed"] is False and response["status"]["code"] == 403
        message = response["status"]["message"]
        assert "reaches nodes" in message and len(message.splitlines()) == 1 and "remove it" in message
    assert answer(server, review_of(pod(tolerations=[own])))["allowed"] is True


def test_kueue_fields_are_left_alone(server: Server) -> None:
    obj = pod(
        {"kueue.x-k8s.io/queue-name": "research-queue"},
        schedulingGates=[{"name": "kueue.x-k8s.io/admission"}],
        nodeSelector={"superkube.io/pool": "gpu", "cloud.provider.com/flavor": "h100"},
        tolerations=[{"key": "flavor.kueue.example/h100", "operator": "Exists", "effect": "NoSchedule"}],
    )
    obj["metadata"]["annotations"] = {"kueue.x-k8s.io/workload": "job-trainer-1a2b"}
    out = patched(obj, answer(server, review_of(obj)))
    for key in ("schedulingGates", "nodeSelector"):
        assert out["spec"][key] == obj["spec"][key]
    assert out["metadata"]["annotations"] == obj["metadata"]["annotations"]
    assert out["metadata"]["labels"] == {**obj["metadata"]["labels"], teams.TEAM_KEY: "research"}
    assert out["spec"]["tolerations"] == [*obj["spec"]["tolerations"], teams.toleration("research")]


def test_a_pod_that_already_has_the_right_tolerations_gets_no_patch(server: Server) -> None:
    obj = pod({teams.TEAM_KEY: "research"}, tolerations=[teams.toleration("research")])
    response = answer(server, review_of(obj))
    assert response["allowed"] is True and "patch" not in response


def test_a_pod_cannot_claim_a_team_its_namespace_is_not(server: Server) -> None:
    for team, claimed, owner in (
        ("research", "pretraining", "team 'research'"),
        (None, "research", "no team"),
    ):
        response = answer(server, review_of(pod({teams.TEAM_KEY: claimed})), team=team)
        assert response["allowed"] is False and response["status"]["code"] == 403
        assert (
            f"labelled {teams.TEAM_KEY}={claimed} but its namespace belongs to {owner}"
            in response["status"]["message"]
        )


def test_a_pod_of_no_team_runs_only_on_nodes_no_team_owns(server: Server) -> None:
    response = answer(server, review_of(pod()), team=None)
    assert response["allowed"] is True and "patch" not in response
    assert "runs only on nodes no team owns" in response["warnings"][0]
    borrowing = answer(server, review_of(pod({teams.BORROW_LABEL: "true"})), team=None)
    assert borrowing["allowed"] is False and "only a team's pods may borrow" in borrowing["status"]["message"]


@pytest.mark.parametrize(
    ("body", "code", "words"),
    [
        (b"{not json", 400, "not JSON"),
        (b'{"apiVersion": "v1", "kind": "Pod"}', 400, "AdmissionReview"),
        (b"[]", 400, "AdmissionReview"),
        (b"", 400, "not JSON"),
    ],
    ids=["malformed JSON", "a pod, not a review", "a list", "empty"],
)
def test_a_malformed_review_is_denied_with_the_reason(
    server: Server, body: bytes, code: int, words: str
) -> None:
    response = answer(server, body)
    assert response["allowed"] is False and response["status"]["code"] == code
    assert words in response["status"]["message"]


def test_an_unknown_team_or_borrow_value_is_denied_saying_how_to_fix_it(server: Server) -> None:
    response = answer(server, review_of(pod()), team="reserch")
    assert response["allowed"] is False and response["status"]["code"] == 403
    assert (
        "'reserch'" in response["status"]["message"]
        and "pretraining, research" in response["status"]["message"]
    )
    response = answer(server, review_of(pod({teams.BORROW_LABEL: "yes"})))
    assert response["allowed"] is False and 'write "true" or "false"' in response["status"]["message"]


def test_what_it_does_not_mutate_is_allowed_unchanged(server: Server) -> None:
    other = answer(
        server,
        review_of({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}}, kind="ConfigMap"),
    )
    assert other["allowed"] is True and "patch" not in other and "Pods only" in other["warnings"][0]
    update = answer(server, review_of(pod({teams.TEAM_KEY: "research"}), operation="UPDATE"))
    assert update["allowed"] is True and "patch" not in update


def test_a_configuration_change_is_read_without_a_restart(server: Server) -> None:
    obj = pod()
    assert answer(server, review_of(obj), team="inference")["allowed"] is False
    original = server.config.read_text()
    try:
        server.config.write_text(
            yaml.safe_dump([*TEAMS, {"selector": {"rack": "c"}, "team": "inference", "priority": 5}])
        )
        assert patched(obj, answer(server, review_of(obj), team="inference"))["spec"]["tolerations"] == [
            teams.toleration("inference")
        ]
        server.config.write_text("- {selector: {}, team: broken}\n")
        broken = answer(server, review_of(pod({teams.TEAM_KEY: "research"})))
        assert broken["allowed"] is False and broken["status"]["code"] == 503
        assert "cannot be used" in broken["status"]["message"]
        assert server.client.get("/healthz").status_code == 503
    finally:
        server.config.write_text(original)
    assert server.client.get("/healthz").status_code == 200


def test_it_serves_only_tls_with_the_certificate_from_our_ca(server: Server, tmp_path: Path) -> None:
    with pytest.raises(httpx.ConnectError):  # a client that trusts another CA refuses it
        other = issue(tmp_path)
        httpx.get(f"{server.url}/healthz", verify=trusting(other["ca"]), timeout=5)
    with pytest.raises(httpx.TransportError):  # and it speaks no plain HTTP
        httpx.get(f"http://127.0.0.1:{server.port}/healthz", timeout=5)
    out = subprocess.run(
        ["openssl", "verify", "-CAfile", str(server.pki["ca"]), str(server.pki["cert"])],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr


def test_a_missing_or_mismatched_key_is_one_line_and_exit_2(server: Server, tmp_path: Path) -> None:
    other = issue(tmp_path)
    for cert, key, words in (
        (tmp_path / "none.crt", other["key"], "no such file"),
        (server.pki["cert"], other["key"], "not a certificate and its key"),
    ):
        proc = subprocess.run(
            [sys.executable, "-m", "superkube.agents.team_webhook", "--config", str(server.config),
             "--cert", str(cert), "--key", str(key), "--port", str(free_port())],
            capture_output=True, text=True, timeout=30, check=False,
        )  # fmt: skip
        assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
        assert words in proc.stderr


def test_a_configuration_file_that_is_not_there_is_a_503_answer() -> None:
    """Before the ConfigMap is mounted (or with a wrong --config), reviews are refused, saying why."""
    config = team_webhook.Config(Path("/nonexistent/teams.yaml"))
    obj = pod({teams.TEAM_KEY: "research"})
    body = json.dumps(review_of(copy.deepcopy(obj))).encode()
    response = team_webhook.review(body, config, "research")["response"]
    assert response["allowed"] is False and response["status"]["code"] == 503


def test_an_update_may_not_add_what_a_creation_could_not_have(server: Server) -> None:
    """Tolerations may be added to a pending pod: an update adding one the pod is not owed is
    refused, as is a change of its team label; its own team's toleration and other changes pass."""
    before = pod({teams.TEAM_KEY: "research"}, tolerations=[teams.toleration("research")])
    stolen = {
        **before,
        "spec": {**before["spec"], "tolerations": [*before["spec"]["tolerations"], UNOWED[0]]},
    }
    refused = answer(server, review_of(stolen, "UPDATE", old=before))
    assert refused["allowed"] is False and "reaches nodes" in refused["status"]["message"]
    relabelled = {**before, "metadata": {**before["metadata"], "labels": {teams.TEAM_KEY: "pretraining"}}}
    refused = answer(server, review_of(relabelled, "UPDATE", old=before))
    assert refused["allowed"] is False and "may not change" in refused["status"]["message"]
    annotated = {**before, "metadata": {**before["metadata"], "annotations": {"example.com/note": "x"}}}
    assert answer(server, review_of(annotated, "UPDATE", old=before))["allowed"] is True


def test_a_pod_may_not_name_its_node_unless_a_kubelet_makes_it(server: Server) -> None:
    bound = pod(nodeName="gpu-b-1")
    refused = answer(server, review_of(bound))
    assert refused["allowed"] is False and "spec.nodeName is set" in refused["status"]["message"]
    mirror = answer(server, review_of(bound, user="system:node:gpu-b-1"))
    assert mirror["allowed"] is True


ALLOWED = 'superkube_team_webhook_admissions_total{code="200",decision="allowed"}'
REFUSED = 'superkube_team_webhook_admissions_total{code="403",decision="denied"}'
UNREAD = 'superkube_team_webhook_admissions_total{code="400",decision="denied"}'
ANSWERED = "superkube_team_webhook_admission_duration_seconds_count"


def test_each_answer_is_counted_once_by_its_decision_and_timed(server: Server) -> None:
    """The served counters move by exactly what was answered: one allowed, two refused by the team
    rules, one review it could not read; the latency histogram counts all four."""
    before = server.metrics()
    assert answer(server, review_of(pod()))["allowed"] is True
    for _ in range(2):
        assert answer(server, review_of(pod({teams.TEAM_KEY: "pretraining"})))["status"]["code"] == 403
    assert answer(server, b"{not json")["status"]["code"] == 400
    after = server.metrics()
    moved = {k: after[k] - before.get(k, 0) for k in (ALLOWED, REFUSED, UNREAD, ANSWERED)}
    assert moved == {ALLOWED: 1, REFUSED: 2, UNREAD: 1, ANSWERED: 4}
    unavailable = 'superkube_team_webhook_admissions_total{code="503",decision="denied"}'
    assert after[unavailable] == before[unavailable]  # its configuration was usable throughout
    assert after['superkube_team_webhook_admission_duration_seconds_bucket{le="+Inf"}'] == after[ANSWERED]


def test_a_configuration_it_cannot_use_is_counted_as_503_answers(tmp_path: Path) -> None:
    """In the application itself: every pod refused while the teams file is missing is counted under
    503, and the time each answer took is observed; the other answers' series are there at 0."""
    import asyncio

    metrics = team_webhook.Metrics()
    transport = httpx.ASGITransport(app=team_webhook.app(tmp_path / "missing.yaml", metrics))

    async def three() -> list[int]:
        async with httpx.AsyncClient(transport=transport, base_url="http://webhook") as client:
            body = json.dumps(review_of(pod())).encode()
            return [(await client.post("/mutate/research", content=body)).json()["response"]["status"]["code"]
                    for _ in range(3)]  # fmt: skip

    assert asyncio.run(three()) == [503, 503, 503]
    assert metrics.value("superkube_team_webhook_admissions_total", decision="denied", code="503") == 3
    assert metrics.value("superkube_team_webhook_admissions_total", decision="allowed", code="200") == 0
    assert metrics.value(ANSWERED) == 3
