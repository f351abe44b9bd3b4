"""The control plane running for real on the lab: the pinned etcd, kube-apiserver, controller-manager
and gang scheduler built from their Go modules, behind the lab's load balancer, with the in-cluster
layer applied by `superkube lab apply`, then checked against the real API server.

Shares the control-plane lab with test_split_control_plane (same shape: one lab for both modules).
Runs in file order; the disruptive tests (members, the events cluster, a whole API server host
stopped) come last and leave the lab as they found it.
"""

from __future__ import annotations

import base64
import json
import subprocess
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from modules.platform import flowcontrol
from superkube.agents import gpu_test, preflight
from superkube.cli import app
from superkube.cluster.kube import APISERVER_PROBE_INTERVAL_S, APISERVER_PROBE_THRESHOLD, SYSTEM_NAMESPACE
from superkube.lab import hosts as lab
from superkube.lab import layer, loadbalancer, machines
from superkube.lab.state import LAB_STACK, SWITCH, Lab
from superkube.model.spec import PREFLIGHT_TAINT_KEY
from tests.lab.conftest import Labs, get, kubectl, ok, sh

ROOT = Path(__file__).resolve().parents[2]
ETCDCTL = ". /etc/etcd/etcdctl-{c}.env && etcdctl --command-timeout=10s "


@pytest.fixture(scope="module")
def running(labs: Labs, control_plane: Lab) -> dict[str, Any]:
    """Converge (which starts the built components and applies the bootstrap objects), then the
    in-cluster layer through the command a user runs."""
    return {"applied": labs.apply(control_plane)}


def lb_url(fleet: Lab) -> str:
    return f"https://{fleet.facts['apiserver_address']}:{fleet.facts['apiserver_port']}"


