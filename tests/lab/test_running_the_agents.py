"""The in-cluster layer's agents as real pods on the lab's real nodes, from the agents' image that
`lab up` built from this checkout and converge imported into each node's containerd.

- preflight: a GPU node joins behind the preflight taint; its preflight pod (the lab's stand-in for
  the burn: superkube.lab.agent_pods) keeps the taint while the node's GPUs fail, lifts it through the
  real API once they pass, and its own credentials cannot touch another node; the lab's monitoring
  host scrapes the failing agent (the join dashboard's panels and the PreflightFailures alert);
- the team webhook: the real API server calls it (at its pod's IP) for a pod in a team's namespace,
  and the pod ends up with its team's tolerations;
- health: a fatal reading on one node gets that node cordoned and its pod evicted, and nothing else.

Shares the control-plane lab with test_running_nodes (same shape) and runs after it (tests/lab/conftest.py
orders the modules of a shape):
the webhook's pods are the ones the health test evicts, and the second GPU node joins here.
"""

from __future__ import annotations

import json
import shlex
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import pytest

from modules.platform import node_health, serving_certs, team_capacity
from superkube.agents import AGENTS_IMAGE, preflight
from superkube.agents import node_health as health_agent
from superkube.cluster.cloudinit import POOL_LABEL
from superkube.cluster.kube import SYSTEM_NAMESPACE
from superkube.lab import agent_pods, nodes
from superkube.lab.state import Lab
from superkube.model import teams
from superkube.model.spec import PREFLIGHT_TAINT_KEY
from superkube.model.vmsizes import size
from tests.lab.conftest import Labs, NodeWatch, from_the_store, get, kubectl, ok, sh
from tests.lab.test_running_control_plane import admin_files, with_token

__all__ = ["admin_files"]  # a fixture this module uses

JOINED = ("gpu-1", "cpu-1")  # joined by test_running_nodes (or here, when this module runs alone)
LATE = "gpu-2"  # joins here, watched
PREFLIGHT_GAUGE = "superkube_preflight_api_up"  # a preflight agent's, while it runs
TEAM = "research"  # a team of the flagship stack's team capacity
T = TypeVar("T")


@pytest.fixture(scope="module")
def agents(labs: Labs, control_plane: Lab) -> Iterator[Lab]:
    labs.apply(control_plane)
    nodes.join(control_plane, JOINED)
    yield control_plane
    kubectl(control_plane, "delete", "namespace", TEAM, "--wait=false")


def wait_for(what: str, check: Callable[[], T | None], timeout: float = 180, every: float = 1) -> T:
    """`check()`'s first truthy answer; fails naming `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if got:
            return got
        assert time.monotonic() < deadline, f"{what}: not within {timeout:.0f} s"
        time.sleep(every)


def pods_of(fleet: Lab, name: str, namespace: str = SYSTEM_NAMESPACE) -> list[dict[str, Any]]:
    return list(get(fleet, "pods", "-n", namespace, "-l", f"app.kubernetes.io/name={name}")["items"])


def running(pod: dict[str, Any]) -> bool:
    statuses = pod["status"].get("containerStatuses") or []
    return (
        pod["status"].get("phase") == "Running"
        and not pod["metadata"].get("deletionTimestamp")
        and bool(statuses)
        and all(s.get("ready") for s in statuses)
    )


def on(pods: list[dict[str, Any]], node: str) -> list[dict[str, Any]]:
    return [p for p in pods if p["spec"].get("nodeName") == node]


def gpu_pool(fleet: Lab) -> str:
    return fleet.host("gpu-1").pool


def set_reading(fleet: Lab, node: str, fault: str) -> None:
    """What the node's GPUs read now (its NVML, in the lab: superkube.lab.agent_pods.READING)."""
    vm = size(fleet.pools[fleet.host(node).pool]["vm_size"], node)
    text = agent_pods.reading_text(node, vm.name, vm.gpus, fault)
    target = agent_pods.READING
    sh(fleet, node, f"printf %s {shlex.quote(text)} > {target}.new && mv {target}.new {target}")


def taint_keys(node: dict[str, Any]) -> set[str]:
    return {t["key"] for t in node["spec"].get("taints") or []}


