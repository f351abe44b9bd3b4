"""The operators' dashboards on the lab's real control plane: every panel's query returns data.

The control-plane lab has a monitoring host (the store and one Prometheus shard at 15 s: the
monitoring role's shape for a lab that watches a control plane, whose scrapes must leave the lab's
cores to what they watch). Once the layer is applied it gets the cluster CA and the Prometheus token,
as an operator places them, and scrapes every job of superkube.cluster.monitoring: the API servers, both
etcd clusters, the kubelets and cAdvisor, the exporters, the node agents' and platform agents' pods
found by pod discovery, the join-token publisher, and the shards and store themselves
(tests/lab/conftest.py, Labs.apply). This module runs after the health loop, so the store has seen
nodes join behind preflight, a training job, the team webhook, and health's cordons and drains; it
adds what no earlier module causes: a priority level that rejects, flooded until the API servers
answer 429, and a team's pod whose traffic the per-namespace accounting counts.

Each query is asked as Grafana asks a time-series panel (a range query over the last hour), of a
shard (it must parse) and of the store the dashboards read (it must return series). Panels that
cannot show data on any lab are in dashboards.LAB_EMPTY, with the reason; the network dashboard's
per-pod panels are checked on the pod-network lab (test_monitoring), where pods send known traffic
to the internet host.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from urllib.parse import urlparse

import pytest

from superkube.cluster import dashboards, monitoring
from superkube.cluster.kube import PROMETHEUS_PKI_DIR
from superkube.lab import machines
from superkube.lab.inventory import LAB_SKIPPED_JOBS
from superkube.lab.state import Lab
from superkube.model import teams
from tests.lab.conftest import Labs, from_the_store, kubectl, ok, panels_on_the_lab, sh

HOST = "monitoring-1"
NAMESPACE = "seeing-the-cluster"
TEAM = "research"  # a team of the lab stack's team capacity
NETWORK = "superkube-network"
CHECKED_HERE = {board.uid for board in dashboards.boards() if board.uid != NETWORK}
ALSO_HERE = {f"{NETWORK}/Traffic by team"}  # needs the team reconciler's namespace series: a cluster's
FLOOD = "lab-flood"  # a priority level of one seat that rejects, and the account it classifies
FLOOD_CLIENT = """
import http.client, json, ssl, sys, threading
host, port, path, token, n, ca = sys.argv[1], int(sys.argv[2]), sys.argv[3], open(sys.argv[4]).read().strip(), int(sys.argv[5]), sys.argv[6]
ctx = ssl.create_default_context(cafile=ca)
ctx.check_hostname = False  # the load balancer's address; the chain is still checked against the CA
start, codes, lock = threading.Barrier(n), {}, threading.Lock()
def one():
    conn = http.client.HTTPSConnection(host, port, context=ctx, timeout=60)
    try:
        conn.connect()  # every handshake first, then every request at once
        start.wait()
        conn.request("GET", path, headers={"Authorization": "Bearer " + token})
        code = conn.getresponse().status
    except Exception as e:
        code = type(e).__name__
    with lock:
        codes[str(code)] = codes.get(str(code), 0) + 1
