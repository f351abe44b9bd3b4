"""The operators' dashboards on the lab's real control plane: every panel's query returns data.

The control-plane lab has a monitoring host (two Prometheus shards and the store, the monitoring
role's lab shape). Once the layer is applied it gets the cluster CA and the Prometheus token, as an
operator places them, and scrapes every job of superkube.cluster.monitoring: the API servers, both
etcd clusters, the kubelets and cAdvisor, the exporters, the node agents' and platform agents' pods
found by pod discovery, the join-token publisher, and the shards and store themselves
(tests/lab/conftest.py, Labs.apply). This module runs after the health loop, so the store has seen
nodes join behind preflight, a training job, the team webhook, and health's cordons and drains.

Each query is asked as Grafana asks it, of a shard (it must parse) and of the store the dashboards
read (it must return series), with `$__rate_interval` at an hour: the lab's run is minutes long and
a rate needs two samples in its window. Panels that cannot show data on any lab are in
dashboards.LAB_EMPTY, with the reason; the network dashboard's per-pod panels are checked on the
pod-network lab (test_monitoring), where pods send known traffic to the internet host.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import pytest

from superkube.cluster import dashboards, monitoring
from superkube.lab.state import Lab
from superkube.model import teams
from tests.lab.conftest import STORE_PORT, Labs, kubectl, ok, panels_on_the_lab, sh

HOST = "monitoring-1"
NAMESPACE = "seeing-the-cluster"
TEAM = "research"  # a team of the lab stack's team capacity
NETWORK = "superkube-network"
CHECKED_HERE = {board.uid for board in dashboards.boards() if board.uid != NETWORK}
ALSO_HERE = {f"{NETWORK}/Traffic by team"}  # needs the team reconciler's namespace series: a cluster's
RATE_INTERVAL = "1h"


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
    yield control_plane
    kubectl(control_plane, "delete", "namespace", NAMESPACE, "--wait=false")


def test_every_target_of_every_job_is_scraped(watched: Lab) -> None:
    """Every job the cluster's configuration has, except the programs the lab does not run, has
    targets, and they are up: the credentials work, discovery finds nodes and pods."""
    expect = {job.name for job in monitoring.jobs()}
    expect -= {"cluster-autoscaler", "scale-governor"}  # they write to Azure: the lab runs neither
    deadline = time.monotonic() + 120
    while True:
        text = sh(
            watched, HOST, f"curl -sf http://127.0.0.1:{STORE_PORT}/api/v1/query --data-urlencode 'query=up'"
        )
        series = json.loads(text)["data"]["result"]
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
    deadline = time.monotonic() + 90  # a new pod's series and the recording rules take a few rounds
    while True:
        got = panels_on_the_lab(watched, HOST, CHECKED_HERE | {NETWORK}, RATE_INTERVAL)
        assert not got["refused"], got["refused"]
        missing = sorted(want & set(got["empty"]))
        if not missing:
            break
        assert time.monotonic() < deadline, f"panels with no data on the lab: {missing}"
        time.sleep(10)
