"""Nodes joining the lab's real control plane: the pinned kubelet on the pinned containerd, started by
cloud-init's join unit, bootstrapped by token, its CSR signed by the controller-manager.

Shares the control-plane lab with test_running_control_plane and test_split_control_plane (same
shape: one lab for all three). Runs in file order: the rotation test comes last, as it waits for the
lab's short-lived kubelet certificates to be renewed.
"""

from __future__ import annotations

import base64
import json
import shlex
import time
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from cryptography import x509
from cryptography.x509.oid import NameOID

from superkube.agents import serving_certs
from superkube.cluster import autoscaling
from superkube.lab import nodes
from superkube.lab.state import Lab
from superkube.model import rates, teams
from superkube.model.spec import PREFLIGHT_TAINT_KEY
from tests.lab.conftest import Labs, NodeWatch, get, kubectl, ok, sh

NODES = ("gpu-1", "cpu-1")
KUBELET_SIGNER = "kubernetes.io/kube-apiserver-client-kubelet"
CLIENT_CERT = "/var/lib/kubelet/pki/kubelet-client-current.pem"
# labels every kubelet sets on its own Node; the rest come from the registration cloud-init wrote
KUBELET_LABELS = ("kubernetes.io/", "beta.kubernetes.io/")
# taints Kubernetes keeps by the node's conditions (the kubelet registers with not-ready)
CONDITION_TAINTS = "node.kubernetes.io/"


@pytest.fixture(scope="module")
def joined(labs: Labs, control_plane: Lab) -> dict[str, Any]:
    """Converge and apply the in-cluster layer (done already after test_running_control_plane; the
    whole setup when this module runs alone), then join."""
    labs.apply(control_plane)
    watch = NodeWatch(control_plane)  # the Nodes as registered: preflight lifts its taint seconds later
    try:
        done = nodes.join(control_plane, NODES)
    finally:
        watch.stop()
    first = {name: sh(control_plane, name, f"readlink -f {CLIENT_CERT}").strip() for name in NODES}
    registered = {name: watch.versions(name)[0] for name in NODES}
    return {
        "joined": {j.name: j.kubelet_to_ready_s for j in done},
        "first_cert": first,
        "registered": registered,
    }


def _requested_cn(csr: dict[str, Any]) -> str:
    """The common name a CSR asks for (the node's identity: system:node:<name>)."""
    request = x509.load_pem_x509_csr(base64.b64decode(csr["spec"]["request"]))
    return str(request.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value)


def node_csrs(fleet: Lab) -> list[dict[str, Any]]:
    return [c for c in get(fleet, "csr")["items"] if c["spec"]["signerName"] == KUBELET_SIGNER]


def test_the_join_unit_starts_the_pinned_kubelet_and_each_node_turns_ready(
    control_plane: Lab, joined: dict[str, Any]
) -> None:
    assert set(joined["joined"]) == set(NODES)
    for name in NODES:
        units = sh(control_plane, name, "systemctl is-active superkube-join.service kubelet containerd")
        assert units.split() == ["active", "active", "active"], name
        assert sh(control_plane, name, "systemctl is-enabled kubelet").strip() == "enabled"
        kubelet = "v" + control_plane.builds["kubelet"]["version"].lstrip("v")
        containerd = control_plane.builds["containerd"]["version"].lstrip("v")
        assert sh(control_plane, name, "/usr/local/bin/kubelet --version").split() == ["Kubernetes", kubelet]
        node = get(control_plane, "node", name)
        info = node["status"]["nodeInfo"]
        assert info["kubeletVersion"] == kubelet
        runtime, _, version = info["containerRuntimeVersion"].partition("://")
        assert (runtime, version.lstrip("v")) == ("containerd", containerd), info["containerRuntimeVersion"]
        ready = [c for c in node["status"]["conditions"] if c["type"] == "Ready"]
        assert ready and ready[0]["status"] == "True", ready


