"""The scale-up governor as the host service the role runs: one file on python3, PyYAML and
prometheus_client, reading
through the real API server as its own user with only the rights the in-cluster layer grants it, and
writing the scale sets' `max` tags through Azure Resource Manager's Tags API.

Azure cannot run here. Its side is a loopback server that keeps to the documented contract of the two
endpoints the service calls, and refuses what Azure refuses: the instance metadata token endpoint
(the `Metadata: true` header, an api-version, a known identity's client_id) and the Tags API on a
scale set (a bearer token it issued, api-version 2021-04-01, a PATCH whose `operation` is Merge,
Replace or Delete with string tags; a scale set that does not exist is a 404). It keeps each scale
set's tags, so what a test reads back is what a merge left, not what the service said it sent."""

from __future__ import annotations

import ast
import json
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml

from modules.platform import autoscaler as autoscaler_rbac
from superkube.agents import scale_governor as gov
from superkube.cluster import autoscaling
from superkube.harness.apiserver import LocalApi
from tests.agents.conftest import apply
from tests.agents.test_scale_governor import group, status
from tests.conftest import ROOT

SCOPE = "/subscriptions/00000000-0000-0000-0000-00000000abcd/resourceGroups/rg-test"
CLIENT_ID = "6a3c1c4e-0000-4000-8000-000000000001"
VMSS = f"{SCOPE}/providers/Microsoft.Compute/virtualMachineScaleSets/"


class FakeAzure(ThreadingHTTPServer):
    """Instance metadata's token endpoint and the Tags API, on loopback (see the module doc)."""

    def __init__(self, sets: dict[str, dict[str, str]]) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.tags = sets  # scale set name -> its tags
        self.issued: set[str] = set()
        self.tokens_asked = 0
        self.patches: list[tuple[str, dict[str, str]]] = []  # (scale set, tags merged), in order
        self.refuse: set[str] = set()  # scale sets whose next writes answer 409
        self.lock = threading.Lock()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _Handler(BaseHTTPRequestHandler):
    server: FakeAzure

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def answer(self, code: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def error(self, code: int, what: str, message: str) -> None:
        self.answer(code, {"error": {"code": what, "message": message}})

    def do_GET(self) -> None:
        url = urllib.parse.urlsplit(self.path)
        query = dict(urllib.parse.parse_qsl(url.query))
        if url.path != "/metadata/identity/oauth2/token":
            return self.error(404, "NotFound", url.path)
        if self.headers.get("Metadata") != "true":
            return self.error(400, "bad_request", "Required metadata header not specified")
        if query.get("api-version") != gov.IMDS_API_VERSION or not query.get("resource"):
            return self.error(400, "invalid_request", "api-version and resource are required")
        if query.get("client_id") != CLIENT_ID:
            return self.error(400, "invalid_request", "Identity not found")
        with self.server.lock:
            self.server.tokens_asked += 1
            token = f"token-{self.server.tokens_asked}"
            self.server.issued.add(token)
        self.answer(200, {"access_token": token, "expires_on": str(int(time.time()) + 3600),
                          "resource": query["resource"], "token_type": "Bearer"})  # fmt: skip

    def do_PATCH(self) -> None:
        url = urllib.parse.urlsplit(self.path)
        suffix = "/providers/Microsoft.Resources/tags/default"
        auth = self.headers.get("Authorization", "")
        if not (auth.startswith("Bearer ") and auth.removeprefix("Bearer ") in self.server.issued):
            return self.error(401, "InvalidAuthenticationToken", "no valid bearer token")
        if dict(urllib.parse.parse_qsl(url.query)).get("api-version") != gov.TAGS_API_VERSION:
            return self.error(400, "InvalidApiVersionParameter", url.query)
        if not (url.path.startswith(VMSS) and url.path.endswith(suffix)):
            return self.error(404, "ResourceNotFound", url.path)
        name = urllib.parse.unquote(url.path.removeprefix(VMSS).removesuffix(suffix))
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))))
        tags = (body.get("properties") or {}).get("tags")
        if body.get("operation") not in ("Merge", "Replace", "Delete") or not isinstance(tags, dict):
            return self.error(400, "InvalidRequestContent", json.dumps(body))
        if not all(isinstance(v, str) for v in tags.values()):
            return self.error(400, "InvalidRequestContent", "tag values are strings")
        with self.server.lock:
            if name not in self.server.tags:
                return self.error(404, "ResourceNotFound", f"scale set {name}")
            if name in self.server.refuse:
                return self.error(409, "Conflict", f"scale set {name} is being updated")
            if body["operation"] == "Merge":
                self.server.tags[name].update(tags)
            self.server.patches.append((name, dict(tags)))
            merged = dict(self.server.tags[name])
        self.answer(200, {"id": url.path, "name": "default", "properties": {"tags": merged}})


@pytest.fixture
def azure() -> Iterator[FakeAzure]:
    sets = {n: {"min": "0", "max": "900", "cluster-autoscaler-enabled": "true"} for n in ("a", "b")}
    server = FakeAzure(sets)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def tags(azure: FakeAzure) -> gov.AzureTags:
    return gov.AzureTags(SCOPE, CLIENT_ID, azure.url, azure.url + "/metadata/identity/oauth2/token")


