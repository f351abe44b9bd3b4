"""Gang scheduling, watched happening: MPIJobs from `superkube job render` on the flagship's stack,
made into a PodGroup and pods by the real MPI Operator (v0.8.2), placed by the real gang scheduler
(scheduler-plugins' kube-scheduler with the gang_scheduler role's configuration), the PodGroups kept
by the real scheduler-plugins controller, all with the in-cluster layer's flags and RBAC, on a real
API server (`superkube.harness.gang`). kwok plays the kubelets of the flagship's GPU nodes (8 GPUs each,
the plan's labels and the taints its kubelets and the team reconciler leave) and ends a launcher when
a test says so.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from superkube.cli import app
from superkube.cluster.kube import SYSTEM_NAMESPACE
from superkube.harness import apiserver, kwok
from superkube.harness import gang as gang_lab
from superkube.plan import checks, layer
from superkube.plan.engine import Plan

ANY_NODES, TEAM_NODES, CPU_NODES = 64, 4, 2
"""GPU nodes anyone may borrow (the flagship's "any" team), per team (research, pretraining), and CPU
nodes for the launchers"""
WAIT_S = 180.0


@dataclass
class Cluster:
    api: apiserver.LocalApi
    gang: gang_lab.Gang
    plan: Plan
    jobs_dir: Path

    def kubectl(self, *args: str, stdin: str | None = None, check: bool = True) -> str:
        return apiserver.kubectl(self.api, *args, stdin=stdin, check=check)

    def get(self, *args: str) -> Any:
        return json.loads(self.kubectl("get", *args, "-o", "json"))


NODES = {
    **{f"any-{i:02d}": "any" for i in range(ANY_NODES)},
    **{f"research-{i}": "research" for i in range(TEAM_NODES)},
    **{f"pretraining-{i}": "pretraining" for i in range(TEAM_NODES)},
}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, flagship_plan: Plan) -> Iterator[Cluster]:
    work = tmp_path_factory.mktemp("gang")
    engine = checks.plan_wiring(flagship_plan)
    # what converge applies before the scheduler starts, then the layer's half
    objects = [*gang_lab.prerequisites(engine), *layer.objects(flagship_plan)["gang-scheduling"]]
    config, flags = gang_lab.scheduler(engine)
    with (
        apiserver.running(work / "api") as api,
        gang_lab.running(api, work / "gang", objects, config, flags) as running,
        kwok.running(api.kubeconfig, work / "kwok"),
    ):
        made = [gang_lab.gpu_node(n, team, flagship_plan.spec.teams) for n, team in NODES.items()]
        gang_lab.register(api, made + [gang_lab.cpu_node(f"cpu-{i}") for i in range(CPU_NODES)])
        for ns in ("research", "pretraining"):
            apiserver.kubectl(api, "create", "namespace", ns)
            apiserver.kubectl(api, "create", "serviceaccount", "default", "-n", ns)  # no controller makes it
        c = Cluster(api, running, flagship_plan, work / "jobs")
        c.jobs_dir.mkdir()
        wait_for("every node Ready", lambda: ready_nodes(c) == len(NODES) + CPU_NODES)
        yield c


def wait_for(what: str, check: Callable[[], Any], timeout: float = WAIT_S) -> Any:
    return gang_lab.wait_for(what, check, timeout)


def ready_nodes(c: Cluster) -> int:
    return sum(
        any(x["type"] == "Ready" and x["status"] == "True" for x in n["status"].get("conditions", []))
        for n in c.get("nodes")["items"]
    )


def submit(
    c: Cluster, name: str, workers: int, team: str = "research", borrow: bool = True
) -> dict[str, Any]:
    """`superkube job render` of a job description on the flagship, created on the server."""
    path = c.jobs_dir / f"{name}.yaml"
    path.write_text(yaml.safe_dump({"name": name, "namespace": team, "image": "trainer:lab", "team": team,
                                    "command": ["mpirun", "python", "train.py"], "workers": workers,
                                    "borrow": borrow}))  # fmt: skip
    rendered = CliRunner().invoke(app, ["job", "render", str(path), "--stack", "flagship", "-o", "json"])
    assert rendered.exit_code == 0, rendered.output
    job: dict[str, Any] = json.loads(rendered.stdout)
    c.kubectl("create", "-f", "-", stdin=json.dumps(job))
    return job


def pods(c: Cluster, job: str, namespace: str = "research") -> list[dict[str, Any]]:
    return gang_lab.job_pods(c.api, namespace, job)


def bound(c: Cluster, job: str, namespace: str = "research") -> dict[str, str]:
    return gang_lab.bound(c.api, namespace, job)


def scheduled_times(c: Cluster, job: str, namespace: str = "research") -> list[datetime]:
    return gang_lab.scheduled_times(c.api, namespace, job)


def finish(c: Cluster, job: str, namespace: str = "research") -> None:
    """The launcher exits 0 (kwok ends it): the MPIJob succeeds and its running workers go."""
    (launcher,) = [p for p in pods(c, job, namespace) if p["metadata"]["name"].startswith(f"{job}-launcher")]
    name = launcher["metadata"]["name"]
    c.kubectl("annotate", "pod", name, "-n", namespace, f"{kwok.COMPLETE_ANNOTATION}=true")


def condition(c: Cluster, job: str, kind: str, namespace: str = "research") -> bool:
    status = c.get("mpijob", job, "-n", namespace).get("status") or {}
    return any(x["type"] == kind and x["status"] == "True" for x in status.get("conditions", []))


def set_cordoned(c: Cluster, names: list[str], cordoned: bool) -> None:
    for n in names:
        c.kubectl("patch", "node", n, "--type=merge", "-p", json.dumps({"spec": {"unschedulable": cordoned}}))


def delete(c: Cluster, *jobs: str, namespace: str = "research") -> None:
    c.kubectl("delete", "mpijob", *jobs, "-n", namespace, "--wait=false")
    # gone, not only deleted: a pod being deleted still holds its node
    gone = lambda: not any(gang_lab.job_pods(c.api, namespace, j, terminating=True) for j in jobs)  # noqa: E731
    wait_for("the jobs' pods gone", gone)


def test_the_controllers_run_with_the_layers_flags_and_identities(cluster: Cluster) -> None:
    assert cluster.gang.dead() == {}
    # each holds its leader-election Lease under its own identity (the layer's RBAC lets it)
    ns = SYSTEM_NAMESPACE
    assert wait_for("the operator's lease", lambda: gang_lab.leader(cluster.api, ns, gang_lab.OPERATOR))
    assert wait_for(
        "the controller's lease",
        lambda: gang_lab.leader(cluster.api, "kube-system", "sched-plugins-controllers"),
    )
    assert wait_for(
        "the scheduler's lease", lambda: gang_lab.leader(cluster.api, "kube-system", "kube-scheduler")
    )
    for name in (gang_lab.OPERATOR, gang_lab.CONTROLLER):
        denied = [r for r in cluster.api.requests(f"system:serviceaccount:{ns}:{name}") if r["code"] == 403]
        assert denied == [], f"{name} was refused: {denied[:3]}"


def test_a_64_worker_job_binds_whole_or_not_at_all(cluster: Cluster) -> None:
    """63 nodes for 64 workers: nothing binds. One more node: every pod binds, together."""
    others = [n for n, team in NODES.items() if team != "any"]
    spare = "any-63"
    set_cordoned(cluster, [*others, spare], True)
    try:
        created = time.monotonic()
        job = submit(cluster, "gang64", 64)
        # the operator's PodGroup: every pod, the launcher with them, as minMember
        (group,) = wait_for("the PodGroup", lambda: cluster.get("podgroups", "-n", "research")["items"])
        assert (
            group["spec"]["minMember"] == 65 == job["spec"]["runPolicy"]["schedulingPolicy"]["minAvailable"]
        )
        wait_for("all 65 pods", lambda: len(pods(cluster, "gang64")) == 65)
        # longer than the role's gang backoff (10 s) and its retry (15 s): tried again, nothing bound
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            assert bound(cluster, "gang64") == {}, "part of a gang was bound with room for only part of it"
            time.sleep(1)
        set_cordoned(cluster, [spare], False)
        freed = time.monotonic()
        placed = wait_for("every pod bound", lambda: (b := bound(cluster, "gang64")) and len(b) == 65 and b)
        waited = time.monotonic() - freed
        workers = {pod: node for pod, node in placed.items() if "-worker-" in pod}
        assert sorted(workers.values()) == sorted(n for n in NODES if n.startswith("any-"))
        times = wait_for(
            "65 Scheduled events", lambda: (t := scheduled_times(cluster, "gang64")) and len(t) == 65 and t
        )
        spread = (times[-1] - times[0]).total_seconds()
        print(f"gang64: bound {waited:.1f} s after room appeared, all 65 within {spread:.3f} s "
              f"({time.monotonic() - created:.0f} s after creation)")  # fmt: skip
        assert spread < 5.0, f"the gang's pods were bound over {spread:.1f} s, not together"
        # the role's retry (15 s) and the scheduler's look every 30 s bound the wait, not its 5 minutes
        assert waited < 60, f"the gang waited {waited:.0f} s for a node that was there"
        wait_for("the job running", lambda: condition(cluster, "gang64", "Running"))
    finally:
        set_cordoned(cluster, [*others, spare], False)
        delete(cluster, "gang64")


def test_two_gangs_with_room_for_one_run_one_after_the_other_whole(cluster: Cluster) -> None:
    """Two 40-worker jobs at once on 64 nodes: one binds whole, the other binds nothing (no pair of
    half-placed gangs holding nodes from each other), and starts whole when the first finishes."""
    others = [n for n, team in NODES.items() if team != "any"]
    set_cordoned(cluster, others, True)
    try:
        submit(cluster, "first", 40)
        submit(cluster, "second", 40)
        wait_for("both jobs' pods", lambda: len(pods(cluster, "first")) == len(pods(cluster, "second")) == 41)
        winner = wait_for(
            "one job bound whole",
            lambda: next((j for j in ("first", "second") if len(bound(cluster, j)) == 41), None),
        )
        loser = "second" if winner == "first" else "first"
        deadline = time.monotonic() + 30  # past the backoff and the retry: the loser was tried again
        while time.monotonic() < deadline:
            assert bound(cluster, loser) == {}, f"{loser} was bound in part beside a whole {winner}"
            assert len(bound(cluster, winner)) == 41
            time.sleep(1)
        finish(cluster, winner)
        wait_for(f"{winner} succeeded", lambda: condition(cluster, winner, "Succeeded"))
        placed = wait_for(f"{loser} bound whole", lambda: (b := bound(cluster, loser)) and len(b) == 41 and b)
        assert len({n for p, n in placed.items() if "-worker-" in p}) == 40
    finally:
        set_cordoned(cluster, others, False)
        delete(cluster, "first", "second")


def test_a_teams_job_lands_on_its_own_and_the_shared_nodes_only(cluster: Cluster) -> None:
    own = submit(cluster, "own", TEAM_NODES, borrow=False)
    try:
        placed = wait_for(
            "its own nodes", lambda: (b := bound(cluster, "own")) and len(b) == TEAM_NODES + 1 and b
        )
        assert {n for p, n in placed.items() if "-worker-" in p} == {
            n for n, t in NODES.items() if t == "research"
        }
        tolerations = own["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"]["tolerations"]
        assert [t["value"] for t in tolerations] == ["research"]
        # its racks are full: a job that may not borrow waits, with other teams' and shared nodes free
        submit(cluster, "waits", 1, borrow=False)
        wait_for("its pods", lambda: len(pods(cluster, "waits")) == 2)
        # a job that may borrow lands on the shared nodes, never on another team's
        submit(cluster, "borrows", 8)
        placed = wait_for("bound", lambda: (b := bound(cluster, "borrows")) and len(b) == 9 and b)
        assert {NODES.get(n, "cpu") for p, n in placed.items() if "-worker-" in p} == {"any"}
        assert bound(cluster, "waits") == {}
    finally:
        delete(cluster, "own", "waits", "borrows")