def test_each_csr_came_by_bootstrap_token_and_was_approved_and_signed(
    control_plane: Lab, joined: dict[str, Any]
) -> None:
    by_node: dict[str, list[dict[str, Any]]] = {}
    for csr in node_csrs(control_plane):
        by_node.setdefault(csr["spec"]["username"], []).append(csr)
    bootstrap = [c for user, cs in by_node.items() if user.startswith("system:bootstrap:") for c in cs]
    asked_for = {_requested_cn(c) for c in bootstrap}
    assert {f"system:node:{n}" for n in NODES} <= asked_for, asked_for  # each node asked, by token
    for csr in bootstrap:
        conditions = {c["type"]: c for c in csr["status"].get("conditions") or []}
        assert conditions["Approved"]["status"] == "True", csr["metadata"]["name"]
        assert conditions["Approved"]["reason"] == "AutoApproved"  # the controller-manager's approver
        assert csr["status"].get("certificate"), csr["metadata"]["name"]  # and its signer signed it
        assert "system:bootstrappers" in csr["spec"]["groups"]


def test_labels_and_taints_are_the_node_templates_the_autoscaler_advertises(
    control_plane: Lab, joined: dict[str, Any]
) -> None:
    """As each kubelet registered its Node (the first version a watch saw): the GPU node's preflight
    pod lifts its taint and label seconds later (test_running_the_agents)."""
    for name in NODES:
        host = control_plane.host(name)
        tags = control_plane.pools[host.pool]["tags"]
        node = joined["registered"][name]
        labels = {
            autoscaling.template_tag("label", k): v
            for k, v in node["metadata"]["labels"].items()
            if not k.startswith(KUBELET_LABELS)
        }
        taints = {
            autoscaling.template_tag("taint", t["key"]): f"{t.get('value', '')}:{t['effect']}"
            for t in node["spec"].get("taints") or []
            if not t["key"].startswith(CONDITION_TAINTS)  # not-ready, until the node is Ready
        }
        label_tags = {k: v for k, v in tags.items() if k.startswith(autoscaling.template_tag("label", ""))}
        taint_tags = {k: v for k, v in tags.items() if k.startswith(autoscaling.template_tag("taint", ""))}
        assert labels == label_tags, name
        assert taints == taint_tags, name
    # the GPU node waits behind the preflight taint, and is its team's from the start (flagship's GPU
    # pool is capacity anyone may borrow); the CPU node has neither
    registered = {
        name: {(t["key"], t.get("value")) for t in node["spec"].get("taints") or [] if not t["key"].startswith(CONDITION_TAINTS)}
        for name, node in joined["registered"].items()
    }  # fmt: skip
    assert registered["gpu-1"] == {(PREFLIGHT_TAINT_KEY, "pending"), (teams.TEAM_KEY, teams.ANY)}, registered
    assert not registered["cpu-1"], registered


def _as_node(fleet: Lab, name: str, method: str, path: str, body: dict[str, Any]) -> tuple[int, str]:
    """A request to the API with the node's own kubelet credentials, from the node."""
    server = fleet.facts["apiserver_address"], fleet.facts["apiserver_port"]
    command = (
        f"curl -sS -o /tmp/answer -w '%{{http_code}}' -X {method} --cacert /etc/kubernetes/pki/ca.crt "
        f"--cert {CLIENT_CERT} --key {CLIENT_CERT} -H 'Content-Type: application/merge-patch+json' "
        f"-d {shlex.quote(json.dumps(body))} https://{server[0]}:{server[1]}{path}; echo; cat /tmp/answer"
    )
    code, _, answer = sh(fleet, name, command).partition("\n")
    return int(code), answer


def test_a_nodes_credentials_change_its_own_node_but_not_another(
    control_plane: Lab, joined: dict[str, Any]
) -> None:
    mark = {"metadata": {"annotations": {"superkube.io/test-touch": str(time.time())}}}
    code, answer = _as_node(control_plane, "gpu-1", "PATCH", "/api/v1/nodes/gpu-1", mark)
    assert code == 200, answer
    code, answer = _as_node(control_plane, "gpu-1", "PATCH", "/api/v1/nodes/cpu-1", mark)
    assert code == 403, answer
    status = json.loads(answer)
    assert status["reason"] == "Forbidden"
    assert 'node "gpu-1" is not allowed to modify node "cpu-1"' in status["message"], status["message"]
    # and it cannot hand itself a label reserved to the cluster's admins (NodeRestriction)
    reserved = {"metadata": {"labels": {"node-restriction.kubernetes.io/team": "mine"}}}
    code, answer = _as_node(control_plane, "gpu-1", "PATCH", "/api/v1/nodes/gpu-1", reserved)
    assert code == 403, answer


