"""The control plane on the real lab: 5 main and 3 events etcd members on their own hosts over TLS,
the API server's rendered flags and the gang scheduler's configuration.

Runs in file order on a lab of its own shape; the disruptive tests come last.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import shlex
import time
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from typer.testing import CliRunner

from superkube import fleet as runner
from superkube import lab
from superkube.cli import app
from tests.lab.conftest import sh

ROOT = Path(__file__).resolve().parents[2]
ETCDCTL = ". /etc/etcd/etcdctl-{c}.env && etcdctl --command-timeout=10s "


@pytest.fixture(scope="module")
def converged(control_plane: lab.Lab) -> dict[str, Any]:
    result = runner.converge(control_plane.inventory)
    why = {n: (h.task, h.message) for n, h in result.hosts.items() if not h.healthy}
    assert result.ok, why
    return {"first": result, "pki": _pki_digest(control_plane)}


def _pki_digest(fleet: lab.Lab) -> dict[str, str]:
    pki = Path(fleet.state_dir) / "pki"
    return {
        str(p.relative_to(pki)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(pki.rglob("*.*"))
    }


def addresses(fleet: lab.Lab, group: str) -> list[str]:
    return sorted(h.address for h in fleet.hosts if h.group == group)


def etcdctl(fleet: lab.Lab, host: str, cluster: str, args: str) -> str:
    return sh(fleet, host, ETCDCTL.format(c=cluster) + args)


def members(fleet: lab.Lab, host: str, cluster: str) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = json.loads(etcdctl(fleet, host, cluster, "member list -w json"))["members"]
    return found


def wait_healthy(fleet: lab.Lab, host: str, cluster: str, timeout: float = 90) -> None:
    end = time.monotonic() + timeout
    while True:
        proc = lab.ssh(fleet, fleet.host(host), ETCDCTL.format(c=cluster) + "endpoint health --cluster")
        if proc.returncode == 0:
            return
        assert time.monotonic() < end, f"{cluster} not healthy from {host}: {proc.stdout} {proc.stderr}"
        time.sleep(2)


def test_both_clusters_form_on_their_own_hosts_over_tls(
    control_plane: lab.Lab, converged: dict[str, Any]
) -> None:
    main = members(control_plane, "etcd-main-1", "main")
    events = members(control_plane, "etcd-events-1", "events")
    assert len(main) == 5 and len(events) == 3
    main_peers = sorted(m["peerURLs"][0] for m in main)
    events_peers = sorted(m["peerURLs"][0] for m in events)
    assert main_peers == [f"https://{a}:2380" for a in addresses(control_plane, "etcd_main")]
    assert events_peers == [f"https://{a}:2380" for a in addresses(control_plane, "etcd_events")]
    assert all(u.startswith("https://") for m in main + events for u in m["clientURLs"])
    wait_healthy(control_plane, "etcd-main-1", "main")
    wait_healthy(control_plane, "etcd-events-1", "events")


def test_clients_without_a_cert_are_refused(control_plane: lab.Lab, converged: dict[str, Any]) -> None:
    ip = control_plane.host("etcd-main-2").address
    ca = "--cacert /etc/etcd/pki/ca.crt"
    with_cert = f"curl -sS {ca} --cert /etc/etcd/pki/member.crt --key /etc/etcd/pki/member.key https://{ip}:2379/version"
    assert "etcdserver" in sh(control_plane, "etcd-main-1", with_cert)
    for host in ("etcd-main-1", "etcd-events-1", "apiservers-1"):
        no_cert = lab.ssh(control_plane, control_plane.host(host), f"curl -sS {ca} https://{ip}:2379/version")
        assert no_cert.returncode != 0 and "etcdserver" not in no_cert.stdout, (host, no_cert.stdout)
        plain = lab.ssh(control_plane, control_plane.host(host), f"curl -sS http://{ip}:2379/version")
        assert plain.returncode != 0 and "etcdserver" not in plain.stdout, (host, plain.stdout)
    # etcdctl with the CA but no client certificate
    refused = lab.ssh(
        control_plane,
        control_plane.host("etcd-main-1"),
        f"etcdctl --command-timeout=5s --endpoints https://{ip}:2379 {ca} get /anything",
    )
    assert refused.returncode != 0


def test_a_key_stays_in_its_own_cluster(control_plane: lab.Lab, converged: dict[str, Any]) -> None:
    etcdctl(control_plane, "etcd-events-1", "events", "put /superkube/test/only-events yes")
    etcdctl(control_plane, "etcd-main-1", "main", "put /superkube/test/only-main yes")
    assert (
        etcdctl(
            control_plane, "etcd-events-2", "events", "get /superkube/test/only-events --print-value-only"
        ).strip()
        == "yes"
    )
    assert etcdctl(control_plane, "etcd-main-2", "main", "get /superkube/test/only-events").strip() == ""
    assert etcdctl(control_plane, "etcd-events-2", "events", "get /superkube/test/only-main").strip() == ""
    assert (
        etcdctl(
            control_plane, "etcd-main-3", "main", "get /superkube/test/only-main --print-value-only"
        ).strip()
        == "yes"
    )


def test_a_second_converge_changes_nothing_and_keeps_every_cert(
    control_plane: lab.Lab, converged: dict[str, Any]
) -> None:
    on_host = {h: sh(control_plane, h, "sha256sum /etc/etcd/pki/*") for h in ("etcd-main-1", "etcd-events-3")}
    api = sh(control_plane, "apiservers-1", "sha256sum /etc/kubernetes/pki/*.* /etc/kubernetes/pki/etcd/*")
    again = runner.converge(control_plane.inventory)
    assert again.ok, {n: (h.task, h.message) for n, h in again.hosts.items() if not h.healthy}
    assert {n: h.changed for n, h in again.hosts.items() if h.changed} == {}
    assert _pki_digest(control_plane) == converged["pki"]
    assert {"etcd/ca.crt", "etcd/ca.key", "kubernetes/ca.crt", "kubernetes/ca.key"} <= set(converged["pki"])
    for host, digest in on_host.items():
        assert sh(control_plane, host, "sha256sum /etc/etcd/pki/*") == digest
    assert (
        sh(control_plane, "apiservers-1", "sha256sum /etc/kubernetes/pki/*.* /etc/kubernetes/pki/etcd/*")
        == api
    )


def _flags(env_text: str) -> dict[str, str]:
    # the value runs from the opening quote over backslash-continued lines to the closing quote
    (value,) = shlex.split(env_text.split("KUBE_APISERVER_ARGS=", 1)[1].replace("\\\n", " "))
    return dict(arg[2:].split("=", 1) for arg in value.split())


def _flag_plugin() -> Any:
    spec = importlib.util.spec_from_file_location(
        "superkube_flags", ROOT / "playbooks/filter_plugins/superkube_flags.py"
    )
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_apiserver_flags_are_kube_apiserver_1_35_flags_and_split_events(
    control_plane: lab.Lab, converged: dict[str, Any]
) -> None:
    flags = _flags(sh(control_plane, "apiservers-1", "cat /etc/kubernetes/kube-apiserver.env"))
    known = yaml.safe_load((ROOT / "playbooks/roles/kube_apiserver/vars/flags-1.35.yml").read_text())[
        "kube_apiserver_known_flags"
    ]
    assert _flag_plugin().flag_problems(flags, known) == []
    main = [f"https://{a}:2379" for a in addresses(control_plane, "etcd_main")]
    events = [f"https://{a}:2379" for a in addresses(control_plane, "etcd_events")]
    assert sorted(flags["etcd-servers"].split(",")) == main
    override = flags["etcd-servers-overrides"]
    assert override.startswith("/events#") and "," not in override
    assert sorted(override.removeprefix("/events#").split(";")) == events
    assert flags["service-cluster-ip-range"] == control_plane.service_cidr
    # the files the flags name exist on the host, and the etcd client cert is accepted by both clusters
    for name in (
        "etcd-cafile",
        "etcd-certfile",
        "etcd-keyfile",
        "tls-cert-file",
        "client-ca-file",
        "audit-policy-file",
    ):
        sh(control_plane, "apiservers-1", f"test -s {flags[name]}")
    client = f"--cacert {flags['etcd-cafile']} --cert {flags['etcd-certfile']} --key {flags['etcd-keyfile']}"
    for url in (main[0], events[0]):
        assert "etcdserver" in sh(control_plane, "apiservers-1", f"curl -sS {client} {url}/version")
    policy = yaml.safe_load(sh(control_plane, "apiservers-1", f"cat {flags['audit-policy-file']}"))
    assert policy["apiVersion"] == "audit.k8s.io/v1" and policy["kind"] == "Policy"
    levels = {"None", "Metadata", "Request", "RequestResponse"}
    assert policy["rules"] and all(r["level"] in levels for r in policy["rules"])


# kubescheduler.config.k8s.io/v1 (Kubernetes 1.34/1.35) and CoschedulingArgs of scheduler-plugins
# v0.34.x: every field, closed, so a misspelt or removed field fails.
_PLUGIN = {
    "type": "object",
    "additionalProperties": False,
    "required": ["name"],
    "properties": {"name": {"type": "string"}, "weight": {"type": "integer"}},
}
_SET = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "enabled": {"type": "array", "items": _PLUGIN},
        "disabled": {"type": "array", "items": _PLUGIN},
    },
}
_POINTS = (
    "preEnqueue",
    "queueSort",
    "preFilter",
    "filter",
    "postFilter",
    "preScore",
    "score",
    "reserve",
    "permit",
    "preBind",
    "bind",
    "postBind",
    "multiPoint",
)
SCHEDULER_V1 = {
    "type": "object",
    "additionalProperties": False,
    "required": ["apiVersion", "kind", "profiles"],
    "properties": {
        "apiVersion": {"const": "kubescheduler.config.k8s.io/v1"},
        "kind": {"const": "KubeSchedulerConfiguration"},
        "parallelism": {"type": "integer"},
        "leaderElection": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                k: {}
                for k in (
                    "leaderElect",
                    "leaseDuration",
                    "renewDeadline",
                    "retryPeriod",
                    "resourceLock",
                    "resourceName",
                    "resourceNamespace",
                )
            },
        },
        "clientConnection": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                k: {} for k in ("kubeconfig", "acceptContentTypes", "contentType", "qps", "burst")
            },
        },
        "enableProfiling": {"type": "boolean"},
        "enableContentionProfiling": {"type": "boolean"},
        "percentageOfNodesToScore": {"type": "integer"},
        "podInitialBackoffSeconds": {"type": "integer"},
        "podMaxBackoffSeconds": {"type": "integer"},
        "delayCacheUntilActive": {"type": "boolean"},
        "extenders": {"type": "array"},
        "profiles": {
            "type": "array",
            "items": {
                "type": "object",
                "additionalProperties": False,
                "properties": {
                    "schedulerName": {"type": "string"},
                    "percentageOfNodesToScore": {"type": "integer"},
                    "plugins": {
                        "type": "object",
                        "additionalProperties": False,
                        "properties": {p: _SET for p in _POINTS},
                    },
                    "pluginConfig": {
                        "type": "array",
                        "items": {
                            "type": "object",
                            "additionalProperties": False,
                            "required": ["name"],
                            "properties": {"name": {"type": "string"}, "args": {"type": "object"}},
                        },
                    },
                },
            },
        },
    },
}
COSCHEDULING_ARGS_V034 = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "apiVersion": {},
        "kind": {},
        "permitWaitingTimeSeconds": {"type": "integer", "minimum": 1},
        "podGroupBackoffSeconds": {"type": "integer", "minimum": 0},
        "podGroupRejectPercentage": {"type": "integer"},
    },
}
PODGROUP_SPEC_V1ALPHA1 = {"minMember", "minResources", "scheduleTimeoutSeconds"}
PODGROUP_STATUS_V1ALPHA1 = {"phase", "occupiedBy", "running", "succeeded", "failed", "scheduleStartTime"}


def test_scheduler_runs_coscheduling_as_the_only_profile(
    control_plane: lab.Lab, converged: dict[str, Any]
) -> None:
    config = yaml.safe_load(sh(control_plane, "apiservers-1", "cat /etc/kubernetes/scheduler-config.yaml"))
    jsonschema.validate(config, SCHEDULER_V1)
    (profile,) = config["profiles"]
    assert profile["schedulerName"] == "default-scheduler"  # replaces the default scheduler
    assert profile["plugins"]["queueSort"] == {
        "enabled": [{"name": "Coscheduling"}],
        "disabled": [{"name": "*"}],
    }
    assert profile["plugins"]["multiPoint"]["enabled"] == [{"name": "Coscheduling"}]
    (args,) = [c["args"] for c in profile["pluginConfig"] if c["name"] == "Coscheduling"]
    jsonschema.validate(args, COSCHEDULING_ARGS_V034)
    pod = yaml.safe_load(
        sh(control_plane, "apiservers-1", "cat /etc/kubernetes/manifests/kube-scheduler.yaml")
    )
    assert pod["spec"]["containers"][0]["image"] == "registry.k8s.io/scheduler-plugins/kube-scheduler:v0.34.7"


def test_podgroup_crd_and_controller(control_plane: lab.Lab, converged: dict[str, Any]) -> None:
    crd = yaml.safe_load(
        sh(control_plane, "apiservers-1", "cat /etc/kubernetes/addons/gang-scheduler/podgroup-crd.yaml")
    )
    assert crd["metadata"]["name"] == "podgroups.scheduling.x-k8s.io"
    (version,) = crd["spec"]["versions"]
    assert (crd["spec"]["group"], version["name"], version["storage"]) == (
        "scheduling.x-k8s.io",
        "v1alpha1",
        True,
    )
    schema = version["schema"]["openAPIV3Schema"]
    assert set(schema["properties"]["spec"]["properties"]) == PODGROUP_SPEC_V1ALPHA1
    assert set(schema["properties"]["status"]["properties"]) == PODGROUP_STATUS_V1ALPHA1
    gang = {
        "apiVersion": "scheduling.x-k8s.io/v1alpha1",
        "kind": "PodGroup",
        "metadata": {"name": "job"},
        "spec": {
            "minMember": 64,
            "minResources": {"nvidia.com/gpu": 512, "cpu": "100"},
            "scheduleTimeoutSeconds": 300,
        },
    }
    jsonschema.validate(gang, schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({**gang, "spec": {"minMember": 0}}, schema)
    docs = list(
        yaml.safe_load_all(
            sh(control_plane, "apiservers-1", "cat /etc/kubernetes/addons/gang-scheduler/controller.yaml")
        )
    )
    (deployment,) = [d for d in docs if d["kind"] == "Deployment"]
    image = deployment["spec"]["template"]["spec"]["containers"][0]["image"]
    assert image == "registry.k8s.io/scheduler-plugins/controller:v0.34.7"


def test_etcd_status_shows_both_clusters(control_plane: lab.Lab, converged: dict[str, Any]) -> None:
    result = CliRunner().invoke(
        app, ["etcd", "status", "--inventory", str(control_plane.inventory), "--output", "json"]
    )
    assert result.exit_code == 0, result.output
    clusters = json.loads(result.output)["clusters"]
    for name, count, group in (("main", 5, "etcd_main"), ("events", 3, "etcd_events")):
        c = clusters[name]
        assert (c["member_count"], c["healthy"], c["quorum"]) == (count, count, True)
        assert sum(m["leader"] for m in c["members"]) == 1 and c["leader"] is not None
        assert sorted(m["host"] for m in c["members"]) == sorted(
            h.name for h in control_plane.hosts if h.group == group
        )
        assert all(m["db_size"] > 0 for m in c["members"])


def test_main_writes_with_two_members_down_and_they_rejoin(
    control_plane: lab.Lab, converged: dict[str, Any]
) -> None:
    down = ("etcd-main-4", "etcd-main-5")
    for host in down:
        sh(control_plane, host, "systemctl stop etcd-main.service")
    try:
        etcdctl(control_plane, "etcd-main-1", "main", "put /superkube/test/while-two-down written")
        assert (
            etcdctl(
                control_plane, "etcd-main-2", "main", "get /superkube/test/while-two-down --print-value-only"
            ).strip()
            == "written"
        )
        result = CliRunner().invoke(
            app, ["etcd", "status", "--inventory", str(control_plane.inventory), "--output", "json"]
        )
        main = json.loads(result.output)["clusters"]["main"]
        assert (main["healthy"], main["quorum"]) == (3, True)
    finally:
        for host in down:
            sh(control_plane, host, "systemctl start etcd-main.service")
    wait_healthy(control_plane, "etcd-main-1", "main")
    for host in down:  # a serializable read answers from the member's own copy: it caught up
        value = etcdctl(
            control_plane,
            host,
            "main",
            "get /superkube/test/while-two-down --consistency=s --print-value-only",
        )
        assert value.strip() == "written"


def test_events_down_leaves_main_alone(control_plane: lab.Lab, converged: dict[str, Any]) -> None:
    events = [h.name for h in control_plane.hosts if h.group == "etcd_events"]
    for host in events:
        sh(control_plane, host, "systemctl stop etcd-events.service")
    try:
        etcdctl(control_plane, "etcd-main-1", "main", "put /superkube/test/events-down fine")
        assert (
            etcdctl(
                control_plane, "etcd-main-3", "main", "get /superkube/test/events-down --print-value-only"
            ).strip()
            == "fine"
        )
        sh(control_plane, "etcd-main-1", ETCDCTL.format(c="main") + "endpoint health --cluster")
    finally:
        for host in events:
            sh(control_plane, host, "systemctl start --no-block etcd-events.service")
    wait_healthy(control_plane, "etcd-events-1", "events")
