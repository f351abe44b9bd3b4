"""The control plane on the real lab: 5 main and 3 events etcd members on their own hosts over TLS,
the API server's rendered flags and the gang scheduler's configuration.

Runs in file order on the control-plane lab, after the modules that joined its nodes and disturbed
its members and hosts (tests/lab/conftest.py orders them); the disruptive tests come last.
"""

from __future__ import annotations

import base64
import hashlib
import json
import shlex
import subprocess
import time
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from typer.testing import CliRunner

from superkube.agents import scale_governor
from superkube.cli import app
from superkube.cluster import autoscaling, gang, kube, reference
from superkube.fleet import converge as runner
from superkube.harness import build
from superkube.lab import machines
from superkube.lab.state import LAB_STACK, Lab
from superkube.plan import engine as planning
from tests.lab.conftest import Labs, sh

ROOT = Path(__file__).resolve().parents[2]
ETCDCTL = ". /etc/etcd/etcdctl-{c}.env && etcdctl --command-timeout=10s "


@pytest.fixture(scope="module")
def converged(labs: Labs, control_plane: Lab) -> dict[str, Any]:
    """The lab's one converge: the first run when this module runs alone, else the run the modules
    before it made (whose joined nodes and restarted members the second converge must leave alone)."""
    return {"first": labs.converge(control_plane), "pki": _pki_digest(control_plane)}