# In kube-system: the team webhook asks about every pod outside the system namespaces and refuses a
# toleration of team nodes a pod is not owed; these pods tolerate the GPU node's taints (flagship's
# GPU pool: any) to be placed where the test says (the webhook's own test: test_running_the_agents).
POD = """apiVersion: v1
kind: Pod
metadata: {{name: {name}, namespace: kube-system, labels: {{superkube.io/test: runtime}}}}
spec:
  nodeSelector: {{kubernetes.io/hostname: {node}}}
  tolerations: [{{key: {preflight}, operator: Exists, effect: NoSchedule}}, {{key: {team}, operator: Exists, effect: NoSchedule}}]
  containers:
  - {{name: main, image: "{image}", imagePullPolicy: Never}}
"""


SELECTOR = "superkube.io/test=runtime"


def _pod_netns(fleet: Lab, node: str, ip: str) -> str:
    """The network namespace containerd made for the pod holding `ip` on `node`."""
    find = (
        "for n in $(ip netns list | cut -d' ' -f1); do "
        f"if ip -n $n -4 -o addr show | grep -q ' {ip}/'; then echo $n; fi; done"
    )
    (netns,) = sh(fleet, node, find).split()
    return netns


def test_pods_run_through_the_real_runtime_on_their_nodes_vnet_ips(
    control_plane: Lab, joined: dict[str, Any]
) -> None:
    """kubelet -> containerd -> runc with the node's CNI chain, scheduled by the cluster's scheduler,
    with the sandbox image converge imported (no registry): each pod gets one of its node's NIC IPs,
    and a pod on one node reaches a pod on the other with its own IP as the source."""
    image = control_plane.images["pause"]["ref"]
    names = {node: f"runtime-{node}" for node in NODES}
    manifests = "---\n".join(
        POD.format(name=names[n], node=n, image=image, preflight=PREFLIGHT_TAINT_KEY, team=teams.TEAM_KEY)
        for n in NODES
    )
    ok(control_plane, "apply", "-f", "-", stdin=manifests)
    try:
        _wait_ready(control_plane, "pod", "-l", SELECTOR)
        ips = {}
        for node in NODES:
            pod = get(control_plane, "-n", "kube-system", "pod", names[node])
            assert pod["spec"]["nodeName"] == node
            assert pod["spec"]["schedulerName"] == "default-scheduler"
            ip = pod["status"]["podIP"]
            assert ip in control_plane.host(node).secondary, (node, ip, control_plane.host(node).secondary)
            ips[node] = ip
        for node in NODES:  # the sandbox is the imported pause: pinned, and no registry to pull another
            assert f"sandbox = '{image}'" in sh(control_plane, node, "cat /etc/containerd/config.toml")
            assert image in sh(control_plane, node, "ctr -n k8s.io containers ls 2>/dev/null")
        sender, receiver = NODES
        into = {node: _pod_netns(control_plane, node, ips[node]) for node in NODES}
        server = "import socket; s = socket.create_server(('0.0.0.0', 7200)); c, a = s.accept(); c.sendall(a[0].encode())"
        sh(
            control_plane,
            receiver,
            f"(timeout 60 ip netns exec {into[receiver]} python3 -c {shlex.quote(server)} >/dev/null 2>&1 &)",
        )
        client = (
            "import socket, time\n"
            "for _ in range(100):\n"
            "    try:\n"
            f"        c = socket.create_connection(('{ips[receiver]}', 7200), timeout=10); break\n"
            "    except OSError: time.sleep(0.1)\n"
            "print(c.recv(64).decode())"
        )
        seen = sh(
            control_plane, sender, f"ip netns exec {into[sender]} python3 -c {shlex.quote(client)}"
        ).strip()
        assert seen == ips[sender]  # the receiving pod saw the sending pod's own VNet IP: no NAT between them
    finally:
        kubectl(
            control_plane,
            "-n",
            "kube-system",
            "delete",
            "pod",
            "-l",
            SELECTOR,
            "--wait=true",
            "--timeout=60s",
        )