@pytest.fixture(scope="module")
def admin_files(control_plane: Lab, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The admin kubeconfig's CA, certificate and key as files, for requests kubectl cannot make."""
    config = yaml.safe_load(layer.admin_kubeconfig(control_plane).read_text())
    where = tmp_path_factory.mktemp("admin")
    files = {
        "ca": config["clusters"][0]["cluster"]["certificate-authority-data"],
        "cert": config["users"][0]["user"]["client-certificate-data"],
        "key": config["users"][0]["user"]["client-key-data"],
    }
    out = {}
    for name, data in files.items():
        path = where / name
        path.write_bytes(base64.b64decode(data))
        path.chmod(0o600)
        out[name] = str(path)
    (where / "empty").write_text("apiVersion: v1\nkind: Config\n")
    out["empty"] = str(where / "empty")
    return out


def curl(fleet: Lab, url: str, *args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    """curl from the switch namespace (where the load balancer's frontend is), headers included."""
    command = ["ip", "netns", "exec", SWITCH, "curl", "-sS", "-i", "-m", "10", *args, url]
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout)


def with_token(
    fleet: Lab, files: dict[str, str], token: str, *args: str, server: str | None = None
) -> subprocess.CompletedProcess[str]:
    """kubectl with nothing but a bearer token (a kubeconfig's client certificate would win over it)."""
    command = [
        "ip", "netns", "exec", SWITCH, fleet.builds["kubectl"]["path"],
        "--kubeconfig", files["empty"], "--server", server or lb_url(fleet),
        "--certificate-authority", files["ca"], "--token", token, *args,
    ]  # fmt: skip
    return subprocess.run(command, capture_output=True, text=True, timeout=60)


def headers_and_body(response: str) -> tuple[dict[str, str], str]:
    head, _, body = response.replace("\r\n", "\n").partition("\n\n")
    lines = head.splitlines()
    return {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}, body


def etcdctl(fleet: Lab, host: str, cluster: str, args: str) -> str:
    return sh(fleet, host, ETCDCTL.format(c=cluster) + args)


# --- item 3: the control plane runs ---------------------------------------------------------------


def test_every_apiserver_is_ready_through_the_load_balancer(
    control_plane: Lab, running: dict[str, Any]
) -> None:
    # through the plan's load-balancer address, with the admin kubeconfig converge wrote
    assert ok(control_plane, "get", "--raw", "/readyz").strip() == "ok"
    version = json.loads(ok(control_plane, "version", "-o", "json"))
    assert version["serverVersion"]["gitVersion"] == control_plane.builds["kube-apiserver"]["version"]
    # each API server answers on its own address too, and the load balancer's probe sees both up
    apiservers = [h for h in control_plane.hosts if h.group == "apiservers"]
    assert len(apiservers) == 2
    for host in apiservers:
        url = f"https://{host.address}:{control_plane.facts['apiserver_port']}"
        assert ok(control_plane, "--server", url, "get", "--raw", "/readyz").strip() == "ok"
    # a server restarted by converge is back in the load balancer after its probe passes `rise` times
    wait_for(
        "both API servers up behind the load balancer",
        lambda: (
            loadbalancer.backend_states(Path(control_plane.state_dir)) == {h.name: "UP" for h in apiservers}
        ),
        timeout=60,
    )


def test_the_layer_is_applied_whole_and_its_crds_are_established(
    control_plane: Lab, running: dict[str, Any]
) -> None:
    applied = running["applied"]
    assert sum(len(f["objects"]) for f in applied) >= 60
    crds = [name for f in applied for name in f["established"]]
    # (the PodGroup and ElasticQuota CRDs came with converge, before any scheduler: test_converge)
    assert crds == ["mpijobs.kubeflow.org"]
    for crd in crds:
        conditions = {c["type"]: c["status"] for c in get(control_plane, "crd", crd)["status"]["conditions"]}
        assert conditions["Established"] == "True", crd
    # a second apply changes nothing (server-side apply of the same objects is a no-op)
    before = get(control_plane, "clusterroles", "-l", "app.kubernetes.io/part-of=superkube")
    again = CliRunner().invoke(app, ["lab", "apply", "--output", "json"])
    assert again.exit_code == 0, again.output
    after = get(control_plane, "clusterroles", "-l", "app.kubernetes.io/part-of=superkube")
    versions = lambda doc: {i["metadata"]["name"]: i["metadata"]["resourceVersion"] for i in doc["items"]}  # noqa: E731
    assert versions(before) == versions(after) and versions(before)


def an_event(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": name, "namespace": "default"},
        "involvedObject": {"kind": "Namespace", "name": "default", "apiVersion": "v1"},
        "reason": "LabCheck",
        "message": "written through the API",
        "type": "Normal",
    }


def test_an_event_lands_in_the_events_etcd_and_not_the_main_one(
    control_plane: Lab, running: dict[str, Any]
) -> None:
    name = f"superkube-test-{uuid.uuid4().hex[:8]}"
    ok(control_plane, "create", "-f", "-", stdin=json.dumps(an_event(name)))
    ok(control_plane, "create", "configmap", name, "-n", "default", "--from-literal=k=v")
    key_event, key_cm = f"/registry/events/default/{name}", f"/registry/configmaps/default/{name}"
    in_events = etcdctl(control_plane, "etcd-events-1", "events", f"get {key_event} --keys-only").split()
    in_main = etcdctl(control_plane, "etcd-main-1", "main", f"get {key_event} --keys-only").split()
    assert (in_events, in_main) == ([key_event], [])
    # what --etcd-servers-overrides (/events#...) sends away is Events only: the ConfigMap is in main
    assert etcdctl(control_plane, "etcd-main-1", "main", f"get {key_cm} --keys-only").split() == [key_cm]
    assert etcdctl(control_plane, "etcd-events-1", "events", f"get {key_cm} --keys-only").split() == []
    env = sh(control_plane, "apiservers-1", "cat /etc/kubernetes/kube-apiserver.env")
    assert "--etcd-servers-overrides=/events#" in env


def holder(fleet: Lab, lease: str) -> str:
    spec = get(fleet, "lease", lease, "-n", "kube-system")["spec"]
    return str(spec.get("holderIdentity", "")).split("_")[0]


def wait_for(what: str, check: Any, timeout: float = 120, every: float = 0.5) -> float:
    started = time.monotonic()
    while True:
        try:
            if check():
                return time.monotonic() - started
        except (AssertionError, subprocess.SubprocessError, ValueError, KeyError):
            pass
        assert time.monotonic() - started < timeout, f"{what}: not within {timeout} s"
        time.sleep(every)


def test_controller_manager_and_gang_scheduler_each_hold_their_lease(
    control_plane: Lab, running: dict[str, Any]
) -> None:
    names = {h.name for h in control_plane.hosts if h.group == "apiservers"}
    for lease in ("kube-controller-manager", "kube-scheduler"):
        wait_for(f"{lease} lease", lambda lease=lease: holder(control_plane, lease) in names)


def test_bootstrap_objects_are_applied_and_the_token_authenticates(
    control_plane: Lab, running: dict[str, Any], admin_files: dict[str, str]
) -> None:
    token = (Path(control_plane.state_dir) / "pki/kubernetes/bootstrap.token").read_text().strip()
    token_id = token.split(".")[0]
    secret = get(control_plane, "secret", f"bootstrap-token-{token_id}", "-n", "kube-system")
    assert secret["type"] == "bootstrap.kubernetes.io/token"
    assert base64.b64decode(secret["data"]["token-secret"]).decode() == token.split(".")[1]
    for binding in (
        "superkube:kubelet-bootstrap",
        "superkube:node-autoapprove-bootstrap",
        "superkube:node-autoapprove-certificate-rotation",
    ):
        get(control_plane, "clusterrolebinding", binding)
    who_proc = with_token(control_plane, admin_files, token, "auth", "whoami", "-o", "json")
    assert who_proc.returncode == 0, who_proc.stderr
    who = json.loads(who_proc.stdout)
    assert who["status"]["userInfo"]["username"] == f"system:bootstrap:{token_id}"
    assert {"system:bootstrappers", "system:bootstrappers:superkube"} <= set(
        who["status"]["userInfo"]["groups"]
    )
    # and it may do what a joining kubelet does (create a CSR), and no more than that
    can = with_token(
        control_plane, admin_files, token, "auth", "can-i", "create", "certificatesigningrequests"
    )
    cannot = with_token(control_plane, admin_files, token, "auth", "can-i", "list", "secrets", "-A")
    assert cannot.stdout.strip() == "no"
    assert can.stdout.strip() == "yes"


def test_a_bootstrap_request_is_classified_into_the_node_join_priority_level(
    control_plane: Lab, running: dict[str, Any], admin_files: dict[str, str]
) -> None:
    token = (Path(control_plane.state_dir) / "pki/kubernetes/bootstrap.token").read_text().strip()
    level = get(control_plane, "prioritylevelconfiguration", flowcontrol.LEVEL)["metadata"]["uid"]
    schema = get(control_plane, "flowschema", "superkube-node-bootstrap")["metadata"]["uid"]
    url = f"{lb_url(control_plane)}/apis/certificates.k8s.io/v1/certificatesigningrequests"
    response = curl(control_plane, url, "--cacert", admin_files["ca"], "-H", f"Authorization: Bearer {token}")
    headers, _ = headers_and_body(response.stdout)
    assert response.returncode == 0 and " 200 " in response.stdout.splitlines()[0], response.stdout[:500]
    assert headers["x-kubernetes-pf-prioritylevel-uid"] == level
    assert headers["x-kubernetes-pf-flowschema-uid"] == schema
    # the same request as the admin is not: the check can fail
    admin = curl(
        control_plane,
        url,
        "--cacert",
        admin_files["ca"],
        "--cert",
        admin_files["cert"],
        "--key",
        admin_files["key"],
    )
    assert headers_and_body(admin.stdout)[0]["x-kubernetes-pf-prioritylevel-uid"] != level


def test_a_service_account_token_from_one_apiserver_is_accepted_by_the_other(
    control_plane: Lab, running: dict[str, Any], admin_files: dict[str, str]
) -> None:
    first, second = sorted(h.address for h in control_plane.hosts if h.group == "apiservers")
    port = control_plane.facts["apiserver_port"]
    kubectl(control_plane, "create", "serviceaccount", "lab-token-check", "-n", "default")
    token = ok(
        control_plane,
        "--server",
        f"https://{first}:{port}",
        "create",
        "token",
        "lab-token-check",
        "-n",
        "default",
    ).strip()
    at_second = f"https://{second}:{port}"
    who = with_token(control_plane, admin_files, token, "auth", "whoami", "-o", "json", server=at_second)
    assert who.returncode == 0, who.stderr
    username = json.loads(who.stdout)["status"]["userInfo"]["username"]
    assert username == "system:serviceaccount:default:lab-token-check"
    # a token signed by another key is refused: the check can fail
    forged = token.rsplit(".", 1)[0] + "." + base64.urlsafe_b64encode(b"x" * 256).decode().rstrip("=")
    refused = with_token(control_plane, admin_files, forged, "auth", "whoami", server=at_second)
    assert refused.returncode != 0 and "Unauthorized" in refused.stderr


# --- item 4: the layer against the real server -----------------------------------------------------


def _node(name: str, taints: list[dict[str, str]], labels: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": labels},
        "spec": {"taints": taints},
    }


PREFLIGHT_TAINT = {"key": PREFLIGHT_TAINT_KEY, "value": "pending", "effect": "NoSchedule"}


def as_agent(
    fleet: Lab,
    files: dict[str, str],
    agent: str,
    node: str,
    method: str,
    path: str,
    body: Any,
    content_type: str = "application/strategic-merge-patch+json",
) -> tuple[int, str]:
    """A request made as the agent's service account on `node` (impersonated by the admin, the
    node name carried as a service-account token of a pod on that node carries it)."""
    url = f"{lb_url(fleet)}{path}"
    response = curl(
        fleet,
        url,
        "--cacert", files["ca"], "--cert", files["cert"], "--key", files["key"],
        "-X", method,
        "-H", f"Content-Type: {content_type}",
        "-H", f"Impersonate-User: system:serviceaccount:{SYSTEM_NAMESPACE}:{agent}",
        "-H", "Impersonate-Group: system:serviceaccounts",
        "-H", f"Impersonate-Group: system:serviceaccounts:{SYSTEM_NAMESPACE}",
        "-H", "Impersonate-Group: system:authenticated",
        "-H", f"Impersonate-Extra-authentication.kubernetes.io%2fnode-name: {node}",
        "--data", json.dumps(body),
    )  # fmt: skip
    status = int(response.stdout.splitlines()[0].split()[1])
    return status, headers_and_body(response.stdout)[1]


@pytest.fixture(scope="module")
def nodes(control_plane: Lab, running: dict[str, Any]) -> list[str]:
    names = ["lab-node-a", "lab-node-b"]
    for name in names:
        doc = _node(name, [PREFLIGHT_TAINT], {PREFLIGHT_TAINT_KEY: "pending"})
        ok(
            control_plane,
            "apply",
            "--server-side",
            "--field-manager=lab-test",
            "-f",
            "-",
            stdin=json.dumps(doc),
        )
    return names


@pytest.mark.parametrize(
    ("agent", "changes", "message"),
    [
        (
            "superkube-preflight",
            {"spec": {"taints": [PREFLIGHT_TAINT, {"key": "x", "effect": "NoSchedule"}]}},
            "may only remove the superkube.io/preflight taint",
        ),
        (
            "superkube-preflight",
            {"metadata": {"labels": {"team": "me"}}},
            "may only remove the superkube.io/preflight label",
        ),
        (
            "superkube-gpu-test",
            {"metadata": {"labels": {"team": "me"}}},
            "the periodic GPU test may not change labels",
        ),
        (
            "superkube-gpu-test",
            {"spec": {"taints": [PREFLIGHT_TAINT, {"key": "x", "effect": "NoSchedule"}]}},
            "the periodic GPU test may not change taints",
        ),
    ],
    ids=["preflight-adds-taint", "preflight-adds-label", "gpu-test-adds-label", "gpu-test-adds-taint"],
)
def test_each_admission_policy_denies_what_its_agent_must_not_do(
    agent: str,
    changes: dict[str, Any],
    message: str,
    control_plane: Lab,
    admin_files: dict[str, str],
    nodes: list[str],
) -> None:
    status, body = as_agent(
        control_plane, admin_files, agent, nodes[0], "PATCH", f"/api/v1/nodes/{nodes[0]}", changes
    )
    assert status == 403 and message in body, body[:400]


@pytest.mark.parametrize("agent", ["superkube-preflight", "superkube-gpu-test"])
def test_an_agent_may_not_change_another_node(
    agent: str, control_plane: Lab, admin_files: dict[str, str], nodes: list[str]
) -> None:
    result = f"{'preflight' if 'preflight' in agent else 'gpu-test'}-result"
    change = {"metadata": {"annotations": {f"superkube.io/{result}": "passed"}}}
    status, body = as_agent(
        control_plane, admin_files, agent, nodes[0], "PATCH", f"/api/v1/nodes/{nodes[1]}", change
    )
    assert status == 403 and "only the node its pod runs on" in body, body[:400]


def test_each_agent_may_make_the_change_it_exists_for(
    control_plane: Lab, admin_files: dict[str, str], nodes: list[str]
) -> None:
    """The agents' own patches (JSON patches that `test` what they read first), as their identities."""
    path = f"/api/v1/nodes/{nodes[0]}"
    json_patch = "application/json-patch+json"
    # the periodic GPU test records its result on its own node
    patch = gpu_test.result_patch(get(control_plane, "node", nodes[0]), "passed")
    status, body = as_agent(
        control_plane, admin_files, "superkube-gpu-test", nodes[0], "PATCH", path, patch, json_patch
    )
    assert status == 200, body[:400]
    # preflight passed: the agent lifts its taint and label from its own node (the controller-manager's
    # taints on a node without a kubelet stay) and records its result
    patch = preflight.pass_patch(get(control_plane, "node", nodes[0]), "passed")
    status, body = as_agent(
        control_plane, admin_files, "superkube-preflight", nodes[0], "PATCH", path, patch, json_patch
    )
    assert status == 200, body[:400]
    node = get(control_plane, "node", nodes[0])
    assert PREFLIGHT_TAINT_KEY not in node["metadata"].get("labels", {})
    assert PREFLIGHT_TAINT["key"] not in {t["key"] for t in node["spec"].get("taints", [])}
    assert node["metadata"]["annotations"][preflight.RESULT_ANNOTATION] == "passed"


@pytest.mark.parametrize("example", sorted(p.name for p in (ROOT / "examples" / "jobs").glob("*.yaml")))
def test_every_example_job_passes_a_server_side_dry_run(
    example: str, control_plane: Lab, running: dict[str, Any], tmp_path: Path
) -> None:
    spec = yaml.safe_load((ROOT / "examples" / "jobs" / example).read_text())
    rendered = CliRunner().invoke(
        app, ["job", "render", str(ROOT / "examples" / "jobs" / example), "--stack", LAB_STACK]
    )
    assert rendered.exit_code == 0, rendered.output
    [job] = [d for d in yaml.safe_load_all(rendered.stdout) if d]
    assert job["kind"] == "MPIJob"
    # the PodGroup the MPI Operator makes for it (its scheduler-plugins gang mode): the job's name,
    # minMember and timeout from its schedulingPolicy
    policy = job["spec"]["runPolicy"]["schedulingPolicy"]
    group = {
        "apiVersion": "scheduling.x-k8s.io/v1alpha1",
        "kind": "PodGroup",
        "metadata": {"name": job["metadata"]["name"], "namespace": job["metadata"]["namespace"]},
        "spec": {
            "minMember": policy["minAvailable"],
            "scheduleTimeoutSeconds": policy["scheduleTimeoutSeconds"],
        },
    }
    docs = [job, group]
    kubectl(control_plane, "create", "namespace", spec["namespace"])
    proc = kubectl(
        control_plane,
        "apply",
        "--server-side",
        "--dry-run=server",
        "--field-manager=lab-test",
        "-f",
        "-",
        stdin=yaml.safe_dump_all(docs),
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("(server dry run)") == len(docs)


# --- item 5: faults on the real thing (last: they stop members and hosts) ------------------------------


def test_writes_go_on_with_two_of_five_main_members_down(control_plane: Lab, running: dict[str, Any]) -> None:
    down = ("etcd-main-4", "etcd-main-5")
    for host in down:
        sh(control_plane, host, "systemctl stop etcd-main.service")
    try:
        name = f"two-down-{uuid.uuid4().hex[:6]}"
        ok(control_plane, "create", "configmap", name, "-n", "default", "--from-literal=k=v")
        assert get(control_plane, "configmap", name, "-n", "default")["data"] == {"k": "v"}
    finally:
        for host in down:
            sh(control_plane, host, "systemctl start etcd-main.service")
    wait_for(
        "main healthy",
        lambda: (
            machines.ssh(
                control_plane,
                control_plane.host("etcd-main-1"),
                ETCDCTL.format(c="main") + "endpoint health --cluster",
            ).returncode
            == 0
        ),
    )


def test_with_the_events_cluster_down_everything_but_events_works(
    control_plane: Lab, running: dict[str, Any]
) -> None:
    events = [h.name for h in control_plane.hosts if h.group == "etcd_events"]
    apiservers = [h for h in control_plane.hosts if h.group == "apiservers"]
    for host in events:
        sh(control_plane, host, "systemctl stop etcd-events.service")
    try:
        # every API server reports itself unready (since 1.33 /readyz checks each etcd override), so
        # the probe takes all of them out at once ...
        port = control_plane.facts["apiserver_port"]
        direct = f"https://{apiservers[0].address}:{port}"
        readyz = [*layer.kubectl(control_plane), "--server", direct, "get", "--raw", "/readyz?verbose"]
        wait_for(
            "an API server unready for its events etcd",
            lambda: (
                "[-]etcd-override-0 failed" in subprocess.run(readyz, capture_output=True, text=True).stderr
            ),
            timeout=30,
        )
        wait_for(
            "every backend probed down",
            lambda: set(loadbalancer.backend_states(Path(control_plane.state_dir)).values()) == {"DOWN"},
            timeout=3 * APISERVER_PROBE_INTERVAL_S,
        )
        # ... and the load balancer sends new flows to all of them (AllProbedUp), which serve the rest
        name = f"events-down-{uuid.uuid4().hex[:6]}"
        ok(control_plane, "create", "configmap", name, "-n", "default", "--from-literal=k=v")
        assert get(control_plane, "configmap", name, "-n", "default")["data"] == {"k": "v"}
        assert get(control_plane, "namespaces")["items"]
        refused = kubectl(
            control_plane,
            "create",
            "--request-timeout=15s",
            "-f",
            "-",
            stdin=json.dumps(an_event(name)),
            timeout=60,
        )
        assert refused.returncode != 0  # Events alone have nowhere to go
    finally:
        for host in events:
            sh(control_plane, host, "systemctl start --no-block etcd-events.service")
    wait_for(
        "events healthy",
        lambda: (
            machines.ssh(
                control_plane,
                control_plane.host("etcd-events-1"),
                ETCDCTL.format(c="events") + "endpoint health --cluster",
            ).returncode
            == 0
        ),
    )
    wait_for(
        "both API servers ready again behind the load balancer",
        lambda: set(loadbalancer.backend_states(Path(control_plane.state_dir)).values()) == {"UP"},
        timeout=60,
    )


# a request's start and end (s from the test's start), whether it worked, and what kubectl said if not
Sample = tuple[float, float, bool, str]


def _sample(client: list[str], stop: threading.Event, into: list[Sample], start: float) -> None:
    """Requests through the load balancer, back to back."""
    while not stop.is_set():
        began = time.monotonic() - start
        run = subprocess.run(client, capture_output=True, text=True, timeout=30)
        into.append((began, time.monotonic() - start, run.returncode == 0, run.stderr.strip()[-300:]))
        time.sleep(0.1)


def test_an_apiserver_host_lost_keeps_the_address_serving_and_hands_the_leases_over(
    control_plane: Lab, running: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    leases = ("kube-controller-manager", "kube-scheduler")
    for lease in leases:
        wait_for(f"{lease} held", lambda lease=lease: holder(control_plane, lease) != "")
    # the host holding the controller-manager's lease drops off the network at once, as a VM that
    # dies does: no FIN, no RST, its packets simply go nowhere (its API server goes with it)
    leader = holder(control_plane, "kube-controller-manager")
    other = next(h.name for h in control_plane.hosts if h.group == "apiservers" and h.name != leader)
    netns = control_plane.host(leader).netns

    def blackhole(action: str) -> None:  # -I or -D: every packet in and out of the host dropped
        for chain in ("INPUT", "OUTPUT"):
            rule = [chain, "-m", "comment", "--comment", "lab-host-lost", "-j", "DROP"]
            subprocess.run(["ip", "netns", "exec", netns, "iptables", "-w", action, *rule], check=True)

    # a request sent to the lost backend fails however long it may wait (its packets go nowhere); 5 s
    # lets one that reached the surviving server ride out a CPU stall on this two-core machine (the
    # new controller-manager leader listing everything at once), which is not a load-balancer failure
    client = [*layer.kubectl(control_plane), "--request-timeout=5s", "get", "--raw", "/readyz"]
    samples: list[Sample] = []
    stop = threading.Event()
    start = time.monotonic()
    sampler = threading.Thread(target=_sample, args=(client, stop, samples, start), daemon=True)
    sampler.start()
    time.sleep(2)  # a baseline: every request works before the loss
    lost = time.monotonic() - start
    blackhole("-I")
    try:
        taken_out = wait_for(
            "the load balancer takes it out",
            lambda: loadbalancer.backend_states(Path(control_plane.state_dir))[leader].startswith("DOWN"),
            timeout=60,
            every=0.1,
        )
        sent_when_out = loadbalancer.flows_sent(Path(control_plane.state_dir))
        handed: dict[str, float] = {}
        for lease in leases:
            wait_for(
                f"{lease} handed to {other}", lambda lease=lease: holder(control_plane, lease) == other, 90
            )
            handed[lease] = time.monotonic() - start - lost
        time.sleep(max(0.0, lost + 15 - (time.monotonic() - start)))  # sample well past the probe
        stop.set()
        sampler.join(timeout=60)
        sent = loadbalancer.flows_sent(Path(control_plane.state_dir))
        before = [done for began, ended, done, _ in samples if ended < lost]
        after = [(began - lost, done, said) for began, ended, done, said in samples if ended >= lost]
        failed = [(round(max(0.0, began), 1), said) for began, done, said in after if not done]
        bound = APISERVER_PROBE_INTERVAL_S * APISERVER_PROBE_THRESHOLD + loadbalancer.CHECK_TIMEOUT_S + 0.5
        late = [(began, said) for began, said in failed if began > bound]
        last = max((began for began, _ in failed), default=0.0)
        with capsys.disabled():
            print(
                f"\n  an API server host lost: out of the load balancer {taken_out:.1f} s later; "
                f"{len(failed)} of {len(after)} requests through it failed, the last started {last:.1f} s "
                f"after the loss ({len(late)} past the probe's bound); the lost host was sent "
                f"{sent[leader] - sent_when_out[leader]} flows once it was out; leases "
                "handed over in " + ", ".join(f"{k} {v:.1f} s" for k, v in handed.items())
            )
        assert before and all(before), f"requests failed before the host was lost: {samples}"
        # the probe takes a lost backend out within one interval and its own timeout (its connection
        # fails within CONNECT_TIMEOUT_S; one already connected may wait CHECK_TIMEOUT_S) + polling
        assert taken_out <= bound, (taken_out, failed)
        # and from then on the load balancer sends it nothing: HAProxy's own count of the flows it
        # sent each server, not a guess from which requests failed
        assert sent[leader] == sent_when_out[leader], (sent_when_out, sent, failed)
        assert sum(sent.values()) > sum(sent_when_out.values()), (sent_when_out, sent)
        # a request past the bound may still fail only by the client's own timeout while the one
        # server left stalls (the new controller-manager leader listing everything on two cores);
        # a refused, reset or error answer would be the load balancer's or the server's fault
        assert all("deadline exceeded" in said or "Timeout" in said for _, said in late), late
        assert len(late) <= 2, (late, len(after))  # a stall or two, not a pattern
        states = loadbalancer.backend_states(Path(control_plane.state_dir))
        assert states[leader].startswith("DOWN") and states[other] == "UP", states
        # kubectl through the address works with one API server gone
        assert ok(control_plane, "get", "namespaces", "-o", "name")
    finally:
        stop.set()
        blackhole("-D")
    wait_for(
        "both API servers back behind the load balancer",
        lambda: set(loadbalancer.backend_states(Path(control_plane.state_dir)).values()) == {"UP"},
        timeout=180,
    )


def test_stopping_an_apiserver_host_hands_its_leases_over(
    control_plane: Lab, running: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    # a host powered off cleanly: its components stop as systemd stops them
    leader = holder(control_plane, "kube-controller-manager")
    other = next(h.name for h in control_plane.hosts if h.group == "apiservers" and h.name != leader)
    start = time.monotonic()
    lab.stop_host(leader, Path(control_plane.state_dir))
    try:
        stopped = time.monotonic() - start
        waited = wait_for(
            "the lease handed over", lambda: holder(control_plane, "kube-controller-manager") == other, 90
        )
        with capsys.disabled():
            print(
                f"\n  an API server host powered off in {stopped:.1f} s; the controller-manager's lease was {other}'s {waited:.1f} s later"
            )
        assert ok(control_plane, "get", "namespaces", "-o", "name")
    finally:
        lab.start_host(leader, Path(control_plane.state_dir))
    wait_for(
        "both API servers back behind the load balancer",
        lambda: set(loadbalancer.backend_states(Path(control_plane.state_dir)).values()) == {"UP"},
        timeout=180,
    )


def test_the_load_balancer_config_follows_the_plans_probe(control_plane: Lab) -> None:
    text = (Path(control_plane.state_dir) / loadbalancer.CONFIG).read_text()
    assert f"bind {control_plane.facts['apiserver_address']}:{control_plane.facts['apiserver_port']}" in text
    assert "option httpchk GET /readyz" in text
    assert (
        f"inter {APISERVER_PROBE_INTERVAL_S}s fall {APISERVER_PROBE_THRESHOLD} rise {APISERVER_PROBE_THRESHOLD}"
        in text
    )
    for host in (h for h in control_plane.hosts if h.group == "apiservers"):
        assert f"server {host.name} {host.address}:{control_plane.facts['apiserver_port']}" in text