def test_the_program_is_one_file_on_python3_pyyaml_and_prometheus_client() -> None:
    """The role copies this one file to the API-server hosts and runs it with Debian's python3,
    python3-yaml and python3-prometheus-client: it may import nothing else, superkube included. The
    roles that run it (and remediation, which imports it) install those packages."""
    tree = ast.parse(Path(gov.__file__).read_text())
    assert not [n for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.level], "a relative import"
    names = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    names |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert names - set(sys.stdlib_module_names) == {"yaml", "prometheus_client"}
    for role in ("scale_governor", "join_tokens", "remediation"):
        defaults = yaml.safe_load((ROOT / "playbooks/roles" / role / "defaults/main.yml").read_text())
        assert {"python3", "python3-yaml", "python3-prometheus-client"} <= set(defaults[f"{role}_packages"])
    # so it names the autoscaler's namespace itself: the same one the plan runs the autoscaler in
    assert gov.NAMESPACE == autoscaling.NAMESPACE


def test_a_write_merges_only_the_max_tag_with_one_token(azure: FakeAzure) -> None:
    tags(azure).set_max({"a": 75, "b": 80})
    assert azure.tags == {
        "a": {"min": "0", "max": "75", "cluster-autoscaler-enabled": "true"},
        "b": {"min": "0", "max": "80", "cluster-autoscaler-enabled": "true"},
    }
    assert azure.tokens_asked == 1  # cached until five minutes before it expires


def test_a_refused_identity_or_a_missing_scale_set_is_one_line(azure: FakeAzure) -> None:
    wrong = gov.AzureTags(SCOPE, "another-client", azure.url, azure.url + "/metadata/identity/oauth2/token")
    with pytest.raises(gov.ServiceError, match=r"another-client's token: HTTP 400 .*Identity not found"):
        wrong.set_max({"a": 1})
    with pytest.raises(gov.ServiceError, match="setting max 5 on scale set c: HTTP 404"):
        tags(azure).set_max({"c": 5})


def test_a_round_lowers_before_it_raises_and_a_refused_lower_stops_it(azure: FakeAzure) -> None:
    """The round that moves room from b to a writes b's lower max first. Where Azure refuses that
    lower, a's raise is not written: for that moment the autoscaler can see less room, never more."""
    seen = [[group("a", 0, 900), group("b", 0, 900)]]
    g = gov.Governor(lambda: status(seen[0]), tags(azure), {"a": 900, "b": 900}, 300, 50)
    g.once()
    assert (azure.tags["a"]["max"], azure.tags["b"]["max"]) == ("75", "75")
    seen[0] = [group("a", 75, 75), group("b", 0, 75)]  # a grew to its max; b did not move
    azure.refuse.add("b")
    with pytest.raises(gov.ServiceError, match="scale set b: HTTP 409"):
        g.once()
    assert (azure.tags["a"]["max"], azure.tags["b"]["max"]) == ("75", "75")
    azure.refuse.clear()
    g.once()  # the next round writes the whole move again, the lower first
    assert azure.patches[-2:] == [("b", {"max": "0"}), ("a", {"max": "225"})]


def test_after_a_lower_lands_and_a_raise_is_refused_the_next_round_writes_only_the_raise(
    azure: FakeAzure,
) -> None:
    """Writes go one scale set at a time, so what landed is known: the next round does not write
    the lower again, and it does not take the landed lower for a raise to order behind it."""
    seen = [[group("a", 0, 900), group("b", 0, 900)]]
    g = gov.Governor(lambda: status(seen[0]), tags(azure), {"a": 900, "b": 900}, 300, 50)
    g.once()
    seen[0] = [group("a", 75, 75), group("b", 0, 75)]
    azure.refuse.add("a")  # b's lower lands, a's raise is refused
    with pytest.raises(gov.ServiceError, match="scale set a: HTTP 409"):
        g.once()
    assert (azure.tags["a"]["max"], azure.tags["b"]["max"]) == ("75", "0")
    azure.refuse.clear()
    before = len(azure.patches)
    g.once()
    assert azure.patches[before:] == [("a", {"max": "225"})]


@pytest.fixture(scope="module")
def reader(api: LocalApi) -> gov.KubeReader:
    """The service's reader as its own user, with the in-cluster layer's Role for it."""
    apply(api, *autoscaler_rbac.governor_manifests(autoscaling.GOVERNOR_USER))
    return gov.KubeReader(api.client_kubeconfig("scale-governor", autoscaling.GOVERNOR_USER))


def set_leader(api: LocalApi, host: str) -> None:
    apply(api, {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                "metadata": {"name": gov.LEASE, "namespace": gov.NAMESPACE},
                "spec": {"holderIdentity": host, "leaseDurationSeconds": 15}})  # fmt: skip


def set_status(api: LocalApi, text: str) -> None:
    apply(api, {"apiVersion": "v1", "kind": "ConfigMap", "data": {"status": text},
                "metadata": {"name": gov.STATUS_CONFIGMAP, "namespace": gov.NAMESPACE}})  # fmt: skip