NETLOAD_POD = """apiVersion: v1
kind: Pod
metadata:
  name: {name}
  namespace: kube-system
  labels: {{superkube.io/test: netload, superkube.io/netload: {role}}}
  annotations: {annotations}
spec:
  nodeSelector: {{kubernetes.io/hostname: {node}}}
  tolerations: [{{key: {preflight}, operator: Exists, effect: NoSchedule}}, {{key: {team}, operator: Exists, effect: NoSchedule}}]
  restartPolicy: Never
  containers:
  - {{name: main, image: "{image}", imagePullPolicy: Never, args: {args}}}
"""
SINK_PORT = 7300


def _netload(fleet: Lab, name: str, node: str, args: list[str], annotations: dict[str, str]) -> None:
    manifest = NETLOAD_POD.format(
        name=name,
        role=args[0],
        node=node,
        image=fleet.images["netload"]["ref"],
        preflight=PREFLIGHT_TAINT_KEY,
        team=teams.TEAM_KEY,
        args=json.dumps(args),
        annotations=json.dumps(annotations),
    )
    ok(fleet, "apply", "-f", "-", stdin=manifest)


SINK_SERVICE = f"""apiVersion: v1
kind: Service
metadata: {{name: netload-sink, namespace: kube-system}}
spec:
  selector: {{superkube.io/netload: sink}}
  ports: [{{port: {SINK_PORT}, targetPort: {SINK_PORT}, protocol: TCP}}]
"""


@pytest.fixture(scope="module")
def sink(control_plane: Lab, joined: dict[str, Any]) -> Iterator[str]:
    """A netload sink pod on cpu-1 behind a ClusterIP Service: the pod's address, for senders on gpu-1."""
    _netload(control_plane, "netload-sink", "cpu-1", ["sink", str(SINK_PORT)], {})
    ok(control_plane, "apply", "-f", "-", stdin=SINK_SERVICE)
    try:
        _wait_ready(control_plane, "pod/netload-sink")
        yield str(get(control_plane, "-n", "kube-system", "pod", "netload-sink")["status"]["podIP"])
    finally:
        kubectl(
            control_plane,
            "-n",
            "kube-system",
            "delete",
            "pod",
            "netload-sink",
            "--wait=true",
            "--timeout=60s",
        )


def _wait_ready(fleet: Lab, *what: str) -> None:
    ok(fleet, "-n", "kube-system", "wait", "--for=condition=Ready", "--timeout=120s", *what)


def _run_to_end(fleet: Lab, name: str) -> tuple[dict[str, Any], str]:
    """Wait for pod `name` to succeed, delete it: the pod as it ended, and its termination message."""
    try:
        ok(
            fleet, "-n", "kube-system", "wait", "--for=jsonpath={.status.phase}=Succeeded",
            "--timeout=120s", f"pod/{name}",
        )  # fmt: skip
        pod = get(fleet, "-n", "kube-system", "pod", name)
    finally:
        kubectl(fleet, "-n", "kube-system", "delete", "pod", name, "--wait=true", "--timeout=60s")
    (status,) = pod["status"]["containerStatuses"]
    return pod, str(status["state"]["terminated"]["message"])


def _send(fleet: Lab, name: str, to: str, seconds: float, limit: str = "") -> tuple[dict[str, Any], str]:
    """Run a netload sender pod on gpu-1 until it is done: the sink's count, and the sender's pod IP."""
    annotations = {"kubernetes.io/egress-bandwidth": limit} if limit else {}
    _netload(fleet, name, "gpu-1", ["send", to, str(seconds)], annotations)
    pod, message = _run_to_end(fleet, name)
    assert pod["spec"]["nodeName"] == "gpu-1" and pod["status"]["podIP"] in fleet.host("gpu-1").secondary
    return json.loads(message), pod["status"]["podIP"]