def test_the_agents_run_as_pods_of_the_image_built_from_this_checkout(agents: Lab) -> None:
    pool = gpu_pool(agents)
    expected = {
        f"{node_health.HEALTH}-{pool}": 1,  # on gpu-1 (gpu-2 has not joined yet)
        f"{node_health.HEALTH}-{agents.host('cpu-1').pool}": 1,  # every pool's nodes have theirs
        node_health.HEALTH_CONTROLLER: 2,
        # one of its two: replicas on different nodes (required), and cpu-1 is the one node that
        # admits it (the GPU nodes are the team `any`'s)
        team_capacity.WEBHOOK: 1,
        team_capacity.RECONCILER: 1,
        serving_certs.NAME: 1,  # the lab's one replica (lab_only), on cpu-1: it renews the kubelets' certificates
    }
    for name, count in expected.items():
        up = wait_for(
            f"{count} Running pods of {name}",
            lambda name=name, count=count: (lambda ps: ps if len(ps) == count else None)(
                [p for p in pods_of(agents, name) if running(p)]
            ),
        )
        assert {c["image"] for p in up for c in p["spec"]["containers"]} == {AGENTS_IMAGE}, name
    (waiting,) = [p for p in pods_of(agents, team_capacity.WEBHOOK) if not p["spec"].get("nodeName")]
    (why,) = [c for c in waiting["status"]["conditions"] if c["type"] == "PodScheduled"]
    assert "anti-affinity" in why["message"], why
    # the very archive `lab up` built: containerd holds the name the layer pins at its digest
    built = agents.images["agents"]
    for node in JOINED:
        found = sh(
            agents,
            node,
            f"ctr -n k8s.io images ls -q 'name=={AGENTS_IMAGE},target.digest=={built['digest']}'",
        )
        assert found.split() == [AGENTS_IMAGE], node


def test_a_gpu_node_joins_behind_preflight_which_lifts_the_taint_once_its_gpus_pass(
    agents: Lab, admin_files: dict[str, str]
) -> None:
    pool = gpu_pool(agents)
    set_reading(agents, LATE, "gpu-missing")  # a GPU off the bus at boot: preflight must hold the node
    watch = NodeWatch(agents)
    try:
        nodes.join(agents, [LATE])
        failed = wait_for(
            f"{LATE}: preflight's failure recorded",
            lambda: (
                lambda n: n if n["metadata"].get("annotations", {}).get(preflight.RESULT_ANNOTATION) else None
            )(get(agents, "node", LATE)),
        )
        result = failed["metadata"]["annotations"][preflight.RESULT_ANNOTATION]
        assert result.startswith("failed") and "GPU" in result, result
        assert PREFLIGHT_TAINT_KEY in taint_keys(failed)  # still behind the taint
        (pod,) = on(pods_of(agents, f"{node_health.PREFLIGHT}-{pool}"), LATE)
        assert pod["spec"]["containers"][0]["image"] == AGENTS_IMAGE

        # the pod's own credentials (a token bound to it, which names its node) cannot touch another node
        token = ok(
            agents, "create", "token", node_health.PREFLIGHT, "-n", SYSTEM_NAMESPACE,
            "--bound-object-kind=Pod", f"--bound-object-name={pod['metadata']['name']}",
            f"--bound-object-uid={pod['metadata']['uid']}",
        ).strip()  # fmt: skip
        other = with_token(
            agents,
            admin_files,
            token,
            "annotate",
            "node",
            "gpu-1",
            f"{preflight.RESULT_ANNOTATION}=passed",
            "--overwrite",
        )
        assert other.returncode != 0 and "may change only the node its pod runs on" in other.stderr, (
            other.stderr
        )
        assert "Forbidden" in other.stderr or "forbidden" in other.stderr, other.stderr

        # the cluster's Prometheus sees the failing preflight (the join dashboard's agents panel and the
        # PreflightFailures alert read it): the store holds its gauge over more than one dashboard step
        wait_for(
            f"{LATE}: the failing preflight in the metrics store",
            lambda: [
                s
                for s in from_the_store(agents, f"count_over_time({PREFLIGHT_GAUGE}[5m])")
                if int(s["value"][1]) >= 3
            ],
            timeout=120,
        )

        set_reading(agents, LATE, "healthy")  # the GPU is back: the next round passes
        passed = wait_for(
            f"{LATE}: preflight lifted its taint",
            lambda: (lambda n: n if PREFLIGHT_TAINT_KEY not in taint_keys(n) else None)(
                get(agents, "node", LATE)
            ),
            timeout=60,
        )
    finally:
        watch.stop()
    assert passed["metadata"]["annotations"][preflight.RESULT_ANNOTATION].startswith("passed")
    assert PREFLIGHT_TAINT_KEY not in passed["metadata"]["labels"]
    assert passed["metadata"]["labels"][POOL_LABEL] == pool
    assert (teams.TEAM_KEY, teams.ANY) in {(t["key"], t.get("value")) for t in passed["spec"]["taints"]}
    registered = watch.versions(LATE)[0]  # as its kubelet registered it
    assert PREFLIGHT_TAINT_KEY in taint_keys(registered)
    assert registered["metadata"]["labels"][PREFLIGHT_TAINT_KEY] == "pending"
    # its preflight pod goes, as the DaemonSet no longer selects the node
    wait_for(
        f"{LATE}: preflight's pod gone",
        lambda: not on(pods_of(agents, f"{node_health.PREFLIGHT}-{pool}"), LATE),
    )
    events = get(agents, "events", "-A", f"--field-selector=involvedObject.name={LATE}")["items"]
    assert {"PreflightFailed", "PreflightPassed"} <= {e["reason"] for e in events}