def test_it_reads_the_status_and_the_lease_and_nothing_else(api: LocalApi, reader: gov.KubeReader) -> None:
    """Against the real API server, as its own user: the autoscaler's status and its lease holder
    are all it may read; anything else is a 403 (RBAC as the in-cluster layer renders it)."""
    text = status([group("a", 3, 9)])
    set_status(api, text)
    set_leader(api, "apiserver-2")
    assert reader.status() == text and reader.leader() == "apiserver-2"
    for path in (f"/api/v1/namespaces/{gov.NAMESPACE}/configmaps/kube-proxy", "/api/v1/nodes",
                 f"/apis/coordination.k8s.io/v1/namespaces/{gov.NAMESPACE}/leases/kube-scheduler"):  # fmt: skip
        with pytest.raises(gov.ServiceError, match="HTTP 403"):
            reader.get(path)


def write_config(path: Path, azure: FakeAzure, **more: Any) -> Path:
    settings = {"scope": SCOPE, "client_id": CLIENT_ID, "ceilings": {"a": 900, "b": 900},
                "safe_join_rate_per_minute": 300, "max_unready": 50, "interval_s": 0.3,
                "arm": azure.url, "imds": azure.url + "/metadata/identity/oauth2/token", **more}  # fmt: skip
    path.write_text(json.dumps(settings))
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def scrape(port: int) -> dict[str, float]:
    """The samples a service serves on /metrics, by name and labels as written."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        text = r.read().decode()
    return {
        line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line and not line.startswith("#")
    }


def wait_for(what: str, done: Any, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def test_the_program_acts_only_beside_the_leading_autoscaler(
    api: LocalApi, reader: gov.KubeReader, azure: FakeAzure, tmp_path: Path
) -> None:
    """The file the role installs, run as its unit runs it: while another host's autoscaler holds
    the lease it writes nothing; once this host's does, it opens the first room within a round or two."""
    set_status(api, status([group("a", 0, 900), group("b", 0, 900)]))
    set_leader(api, "apiserver-2")
    config = write_config(tmp_path / "scale-governor.json", azure)
    kubeconfig = api.dir / "scale-governor.kubeconfig"
    port = free_port()
    cmd = [sys.executable, gov.__file__, "--config", str(config), "--kubeconfig", str(kubeconfig),
           "--host", "apiserver-1", "--metrics-port", str(port), "--metrics-address", "127.0.0.1"]  # fmt: skip
    log = tmp_path / "governor.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
        try:
            time.sleep(2)  # several rounds
            assert azure.patches == [] and proc.poll() is None, log.read_text()
            assert scrape(port)["superkube_scale_governor_leader"] == 0
            set_leader(api, "apiserver-1")
            wait_for("the first max tags", lambda: len(azure.patches) >= 2)
            assert azure.tags["a"]["max"] == azure.tags["b"]["max"] == "75"
            wait_for("the leader gauge", lambda: scrape(port)["superkube_scale_governor_leader"] == 1)
            served = scrape(port)
            assert served['superkube_scale_governor_writes_total{result="written"}'] == 2
            assert served['superkube_scale_governor_writes_total{result="refused"}'] == 0
            assert served['superkube_scale_governor_room_nodes{scale_set="a"}'] == 75
            set_leader(api, "apiserver-3")  # the lead moves on: it stands by again
            wait_for("standing by", lambda: "does not hold the lead" in log.read_text())
            assert scrape(port)["superkube_scale_governor_leader"] == 0
            set_status(api, status([group("a", 75, 75), group("b", 0, 75)]))  # a round would move room
            written = len(azure.patches)
            time.sleep(2)
            assert len(azure.patches) == written, azure.patches[written:]
        finally:
            proc.terminate()
            proc.wait(10)
    assert "took the lead" in log.read_text()


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({"scope": "rg-test"}, "scope must be a resource group's ID"),
        ({"safe_join_rate_per_minute": 1}, "the safe rate at least 2 a minute"),
        ({"ceilings": {}}, "ceilings a map of scale set"),
        ({"surprise": 1}, "want a JSON object with the keys"),
        ({"refresh_s": 0}, "refresh_s and interval_s > 0"),
        ({"max_unready": -1}, "max_unready a count >= 0"),
    ],
)
def test_bad_settings_are_one_line_and_exit_2(
    change: dict[str, Any], says: str, azure: FakeAzure, api: LocalApi, reader: gov.KubeReader, tmp_path: Path
) -> None:
    config = write_config(tmp_path / "bad.json", azure, **change)
    kubeconfig = api.dir / "scale-governor.kubeconfig"
    run = subprocess.run([sys.executable, gov.__file__, "--config", str(config), "--kubeconfig", str(kubeconfig),
                          "--check"], capture_output=True, text=True)  # fmt: skip
    assert run.returncode == 2 and says in run.stderr and len(run.stderr.strip().splitlines()) == 1, (
        run.stderr
    )
    good = write_config(tmp_path / "good.json", azure)
    assert gov.main(["--config", str(good), "--kubeconfig", str(kubeconfig), "--check"]) == 0