# (not 1G: with the whole suite running, a pod limited to 1 Gbit/s sent 897 Mbit/s on a two-core
# machine; the machine set that figure, not the limit, so a miss there says nothing about the limit)
@pytest.mark.parametrize("limit", ["10M", "100M", "300M"])
def test_a_pods_egress_annotation_holds_through_the_real_runtime(
    control_plane: Lab, sink: str, limit: str
) -> None:
    """The kubelet hands `kubernetes.io/egress-bandwidth` to containerd, whose CRI plugin asks the CNI
    chain for that rate with a burst of 2^32-1 bits; superkube-bandwidth bounds the burst, so what
    the receiving pod on the other node counts is the limit, within 10 %."""
    got, _ = _send(control_plane, f"netload-{limit.lower()}", f"{sink}:{SINK_PORT}", 5, limit)
    rate = got["bytes"] * 8 / got["seconds"]
    assert 0.9 <= rate / rates.parse_rate(limit) <= 1.1, f"{limit}: {rate / 1e6:.1f} Mbit/s ({got})"


def _cluster_ip(fleet: Lab, sink_ip: str) -> str:
    """The sink Service's ClusterIP, once its EndpointSlice lists the sink pod ready."""
    deadline = time.monotonic() + 60
    while True:
        slices = get(
            fleet, "-n", "kube-system", "endpointslices", "-l", "kubernetes.io/service-name=netload-sink"
        )
        ready = [
            a for sl in slices["items"] for e in sl.get("endpoints") or []
            if (e.get("conditions") or {}).get("ready") for a in e["addresses"]
        ]  # fmt: skip
        if ready == [sink_ip]:
            return str(get(fleet, "-n", "kube-system", "service", "netload-sink")["spec"]["clusterIP"])
        assert time.monotonic() < deadline, slices
        time.sleep(1)


def _programmed(fleet: Lab, host: str, cluster_ip: str, sink_ip: str) -> None:
    """kube-proxy on `host` has written the Service's rules: its ClusterIP to the sink pod's endpoint."""
    deadline = time.monotonic() + 60
    while True:
        rules = sh(fleet, host, "iptables-save -t nat")
        if f"-d {cluster_ip}/32" in rules and f"--to-destination {sink_ip}:{SINK_PORT}" in rules:
            return
        assert time.monotonic() < deadline, f"kube-proxy on {host} has not programmed {cluster_ip}:\n{rules}"
        time.sleep(1)


def test_a_pod_reaches_a_service_backed_by_a_pod_on_another_node(control_plane: Lab, sink: str) -> None:
    """kube-proxy (iptables) on gpu-1 sends the Service's ClusterIP to its endpoint on cpu-1, which
    sees the sending pod's own IP."""
    cluster_ip = _cluster_ip(control_plane, sink)
    _programmed(control_plane, "gpu-1", cluster_ip, sink)
    got, sender = _send(control_plane, "netload-service", f"{cluster_ip}:{SINK_PORT}", 1)
    assert got["bytes"] > 0 and got["peer"] == sender, got


def test_the_hub_reaches_a_cluster_ip_through_the_nat_host(control_plane: Lab, sink: str) -> None:
    """A hub client's connection to a ClusterIP goes to the NAT host (the hub's route to the service
    range), whose kube-proxy sends it to the endpoint; the NAT host masquerades it, so the pod sees
    the NAT host and its reply goes back the same way."""
    cluster_ip = _cluster_ip(control_plane, sink)
    _programmed(control_plane, "nat", cluster_ip, sink)
    client = (
        "import json, socket\n"
        f"c = socket.create_connection(('{cluster_ip}', {SINK_PORT}), timeout=10)\n"
        "c.sendall(b'x' * 1000000); c.shutdown(socket.SHUT_WR)\n"
        "print(c.makefile().readline())"
    )
    got = json.loads(sh(control_plane, "hub-client", f"python3 -c {shlex.quote(client)}"))
    assert got["bytes"] == 1_000_000 and got["peer"] == control_plane.host("nat").address, got


def _on_node(fleet: Lab, node: str) -> list[dict[str, Any]]:
    """The pods bound to `node` that still count against its limit (not finished)."""
    pods = get(fleet, "pods", "-A", f"--field-selector=spec.nodeName={node}")["items"]
    return [p for p in pods if p["status"].get("phase") not in ("Succeeded", "Failed")]