def _pki_digest(fleet: Lab) -> dict[str, str]:
    pki = Path(fleet.state_dir) / "pki"
    return {
        str(p.relative_to(pki)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(pki.rglob("*.*"))
    }


def addresses(fleet: Lab, group: str) -> list[str]:
    return sorted(h.address for h in fleet.hosts if h.group == group)


def etcdctl(fleet: Lab, host: str, cluster: str, args: str) -> str:
    return sh(fleet, host, ETCDCTL.format(c=cluster) + args)


def members(fleet: Lab, host: str, cluster: str) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = json.loads(etcdctl(fleet, host, cluster, "member list -w json"))["members"]
    return found


def wait_healthy(fleet: Lab, host: str, cluster: str, timeout: float = 90) -> None:
    end = time.monotonic() + timeout
    while True:
        proc = machines.ssh(fleet, fleet.host(host), ETCDCTL.format(c=cluster) + "endpoint health --cluster")
        if proc.returncode == 0:
            return
        assert time.monotonic() < end, f"{cluster} not healthy from {host}: {proc.stdout} {proc.stderr}"
        time.sleep(2)


def test_both_clusters_form_on_their_own_hosts_over_tls(
    control_plane: Lab, converged: dict[str, Any]
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


def test_every_member_runs_the_pinned_etcd_from_the_labs_build(
    control_plane: Lab, converged: dict[str, Any]
) -> None:
    release = build.release()["etcd"]
    for name in ("etcd", "etcdctl"):
        assert control_plane.builds[name]["version"] == f"v{release['version']}"
    client = "--cacert /etc/etcd/pki/ca.crt --cert /etc/etcd/pki/member.crt --key /etc/etcd/pki/member.key"
    for host in [h.name for h in control_plane.hosts if h.group in ("etcd_main", "etcd_events")]:
        ip = control_plane.host(host).address
        # the unit runs the binary production's tarball puts in the same place, as the build made it
        assert "ExecStart=/usr/local/bin/etcd " in sh(
            control_plane, host, "cat /etc/systemd/system/etcd-*.service"
        )
        for name in ("etcd", "etcdctl"):
            digest = sh(control_plane, host, f"sha256sum /usr/local/bin/{name}").split()[0]
            assert digest == control_plane.builds[name]["sha256"], (host, name)
        version = json.loads(sh(control_plane, host, f"curl -sS {client} https://{ip}:2379/version"))
        assert version["etcdserver"] == release["version"], host
        # no distribution etcd is left on the host to be started by mistake
        assert sh(control_plane, host, "test -e /usr/bin/etcd || echo absent").strip() == "absent"


def test_clients_without_a_cert_are_refused(control_plane: Lab, converged: dict[str, Any]) -> None:
    ip = control_plane.host("etcd-main-2").address
    ca = "--cacert /etc/etcd/pki/ca.crt"
    with_cert = f"curl -sS {ca} --cert /etc/etcd/pki/member.crt --key /etc/etcd/pki/member.key https://{ip}:2379/version"
    assert "etcdserver" in sh(control_plane, "etcd-main-1", with_cert)
    for host in ("etcd-main-1", "etcd-events-1", "apiservers-1"):
        no_cert = machines.ssh(
            control_plane, control_plane.host(host), f"curl -sS {ca} https://{ip}:2379/version"
        )
        assert no_cert.returncode != 0 and "etcdserver" not in no_cert.stdout, (host, no_cert.stdout)
        plain = machines.ssh(control_plane, control_plane.host(host), f"curl -sS http://{ip}:2379/version")
        assert plain.returncode != 0 and "etcdserver" not in plain.stdout, (host, plain.stdout)
    # etcdctl with the CA but no client certificate
    refused = machines.ssh(
        control_plane,
        control_plane.host("etcd-main-1"),
        f"etcdctl --command-timeout=5s --endpoints https://{ip}:2379 {ca} get /anything",
    )
    assert refused.returncode != 0


def test_a_key_stays_in_its_own_cluster(control_plane: Lab, converged: dict[str, Any]) -> None:
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
    control_plane: Lab, converged: dict[str, Any]
) -> None:
    on_host = {h: sh(control_plane, h, "sha256sum /etc/etcd/pki/*") for h in ("etcd-main-1", "etcd-events-1")}
    api = sh(control_plane, "apiservers-1", "sha256sum /etc/kubernetes/pki/*.* /etc/kubernetes/pki/etcd/*")
    # every role, on the first host of each group and on a host of each kind the earlier modules
    # disturbed (main members stopped and started, the events cluster stopped, an API server host
    # powered off): hosts of a group run the same tasks, and a no-op run costs a minute a host here
    groups = sorted({h.group for h in control_plane.hosts})
    first = [next(h.name for h in control_plane.hosts if h.group == g) for g in groups]
    disturbed = ["etcd-main-4", *(h.name for h in control_plane.hosts if h.group == "apiservers")]
    limit = sorted({*first, *disturbed} & set(converged["first"].hosts))  # not the lab's own hub and internet
    again = runner.converge(control_plane.inventory, limit=",".join(limit))
    assert again.ok, {n: (h.task, h.message) for n, h in again.hosts.items() if not h.healthy}
    assert sorted(again.hosts) == limit
    assert {n: h.changed_tasks for n, h in again.hosts.items() if h.changed} == {}
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


def test_apiserver_flags_split_events_and_point_at_real_files(
    control_plane: Lab, converged: dict[str, Any]
) -> None:
    # (that every flag is a kube-apiserver 1.35 flag is checked offline, against the release's list;
    # here: what the flags point at is real on the host)
    flags = _flags(sh(control_plane, "apiservers-1", "cat /etc/kubernetes/kube-apiserver.env"))
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


# CoschedulingArgs of scheduler-plugins v0.34.x: every field, closed, so a misspelt or removed field fails.
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


def test_scheduler_runs_coscheduling_as_the_only_profile(
    control_plane: Lab, converged: dict[str, Any]
) -> None:
    config = yaml.safe_load(sh(control_plane, "apiservers-1", "cat /etc/kubernetes/scheduler-config.yaml"))
    assert reference.problems(config, "1.35.0") == []  # every field against the release's Go types
    (profile,) = config["profiles"]
    assert profile["schedulerName"] == gang.SCHEDULER_NAME == "default-scheduler"  # the only scheduler
    assert profile["plugins"]["queueSort"] == {
        "enabled": [{"name": "Coscheduling"}],
        "disabled": [{"name": "*"}],
    }
    assert profile["plugins"]["multiPoint"]["enabled"] == [{"name": "Coscheduling"}]
    (args,) = [c["args"] for c in profile["pluginConfig"] if c["name"] == "Coscheduling"]
    jsonschema.validate(args, COSCHEDULING_ARGS_V034)
    # a host service like every control-plane component, on the scheduler-plugins build pinned by digest
    unit = sh(control_plane, "apiservers-1", "cat /etc/systemd/system/kube-scheduler.service")
    assert "ExecStart=/usr/local/bin/kube-scheduler-ae94c1224ef5 $KUBE_SCHEDULER_ARGS" in unit
    assert (
        sh(
            control_plane,
            "apiservers-1",
            "test -e /etc/kubernetes/manifests/kube-scheduler.yaml || echo none",
        ).strip()
        == "none"
    )


def test_the_autoscaler_is_a_host_service_beside_the_scheduler(
    control_plane: Lab, converged: dict[str, Any]
) -> None:
    """cluster-autoscaler runs where the scheduler does, with the plan's flags, its own user and the
    Azure settings from the VM's tags (empty in the lab, whose VMs have none)."""
    unit = sh(control_plane, "apiservers-1", "cat /etc/systemd/system/cluster-autoscaler.service")
    assert (
        f"ExecStart=/usr/local/bin/cluster-autoscaler-v{autoscaling.VERSION} $CLUSTER_AUTOSCALER_ARGS" in unit
    )
    assert "EnvironmentFile=/etc/kubernetes/cluster-autoscaler.azure.env" in unit
    env = sh(control_plane, "apiservers-1", "cat /etc/kubernetes/cluster-autoscaler.env")
    args = [line.strip().rstrip("\\").strip() for line in env.splitlines() if line.strip().startswith("--")]
    assert "--kubeconfig=/etc/kubernetes/cluster-autoscaler.conf" in args
    assert set(control_plane.facts["autoscaler_flags"]) <= set(args)  # the plan's own command line
    assert autoscaling.unknown_flags(args) == []
    azure = sh(control_plane, "apiservers-1", "cat /etc/kubernetes/cluster-autoscaler.azure.env")
    assert "ARM_VM_TYPE=vmss" in azure and "ARM_USER_ASSIGNED_IDENTITY_ID=\n" in azure + "\n"
    cert = "/etc/kubernetes/pki/cluster-autoscaler.crt"
    assert _subject(control_plane, "apiservers-1", cert) == f"CN={autoscaling.USER}"


def test_the_scale_governor_is_installed_beside_the_autoscaler(
    control_plane: Lab, converged: dict[str, Any]
) -> None:
    """The governor's program, settings, kubeconfig and unit land on every API server by converge, as
    its own user; the lab does not start it (no Azure to write to: tests/agents runs the same file
    against the real API server)."""
    program = Path(scale_governor.__file__).read_bytes()
    settings = control_plane.facts["scale_governor"]
    assert settings["ceilings"] and settings["safe_join_rate_per_minute"] > 0
    for host in (h.name for h in control_plane.hosts if h.group == "apiservers"):
        installed = sh(control_plane, host, "sha256sum /usr/local/lib/superkube/scale_governor.py").split()[0]
        assert installed == hashlib.sha256(program).hexdigest(), host
        written = json.loads(sh(control_plane, host, "cat /etc/kubernetes/scale-governor.json"))
        assert written == {**settings, "scope": "", "client_id": ""}, host
        config = yaml.safe_load(sh(control_plane, host, "cat /etc/kubernetes/scale-governor.conf"))
        (user,) = config["users"]
        assert user["name"] == autoscaling.GOVERNOR_USER, host
        assert (
            _subject(control_plane, host, user["user"]["client-certificate"])
            == f"CN={autoscaling.GOVERNOR_USER}"
        )
        unit = "/etc/systemd/system/superkube-scale-governor.service"
        verify = machines.ssh(control_plane, control_plane.host(host), f"systemd-analyze verify {unit}")
        assert [line for line in (verify.stdout + verify.stderr).splitlines() if line.strip()] == [], host
        state = machines.ssh(
            control_plane, control_plane.host(host), "systemctl is-enabled superkube-scale-governor"
        )
        assert state.stdout.strip() == "disabled", host


def test_etcd_status_shows_both_clusters(control_plane: Lab, converged: dict[str, Any]) -> None:
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


# --- the Kubernetes wiring: certificates, kubeconfigs, units and node registration ----------------


@pytest.fixture(scope="module")
def flagship() -> Any:
    """The plan the lab's hosts sit in: the facts every rendered file must agree with."""
    return planning.run(ROOT, LAB_STACK)


PKI = "/etc/kubernetes/pki"


def _subject(fleet: Lab, host: str, cert: str) -> str:
    return (
        sh(fleet, host, f"openssl x509 -in {cert} -noout -subject -nameopt RFC2253")
        .strip()
        .removeprefix("subject=")
    )


def test_kubernetes_certificates_verify_and_carry_the_plans_names(
    control_plane: Lab, converged: dict[str, Any], flagship: Any
) -> None:
    for cert, ca in (
        ("apiserver.crt", "ca.crt"),
        ("apiserver-kubelet-client.crt", "ca.crt"),
        ("admin.crt", "ca.crt"),
        ("controller-manager.crt", "ca.crt"),
        ("scheduler.crt", "ca.crt"),
        ("front-proxy-client.crt", "front-proxy-ca.crt"),
        ("etcd/apiserver-etcd-client.crt", "etcd/ca.crt"),
    ):
        out = sh(control_plane, "apiservers-1", f"openssl verify -CAfile {PKI}/{ca} {PKI}/{cert}")
        assert out.strip() == f"{PKI}/{cert}: OK"
    for host in ("gpu-1", "cpu-1", "nat"):
        out = sh(control_plane, host, f"openssl verify -CAfile {PKI}/ca.crt {PKI}/kube-proxy.crt")
        assert out.strip().endswith(": OK")
    # a certificate of another CA is refused: the check can fail
    foreign = machines.ssh(
        control_plane,
        control_plane.host("apiservers-1"),
        f"openssl verify -CAfile {PKI}/front-proxy-ca.crt {PKI}/apiserver.crt",
    )
    assert foreign.returncode != 0
    sans = sh(
        control_plane, "apiservers-1", f"openssl x509 -in {PKI}/apiserver.crt -noout -ext subjectAltName"
    )
    entries = {e.strip() for e in sans.splitlines()[1].split(",")}
    addresses = flagship.addresses
    assert {e.removeprefix("IP Address:") for e in entries if e.startswith("IP Address:")} == {
        *kube.apiserver_ip_sans(addresses),
        "127.0.0.1",
    }
    assert str(addresses.apiserver_lb_ip) in sans and all(str(ip) in sans for ip in addresses.apiserver_ips)
    assert {e.removeprefix("DNS:") for e in entries if e.startswith("DNS:")} == {
        *kube.apiserver_dns_names(),
        "localhost",
    }
    # identities the API server's RBAC knows
    assert (
        _subject(control_plane, "apiservers-1", f"{PKI}/admin.crt") == "CN=superkube-admin,O=system:masters"
    )
    assert (
        _subject(control_plane, "apiservers-1", f"{PKI}/controller-manager.crt")
        == "CN=system:kube-controller-manager"
    )
    assert _subject(control_plane, "apiservers-1", f"{PKI}/scheduler.crt") == "CN=system:kube-scheduler"
    assert _subject(control_plane, "gpu-1", f"{PKI}/kube-proxy.crt") == "CN=system:kube-proxy"
    # every API server and the controller-manager share one service-account key pair
    assert (
        sh(control_plane, "apiservers-1", f"sha256sum < {PKI}/service-account.key")
        == hashlib.sha256(
            (Path(control_plane.state_dir) / "pki/kubernetes/service-account.key").read_bytes()
        ).hexdigest()
        + "  -\n"
    )


def kubectl_view(path: Path) -> dict[str, Any]:
    """The kubeconfig as kubectl itself reads it (fails the test if kubectl cannot)."""
    view = subprocess.run(
        ["kubectl", "config", "view", "--raw", "-o", "json", "--kubeconfig", str(path)],
        capture_output=True,
        text=True,
        check=True,
    )
    return dict(json.loads(view.stdout))


KUBECONFIGS = (
    ("apiservers-1", "/etc/kubernetes/admin.conf"),
    ("apiservers-1", "/etc/kubernetes/controller-manager.conf"),
    ("apiservers-1", "/etc/kubernetes/scheduler.conf"),
    ("gpu-1", "/etc/kubernetes/bootstrap-kubelet.conf"),
    ("gpu-1", "/etc/kubernetes/kube-proxy.conf"),
    ("cpu-1", "/etc/kubernetes/bootstrap-kubelet.conf"),
    ("nat", "/etc/kubernetes/kube-proxy.conf"),
)


@pytest.mark.parametrize(("host", "path"), KUBECONFIGS, ids=[f"{h}:{p}" for h, p in KUBECONFIGS])
def test_every_kubeconfig_parses_and_points_at_the_plans_load_balancer(
    host: str, path: str, control_plane: Lab, converged: dict[str, Any], flagship: Any, tmp_path: Path
) -> None:
    """Off the API server hosts, every client goes through the load balancer; on them, to the API
    server beside it (Azure's load balancer drops a backend's flow to its own frontend when it is
    balanced back to that backend)."""
    local = tmp_path / "kubeconfig"
    local.write_text(sh(control_plane, host, f"cat {path}"))
    config = kubectl_view(local)
    ((cluster,),) = [[c["cluster"] for c in config["clusters"]]]
    if control_plane.host(host).group == "apiservers":
        assert cluster["server"] == f"https://127.0.0.1:{kube.APISERVER_PORT}"
    else:
        assert cluster["server"] == kube.apiserver_url(flagship.addresses.apiserver_lb_ip)
    sh(control_plane, host, f"openssl x509 -in {cluster['certificate-authority']} -noout")
    ((user,),) = [[u["user"] for u in config["users"]]]
    if "token" in user:
        token = (Path(control_plane.state_dir) / "pki/kubernetes/bootstrap.token").read_text().strip()
        assert user["token"] == token and path.endswith("bootstrap-kubelet.conf")
    else:
        for key in ("client-certificate", "client-key"):
            sh(control_plane, host, f"test -s {user[key]}")
        verify = f"openssl verify -CAfile {cluster['certificate-authority']} {user['client-certificate']}"
        assert sh(control_plane, host, verify).strip().endswith(": OK")


def test_the_controllers_admin_kubeconfig_carries_its_credentials_inline(
    control_plane: Lab, converged: dict[str, Any], flagship: Any, tmp_path: Path
) -> None:
    """The kubeconfig the in-cluster layer's `pulumi up` uses: self-contained, private, verifiable."""
    path = Path(control_plane.state_dir) / "pki/admin.kubeconfig"
    assert path.stat().st_mode & 0o777 == 0o600
    config = kubectl_view(path)
    ((cluster,),) = [[c["cluster"] for c in config["clusters"]]]
    ((user,),) = [[u["user"] for u in config["users"]]]
    assert cluster["server"] == kube.apiserver_url(flagship.addresses.apiserver_lb_ip)
    assert set(user) == {"client-certificate-data", "client-key-data"}, (
        "no file paths: it travels as a secret"
    )
    ca, cert = tmp_path / "ca.crt", tmp_path / "admin.crt"
    ca.write_bytes(base64.b64decode(cluster["certificate-authority-data"]))
    cert.write_bytes(base64.b64decode(user["client-certificate-data"]))
    verify = subprocess.run(
        ["openssl", "verify", "-CAfile", str(ca), str(cert)], capture_output=True, text=True
    )
    assert verify.stdout.strip().endswith(": OK"), verify.stderr
    subject = subprocess.run(
        ["openssl", "x509", "-in", str(cert), "-noout", "-subject"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "system:masters" in subject


UNITS = (
    ("apiservers-1", "kube-apiserver"),
    ("apiservers-1", "kube-controller-manager"),
    ("apiservers-1", "kube-scheduler"),
    ("apiservers-1", "cluster-autoscaler"),
    ("gpu-1", "kubelet"),
    ("gpu-1", "kube-proxy"),
    ("nat", "kube-proxy"),
)


@pytest.mark.parametrize(("host", "unit"), UNITS, ids=[f"{h}:{u}" for h, u in UNITS])
def test_every_unit_passes_systemd_analyze_verify(
    host: str, unit: str, control_plane: Lab, converged: dict[str, Any]
) -> None:
    text = sh(control_plane, host, f"cat /etc/systemd/system/{unit}.service")
    (binary,) = [
        line.split("=", 1)[1].split()[0] for line in text.splitlines() if line.startswith("ExecStart=")
    ]
    proc = machines.ssh(
        control_plane, control_plane.host(host), f"systemd-analyze verify /etc/systemd/system/{unit}.service"
    )
    diagnostics = [line for line in (proc.stdout + proc.stderr).splitlines() if line.strip()]
    if unit in control_plane.builds:
        # built by `superkube lab build`: installed where the release's binary goes, as built
        assert diagnostics == [], diagnostics
        assert (
            sh(control_plane, host, f"sha256sum {binary}").split()[0] == control_plane.builds[unit]["sha256"]
        )
    else:
        # not built for the lab yet (node components, cluster-autoscaler): the one diagnostic
        # allowed is about the missing binary
        assert [line for line in diagnostics if binary not in line] == [], diagnostics
        assert sh(control_plane, host, f"test -e {binary} || echo missing").strip() == "missing"
    # and systemd-analyze does fail a broken unit: the check can fail
    broken = machines.ssh(
        control_plane,
        control_plane.host(host),
        f"sed 's/^ExecStart=/ExecStrat=/' /etc/systemd/system/{unit}.service > /tmp/broken-{unit}.service"
        f" && systemd-analyze verify /tmp/broken-{unit}.service",
    )
    assert "ExecStrat" in broken.stdout + broken.stderr


def test_nodes_register_as_the_autoscaler_expects_and_fit_their_pod_ips(
    control_plane: Lab, converged: dict[str, Any], flagship: Any
) -> None:
    spec = flagship.spec
    for host in ("gpu-1", "cpu-1"):
        pool_name = control_plane.host(host).pool
        pool = next(p for p in spec.node_pools if p.name == pool_name)
        config = yaml.safe_load(sh(control_plane, host, "cat /var/lib/kubelet/config.yaml"))
        assert config["maxPods"] == pool.pod_ips_per_node + kube.HOST_NETWORK_PODS[pool.role]
        assert config["clusterDNS"] == [kube.service_ip(spec.service_cidr, kube.DNS_SERVICE_INDEX)]
        assert "registerWithTaints" not in config  # cloud-init alone registers
        assert reference.problems(config, flagship.spec.kubernetes_version) == []
        proxy = yaml.safe_load(sh(control_plane, host, "cat /etc/kubernetes/kube-proxy.yaml"))
        assert reference.problems(proxy, flagship.spec.kubernetes_version) == []
        # what cloud-init wrote is what the plan's scale set advertises to the autoscaler
        (vmss,) = [
            r
            for r in flagship.of_type("azure-native:compute:VirtualMachineScaleSet")
            if r.inputs["tags"]["superkube-pool"] == pool_name and r.name.endswith("-0")
        ]
        tags = vmss.inputs["tags"]
        template = "k8s.io_cluster-autoscaler_node-template"
        registration = sh(control_plane, host, "cat /etc/default/kubelet")
        (args,) = shlex.split(registration.split("KUBELET_EXTRA_ARGS=", 1)[1])
        flags = dict(a[2:].split("=", 1) for a in args.split())
        labels = dict(item.split("=", 1) for item in flags["node-labels"].split(","))
        assert {k.replace("/", "_"): v for k, v in labels.items()} == {
            k.removeprefix(f"{template}_label_"): v
            for k, v in tags.items()
            if k.startswith(f"{template}_label_")
        }
        taints = set(filter(None, flags.get("register-with-taints", "").split(",")))
        assert {t.replace("/", "_") for t in taints} == {
            f"{k.removeprefix(f'{template}_taint_')}={v}"
            for k, v in tags.items()
            if k.startswith(f"{template}_taint_")
        }
        assert (pool.role == "gpu") == ("superkube.io/preflight=pending:NoSchedule" in taints)
        unit = sh(control_plane, host, "cat /etc/systemd/system/kubelet.service")
        assert "EnvironmentFile=-/etc/default/kubelet" in unit and "$KUBELET_EXTRA_ARGS" in unit
        # the join waits for the bootstrap kubeconfig converge wrote
        assert "PathExists=/etc/kubernetes/bootstrap-kubelet.conf" in sh(
            control_plane, host, "cat /etc/systemd/system/superkube-join.path"
        )


def test_main_writes_with_two_members_down_and_they_rejoin(
    control_plane: Lab, converged: dict[str, Any]
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


def test_events_down_leaves_main_alone(control_plane: Lab, converged: dict[str, Any]) -> None:
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