POD = """apiVersion: v1
kind: Pod
metadata: {{name: {name}, namespace: {namespace}, labels: {{superkube.io/borrow: "true"}}}}
spec:
  nodeSelector: {{kubernetes.io/hostname: {node}}}
  tolerations: {tolerations}
  containers:
  - {{name: main, image: "{image}", imagePullPolicy: Never}}
"""


def _pod(fleet: Lab, name: str, node: str, tolerations: list[dict[str, str]]) -> str:
    image = fleet.images["pause"]["ref"]
    return POD.format(name=name, namespace=TEAM, node=node, image=image, tolerations=json.dumps(tolerations))


def test_the_api_server_calls_the_team_webhook_and_the_pod_gets_its_teams_tolerations(
    agents: Lab,
) -> None:
    # the team's namespace, labelled by a cluster admin (it may exist already, unlabelled: the example
    # jobs' server-side dry run in test_running_control_plane makes it)
    namespace = {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {"name": TEAM, "labels": {teams.TEAM_KEY: TEAM}},
    }
    ok(agents, "apply", "-f", "-", stdin=json.dumps(namespace))
    # no toleration asked: the webhook adds the team's, and `any`'s as the pod borrows
    ok(
        agents,
        "apply",
        "-f",
        "-",
        stdin="---\n".join(_pod(agents, f"borrower-{n}", n, []) for n in ("gpu-1", LATE)),
    )
    for node in ("gpu-1", LATE):
        pod = get(agents, "pod", "-n", TEAM, f"borrower-{node}")
        tolerations = pod["spec"].get("tolerations") or []
        for owed in teams.tolerations_for(TEAM, borrow=True):
            assert owed in tolerations, tolerations
        assert pod["metadata"]["labels"][teams.TEAM_KEY] == TEAM
    for node in ("gpu-1", LATE):  # and with them it runs on the GPU pool's nodes (tainted `any`)
        wait_for(
            f"borrower-{node} Running",
            lambda node=node: running(get(agents, "pod", "-n", TEAM, f"borrower-{node}")),
        )
    # a toleration of another team's nodes: the webhook refuses the pod, with its reason
    refused = kubectl(
        agents, "apply", "-f", "-", stdin=_pod(agents, "stowaway", "gpu-1", [teams.toleration("pretraining")])
    )
    assert refused.returncode != 0 and "reaches nodes" in refused.stderr, refused.stderr
    assert kubectl(agents, "get", "pod", "-n", TEAM, "stowaway").returncode != 0


def test_a_fatal_reading_cordons_and_evicts_on_that_node_and_nowhere_else(agents: Lab) -> None:
    sick, well = "gpu-1", LATE
    assert running(get(agents, "pod", "-n", TEAM, f"borrower-{sick}"))
    try:
        set_reading(agents, sick, "xid-79")  # GPU 0 fell off the bus
        cordoned = wait_for(
            f"{sick}: cordoned by health",
            lambda: (lambda n: n if n["spec"].get("unschedulable") else None)(get(agents, "node", sick)),
            timeout=120,
        )
        notes = cordoned["metadata"]["annotations"]
        assert notes[health_agent.VERDICT_ANNOTATION].startswith("fatal"), notes
        assert "79" in notes[health_agent.ANNOTATION], notes
        wait_for(
            f"borrower-{sick} evicted",
            lambda: kubectl(agents, "get", "pod", "-n", TEAM, f"borrower-{sick}").returncode != 0,
            timeout=120,
        )
        # nowhere else: the other GPU node and the CPU node keep their pods and stay schedulable
        for node in (well, "cpu-1"):
            there = get(agents, "node", node)
            assert not there["spec"].get("unschedulable"), node
            assert health_agent.ANNOTATION not in there["metadata"].get("annotations", {}), node
        assert running(get(agents, "pod", "-n", TEAM, f"borrower-{well}"))
        # and the node's own agents stay (health never evicts the system's pods)
        assert [
            p for p in on(pods_of(agents, f"{node_health.HEALTH}-{gpu_pool(agents)}"), sick) if running(p)
        ]
        events = get(agents, "events", "-A", f"--field-selector=involvedObject.name={sick}")["items"]
        assert "GPUHealthCordon" in {e["reason"] for e in events}
    finally:  # as an operator returns a repaired node: a healthy reading, then uncordon and clear the mark
        set_reading(agents, sick, "healthy")
        wait_for(
            f"{sick}: reported healthy again",
            lambda: (
                get(agents, "node", sick)["metadata"]
                .get("annotations", {})
                .get(health_agent.VERDICT_ANNOTATION)
                == "healthy"
            ),
            timeout=60,
        )
        kubectl(agents, "uncordon", sick)
        kubectl(
            agents, "annotate", "node", sick, f"{health_agent.ANNOTATION}-", f"{health_agent.ANNOTATION_AT}-"
        )