# the pod past the node's limit must wait, not displace a pod that is there (a balloon, say)
NO_PREEMPTION = """apiVersion: scheduling.k8s.io/v1
kind: PriorityClass
metadata: {name: superkube-test-no-preemption}
value: 0
preemptionPolicy: Never
"""
FILL_POD = """apiVersion: v1
kind: Pod
metadata: {{name: {name}, namespace: kube-system, labels: {{superkube.io/test: full}}}}
spec:
  nodeSelector: {{kubernetes.io/hostname: {node}}}
  priorityClassName: superkube-test-no-preemption
  containers:
  - {{name: main, image: "{image}", imagePullPolicy: Never}}
"""


def test_a_pod_that_needs_an_ip_on_a_full_node_waits_pending(
    control_plane: Lab, joined: dict[str, Any]
) -> None:
    """maxPods is the node's pod IPs plus the host-network pods its role runs (none on a CPU node):
    the scheduler binds pods until every IP is taken, each Running on one of them, and the next pod
    waits Pending with the scheduler's reason; none is bound only to fail its sandbox for want of an IP."""
    node = "cpu-1"
    config = yaml.safe_load(sh(control_plane, node, "cat /var/lib/kubelet/config.yaml"))
    ips = control_plane.host(node).secondary
    there = _on_node(control_plane, node)
    host_network = [p for p in there if p["spec"].get("hostNetwork")]
    assert config["maxPods"] == len(ips) + len(host_network), (config["maxPods"], len(ips), host_network)
    free = config["maxPods"] - len(there)
    names = [f"full-{i}" for i in range(free + 1)]
    image = control_plane.images["pause"]["ref"]
    ok(control_plane, "apply", "-f", "-", stdin=NO_PREEMPTION)
    ok(
        control_plane,
        "apply",
        "-f",
        "-",
        stdin="---\n".join(FILL_POD.format(name=n, node=node, image=image) for n in names),
    )
    try:
        deadline = time.monotonic() + 240
        while True:
            pods = get(control_plane, "-n", "kube-system", "pods", "-l", "superkube.io/test=full")["items"]
            running = [p for p in pods if p["status"].get("phase") == "Running" and p["status"].get("podIP")]
            waiting = [
                p for p in pods
                if not p["spec"].get("nodeName")
                and any(c["type"] == "PodScheduled" and c["status"] == "False" for c in p["status"].get("conditions", []))
            ]  # fmt: skip
            if len(running) == free and len(waiting) == 1:
                break
            assert time.monotonic() < deadline, [
                (p["metadata"]["name"], p["status"]) for p in pods if p not in running
            ]
            time.sleep(2)
        (refused,) = waiting
        (condition,) = [c for c in refused["status"]["conditions"] if c["type"] == "PodScheduled"]
        assert condition["reason"] == "Unschedulable" and "Too many pods" in condition["message"], condition
        bound = [p for p in _on_node(control_plane, node) if not p["spec"].get("hostNetwork")]
        no_ip = [(p["metadata"]["namespace"], p["metadata"]["name"], p["status"].get("phase"),
                  [c.get("reason") or c["type"] for c in p["status"].get("conditions", []) if c["status"] != "True"],
                  [next(iter(s.get("state", {}).values()), {}).get("reason") for s in p["status"].get("containerStatuses", [])])
                 for p in bound if not p["status"].get("podIP")]  # fmt: skip
        assert not no_ip, f"pods bound to {node} without an IP: {no_ip}"
        assert sorted(p["status"]["podIP"] for p in bound) == sorted(ips)  # every IP taken, each once
        events = get(
            control_plane, "-n", "kube-system", "events", "--field-selector=reason=FailedCreatePodSandBox"
        )
        failed = [f"{e['involvedObject']['name']}: {e['message']}" for e in events["items"]
                  if e["involvedObject"]["name"] in names]  # fmt: skip
        # what this test is about: a sandbox whose network setup failed (the CNI found no IP left).
        # runc on this machine's cgroup v1 now and then fails a sandbox with "unable to freeze"
        # before the network is set up; the kubelet retries it, and the pod is among those Running
        # on their own IPs above. Those are reported, not counted.
        for_network = [
            f for f in failed if "failed to setup network" in f or "no IP addresses available" in f
        ]
        assert not for_network, f"a pod's sandbox failed for its network: {for_network}"
        if failed:
            print(f"\n  sandboxes the runtime failed and the kubelet retried: {failed}")
    finally:
        kubectl(
            control_plane,
            "-n",
            "kube-system",
            "delete",
            "pod",
            "-l",
            "superkube.io/test=full",
            "--wait=true",
            "--timeout=120s",
        )
        kubectl(control_plane, "delete", "priorityclass", "superkube-test-no-preemption")