threads = [threading.Thread(target=one) for _ in range(n)]
[t.start() for t in threads]
[t.join() for t in threads]
print(json.dumps(codes))
"""


def flood_until_rejected(fleet: Lab) -> dict[str, int]:
    """A priority level with one share that rejects what it cannot seat, a flow schema sending one
    service account's requests there, and that account's requests sent all at once from the monitoring
    host: API Priority and Fairness answers 429 (what the apiserver dashboard's rejection panels and
    the 429 share count)."""
    objects = [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": FLOOD, "namespace": NAMESPACE}},
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": FLOOD},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "view"},
            "subjects": [{"kind": "ServiceAccount", "name": FLOOD, "namespace": NAMESPACE}],
        },
        {
            "apiVersion": "flowcontrol.apiserver.k8s.io/v1",
            "kind": "PriorityLevelConfiguration",
            "metadata": {"name": FLOOD},
            "spec": {
                "type": "Limited",
                "limited": {
                    "nominalConcurrencyShares": 1,
                    "lendablePercent": 0,
                    "borrowingLimitPercent": 0,
                    "limitResponse": {"type": "Reject"},
                },
            },
        },
        {
            "apiVersion": "flowcontrol.apiserver.k8s.io/v1",
            "kind": "FlowSchema",
            "metadata": {"name": FLOOD},
            "spec": {
                "priorityLevelConfiguration": {"name": FLOOD},
                "matchingPrecedence": 500,
                "distinguisherMethod": {"type": "ByUser"},
                "rules": [
                    {
                        "subjects": [
                            {
                                "kind": "ServiceAccount",
                                "serviceAccount": {"name": FLOOD, "namespace": NAMESPACE},
                            }
                        ],
                        "resourceRules": [
                            {
                                "verbs": ["*"],
                                "apiGroups": ["*"],
                                "resources": ["*"],
                                "namespaces": ["*"],
                                "clusterScope": True,
                            }
                        ],
                    }
                ],
            },
        },
    ]
    ok(fleet, "apply", "-f", "-", stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": objects}))
    token = ok(fleet, "-n", NAMESPACE, "create", "token", FLOOD, "--duration=10m").strip()
    machines.put(fleet, HOST, "/root/flood/token", token)
    machines.put(fleet, HOST, "/root/flood/flood.py", FLOOD_CLIENT)
    url = urlparse(str(fleet.facts["apiserver_url"]))
    codes: dict[str, int] = {}
    for _ in range(5):  # the level's status settles a moment after it is made
        got = json.loads(
            sh(
                fleet,
                HOST,
                f"python3 /root/flood/flood.py {url.hostname} {url.port} /api/v1/pods /root/flood/token 150 "
                f"{PROMETHEUS_PKI_DIR}/ca.crt",
                timeout=120,
            )
        )
        codes = {k: codes.get(k, 0) + got.get(k, 0) for k in {*codes, *got}}
        if codes.get("429"):
            return codes
        time.sleep(2)
    raise AssertionError(f"no request was rejected: {codes}")


@pytest.fixture(scope="module")
def watched(labs: Labs, control_plane: Lab) -> Iterator[Lab]:
    labs.apply(control_plane)  # places the monitoring host's credentials, once, with the layer
    # a pod of a team's namespace, so per-namespace accounting and the team's namespace series meet
    ok(control_plane, "apply", "-f", "-", stdin=json.dumps(
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE, "labels": {teams.TEAM_KEY: TEAM}}}
    ))  # fmt: skip
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "counted", "namespace": NAMESPACE, "labels": {teams.BORROW_LABEL: "true"}},
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "containers": [
                {"name": "main", "image": control_plane.images["pause"]["ref"], "imagePullPolicy": "Never"}
            ],
        },
    }
    ok(control_plane, "apply", "-f", "-", stdin=json.dumps(pod))
    ok(control_plane, "-n", NAMESPACE, "wait", "--for=condition=Ready", "pod/counted", "--timeout=120s")
    flood_until_rejected(control_plane)
    yield control_plane
    kubectl(control_plane, "delete", "flowschema,prioritylevelconfiguration,clusterrolebinding", FLOOD)
    kubectl(control_plane, "delete", "namespace", NAMESPACE, "--wait=false")


def test_every_target_of_every_job_is_scraped(watched: Lab) -> None:
    """Every job the cluster's configuration has, except the programs the lab does not run, has
    targets, and they are up: the credentials work, discovery finds nodes and pods."""
    expect = {job.name for job in monitoring.jobs()}
    expect -= set(LAB_SKIPPED_JOBS)  # they write to Azure: the lab runs none
    deadline = time.monotonic() + 120
    while True:
        series = from_the_store(watched, "up")
        jobs = {s["metric"]["job"] for s in series}
        down = sorted(
            f"{s['metric']['job']} {s['metric']['instance']}" for s in series if s["value"][1] != "1"
        )
        if jobs == expect and not down:
            break
        assert time.monotonic() < deadline, f"jobs {sorted(jobs)} (want {sorted(expect)}); down: {down}"
        time.sleep(5)


def test_every_panel_returns_data_from_the_store_or_is_lab_empty(watched: Lab) -> None:
    want = {
        dashboards.key(board, p)
        for board in dashboards.boards()
        for p in board.panels()
        if board.uid in CHECKED_HERE or dashboards.key(board, p) in ALSO_HERE
    } - set(dashboards.LAB_EMPTY)
    deadline = time.monotonic() + 150  # a new pod's series, the 429s' and the rules take a few 15 s rounds
    while True:
        got = panels_on_the_lab(watched, HOST, CHECKED_HERE | {NETWORK})
        assert not got["refused"], got["refused"]
        missing = sorted(want & set(got["empty"]))
        if not missing:
            break
        assert time.monotonic() < deadline, f"panels with no data on the lab: {missing}"
        time.sleep(10)