def test_logs_reach_each_kubelet_over_its_cluster_signed_serving_certificate(
    control_plane: Lab, joined: dict[str, Any]
) -> None:
    """The API server verifies kubelets against the cluster CA: a kubelet serving a self-signed
    certificate cannot be reached for logs, exec or port-forward. Each kubelet asked for its serving
    certificate, the approver approved it for the node's own addresses, the controller-manager
    signed it, and `kubectl logs` reaches the kubelet on each node."""
    for node in NODES:
        name = f"logs-{node}"
        _netload(control_plane, name, node, ["usage"], {})
        try:
            ok(control_plane, "-n", "kube-system", "wait", "--for=jsonpath={.status.phase}=Failed",
               "--timeout=120s", f"pod/{name}")  # fmt: skip
            # the lab's certificates last minutes and nothing approves between calls: a fresh one now
            nodes.approve_serving(control_plane, [node])
            csrs = [c for c in get(control_plane, "csr")["items"] if c["spec"]["signerName"] == serving_certs.SIGNER
                    and c["spec"]["username"] == f"{serving_certs.NODE_USER}{node}"
                    and c.get("status", {}).get("certificate")]  # fmt: skip
            newest = max(csrs, key=lambda c: c["metadata"]["creationTimestamp"])
            conditions = newest["status"]["conditions"]
            assert [c["reason"] for c in conditions if c["type"] == "Approved"] == [serving_certs.REASON]
            certificate = x509.load_pem_x509_certificate(base64.b64decode(newest["status"]["certificate"]))
            sans = certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
            assert control_plane.host(node).address in {
                str(ip) for ip in sans.get_values_for_type(x509.IPAddress)
            }
            logs = kubectl(control_plane, "-n", "kube-system", "logs", name)
            assert logs.returncode == 0, f"{node}: {logs.stderr}"
            assert "usage: netload sink PORT" in logs.stdout
        finally:
            kubectl(control_plane, "-n", "kube-system", "delete", "pod", name, "--wait=true", "--timeout=60s")


def test_the_kubelet_client_certificate_rotates(control_plane: Lab, joined: dict[str, Any]) -> None:
    """The lab signs for minutes (hosts.LAB_CERT_DURATION): each kubelet renews on its own, with a CSR
    in its node's name that the controller-manager approves, and goes on renewing its Lease with it."""
    deadline = time.monotonic() + 300
    rotated: dict[str, str] = {}
    while len(rotated) < len(NODES):
        for name in NODES:
            now = sh(control_plane, name, f"readlink -f {CLIENT_CERT}").strip()
            if now != joined["first_cert"][name]:
                rotated[name] = now
        assert time.monotonic() < deadline, (
            f"no rotation within 5 minutes: {sorted(set(NODES) - set(rotated))}"
        )
        time.sleep(5)
    renewals = [c for c in node_csrs(control_plane) if c["spec"]["username"].startswith("system:node:")]
    for name in NODES:
        # renewed in its own name (the newest may still wait for its signature: kubelets here renew
        # every minute or two)
        own = [c for c in renewals if c["spec"]["username"] == f"system:node:{name}"]
        assert any(c["status"].get("certificate") for c in own), f"{name}: no signed CSR in its own name"
    lease = {n: get(control_plane, "lease", "-n", "kube-node-lease", n)["spec"]["renewTime"] for n in NODES}
    renewed: set[str] = set()
    deadline = time.monotonic() + 30  # the kubelet renews its Lease every 10 s (a quarter of 40 s)
    while renewed != set(NODES):
        assert time.monotonic() < deadline, f"Leases not renewed after rotating: {set(NODES) - renewed}"
        time.sleep(2)
        for name in set(NODES) - renewed:
            if get(control_plane, "lease", "-n", "kube-node-lease", name)["spec"]["renewTime"] != lease[name]:
                renewed.add(name)
