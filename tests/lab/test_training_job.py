"""What a training job stands on, on the lab's real nodes: cluster DNS served by the layer's CoreDNS
at the kubelets' clusterDNS address, and the gang controllers (the scheduler-plugins controller and
the MPI Operator) as the layer's own pods, each from the image `lab up` built from its pinned Go
module and converge imported under the name the layer pins.

Shares the control-plane lab and runs after test_running_the_agents (tests/lab/conftest.py), when
all three nodes have joined and the layer is applied.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from modules.platform import serving_certs
from modules.platform.gang import CONTROLLER, MPI_OPERATOR
from superkube.cli import app
from superkube.cluster import dns, gang, kube
from superkube.cluster.cloudinit import POOL_LABEL
from superkube.lab import images, machines, nodes
from superkube.lab.state import LAB_STACK, Lab
from superkube.model import teams, vmsizes
from superkube.model.spec import PREFLIGHT_TAINT_KEY
from superkube.plan import engine as planning
from tests.lab.conftest import CONTROL_PLANE, Labs, get, kubectl, ok

ROOT = Path(__file__).resolve().parents[2]
JOINED = ("gpu-1", "cpu-1", "gpu-2")  # joined by the modules before (or here, when this one runs alone)
LOOKUPS = 300


@pytest.fixture(scope="module")
def cluster(labs: Labs, control_plane: Lab) -> Lab:
    labs.apply(control_plane)
    missing = [n for n in JOINED if kubectl(control_plane, "get", "node", n).returncode != 0]
    if missing:
        nodes.join(control_plane, tuple(missing))
    return control_plane


def available(fleet: Lab, namespace: str, name: str, timeout: float = 240) -> dict[str, Any]:
    """The Deployment once every replica it asks for is available (fails after `timeout`)."""
    deadline = time.monotonic() + timeout
    while True:
        deployment = get(fleet, "-n", namespace, "deployment", name)
        want = deployment["spec"]["replicas"]
        if deployment["status"].get("availableReplicas") == want and want > 0:
            return deployment
        if time.monotonic() > deadline:
            pods = get(fleet, "-n", namespace, "pods")["items"]
            ours = [
                (p["metadata"]["name"], p["status"]) for p in pods if p["metadata"]["name"].startswith(name)
            ]
            raise AssertionError(f"{namespace}/{name} has not got {want} available replicas: {ours}")
        time.sleep(2)


def pods_of(fleet: Lab, namespace: str, selector: str) -> list[dict[str, Any]]:
    return list(get(fleet, "-n", namespace, "pods", "-l", selector)["items"])


# a pod that resolves through its resolver as every pod does (ndots:5 and the search path the kubelet
# writes), then times LOOKUPS lookups of the API's Service name
RESOLVE = r"""
import json, socket, time
def addresses(name):
    return sorted({a[4][0] for a in socket.getaddrinfo(name, None, socket.AF_INET, socket.SOCK_STREAM)})
out = {"resolv.conf": open("/etc/resolv.conf").read()}
for name in ("kubernetes.default", "kube-dns.kube-system.svc.cluster.local"):
    out[name] = addresses(name)
try:
    out["absent"] = addresses("no-such-service.default.svc.cluster.local")
except socket.gaierror as e:
    out["absent"] = e.errno == socket.EAI_NONAME
took = []
for _ in range(LOOKUPS):
    started = time.perf_counter()
    addresses("kubernetes.default.svc.cluster.local")
    took.append(time.perf_counter() - started)
took.sort()
out["p50_ms"] = round(1000 * took[len(took) // 2], 2)
out["p99_ms"] = round(1000 * took[int(len(took) * 0.99)], 2)
print(json.dumps(out))
""".replace("LOOKUPS", str(LOOKUPS))

RESOLVER_POD = """apiVersion: v1
kind: Pod
metadata: {{name: {name}, namespace: kube-system}}
spec:
  nodeSelector: {{kubernetes.io/hostname: {node}}}
  tolerations: [{{key: {preflight}, operator: Exists, effect: NoSchedule}}, {{key: {team}, operator: Exists, effect: NoSchedule}}]
  restartPolicy: Never
  containers:
  - {{name: main, image: "{image}", imagePullPolicy: Never, command: [python3, -c, {script}]}}
"""


def test_the_layers_coredns_serves_names_at_the_kubelets_cluster_dns_address(cluster: Lab) -> None:
    """CoreDNS from the pinned module's build, two replicas on two nodes, behind kube-dns at exactly
    the address every kubelet gives its pods; a pod on each node resolves the cluster's Services by
    their short and full names, and a missing one is a clean NXDOMAIN."""
    deployment = available(cluster, dns.NAMESPACE, dns.NAME)
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert container["image"] == dns.COREDNS_IMAGE == cluster.images["coredns"]["ref"]  # a registry's name
    replicas = pods_of(cluster, dns.NAMESPACE, "k8s-app=kube-dns")
    running = [p for p in replicas if p["status"].get("phase") == "Running"]
    assert len(running) == 2 and len({p["spec"]["nodeName"] for p in running}) == 2, [
        (p["metadata"]["name"], p["spec"].get("nodeName")) for p in replicas
    ]
    service = get(cluster, "-n", dns.NAMESPACE, "service", dns.SERVICE)
    _, spec, _ = planning.load(planning.find_project(), LAB_STACK)
    dns_ip = kube.service_ip(spec.service_cidr, kube.DNS_SERVICE_INDEX)
    nodes.approve_serving(cluster, ["gpu-1", "cpu-1"])  # what reaches a kubelet: configz, the pods' logs
    kubelet = json.loads(ok(cluster, "get", "--raw", "/api/v1/nodes/gpu-1/proxy/configz"))["kubeletconfig"]
    assert service["spec"]["clusterIP"] == kubelet["clusterDNS"][0], (service["spec"], kubelet["clusterDNS"])
    assert dns_ip == kubelet["clusterDNS"][0]
    api_ip = get(cluster, "-n", "default", "service", "kubernetes")["spec"]["clusterIP"]
    names = {node: f"resolve-{node}" for node in ("gpu-1", "cpu-1")}
    pods = [
        RESOLVER_POD.format(
            name=name,
            node=node,
            preflight=PREFLIGHT_TAINT_KEY,
            team=teams.TEAM_KEY,
            image=cluster.images["agents"]["ref"],
            script=json.dumps(RESOLVE),
        )
        for node, name in names.items()
    ]
    ok(cluster, "apply", "-f", "-", stdin="---\n".join(pods))
    try:
        results = {}
        for node, name in names.items():
            deadline = time.monotonic() + 180
            while (phase := get(cluster, "-n", "kube-system", "pod", name)["status"].get("phase")) not in (
                "Succeeded",
                "Failed",
            ):
                assert time.monotonic() < deadline, f"{name} is still {phase}"
                time.sleep(1)
            log = ok(cluster, "-n", "kube-system", "logs", name)
            assert phase == "Succeeded", log
            results[node] = json.loads(log.strip().splitlines()[-1])
        for node, got in results.items():
            assert f"nameserver {dns_ip}" in got["resolv.conf"], (node, got["resolv.conf"])
            assert "options ndots:5" in got["resolv.conf"] and "svc.cluster.local" in got["resolv.conf"]
            assert got["kubernetes.default"] == [api_ip], (node, got)
            assert got["kube-dns.kube-system.svc.cluster.local"] == [dns_ip], (node, got)
            assert got["absent"] is True, (node, got)
            print(
                f"\n  DNS from a pod on {node}: {LOOKUPS} lookups, p50 {got['p50_ms']} ms, p99 {got['p99_ms']} ms"
            )
    finally:
        kubectl(cluster, "-n", "kube-system", "delete", "pod", *names.values(), "--wait=false")


LEASE_LOST = {
    MPI_OPERATOR: "Leader election stopped",  # mpi-operator v0.8.2 cmd/mpi-operator/app/server.go
    CONTROLLER: "leader election lost",  # controller-runtime v0.22.3 pkg/manager/internal.go
}
"""What each gang controller's last words are when it loses its leader lease (it then exits)."""


@pytest.mark.parametrize("name", [CONTROLLER, MPI_OPERATOR])
def test_the_gang_controllers_run_as_the_layers_pods(cluster: Lab, name: str) -> None:
    """The scheduler-plugins controller and the MPI Operator run from the layer's Deployments, on
    the images built from their pinned modules under the names the layer pins, and hold their
    leader leases."""
    deployment = available(cluster, kube.SYSTEM_NAMESPACE, name)
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    # the image lab up made from the pinned component the layer names, imported under that name
    (pinned,) = [p for p in images.pinned_images() if p.ref == container["image"]]
    assert images.normalized(container["image"]) == cluster.images[pinned.component]["ref"]
    pods = pods_of(cluster, kube.SYSTEM_NAMESPACE, f"app.kubernetes.io/name={name}")
    assert pods and all(s.get("ready") for p in pods for s in p["status"].get("containerStatuses", [])), [
        (p["metadata"]["name"], p["status"]) for p in pods
    ]
    # A restart is allowed for one cause only: the leader's lease lost while the modules before this
    # one take an API server away (the load balancer drops it within ~5 s, and the MPI Operator's
    # renew deadline is 5 s, fixed in its code): the previous run then ended saying so, and no other way.
    for p in pods:
        for status in p["status"].get("containerStatuses", []):
            if status.get("restartCount", 0):
                previous = ok(cluster, "-n", kube.SYSTEM_NAMESPACE, "logs", p["metadata"]["name"], "--previous",
                              "--tail=30")  # fmt: skip
                assert LEASE_LOST[name] in previous, (p["metadata"]["name"], status, previous[-2000:])
    leases = get(cluster, "leases", "-A")["items"]
    holders = [
        lease["spec"].get("holderIdentity", "")
        for lease in leases
        if any(lease["spec"].get("holderIdentity", "").startswith(p["metadata"]["name"]) for p in pods)
    ]
    seen = [
        (x["metadata"]["namespace"], x["metadata"]["name"], x["spec"].get("holderIdentity")) for x in leases
    ]
    assert holders, f"no lease is held by a pod of {name}: {seen}"


# --- MPI jobs on the real nodes -----------------------------------------------------------------

JOB = ROOT / "examples" / "jobs" / "allreduce-lab.yaml"
TEAM = "research"


def team_namespace(fleet: Lab) -> None:
    """The example job's namespace, labelled with its team (what a cluster admin does for a team);
    made again if a module before left it terminating."""
    deadline = time.monotonic() + 120
    while (got := kubectl(fleet, "get", "namespace", TEAM, "-o", "json")).returncode == 0:
        if not json.loads(got.stdout)["metadata"].get("deletionTimestamp"):
            break
        assert time.monotonic() < deadline, f"namespace {TEAM} is still terminating"
        time.sleep(2)
    namespace = {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {"name": TEAM, "labels": {teams.TEAM_KEY: TEAM}},
    }
    ok(fleet, "apply", "-f", "-", stdin=json.dumps(namespace))


def rendered(path: Path, **change: Any) -> dict[str, Any]:
    """The MPIJob `superkube job render` writes for the job description (with `change` made to it)."""
    with tempfile.TemporaryDirectory() as tmp:
        description = yaml.safe_load(path.read_text())
        description.update(change)
        job = Path(tmp) / path.name
        job.write_text(yaml.safe_dump(description))
        result = CliRunner().invoke(app, ["job", "render", str(job), "--stack", LAB_STACK, "-o", "json"])
    assert result.exit_code == 0, result.output
    return dict(json.loads(result.stdout))


def job_pods(fleet: Lab, name: str) -> list[dict[str, Any]]:
    return [
        p
        for p in get(fleet, "-n", TEAM, "pods", "-l", f"{gang.POD_GROUP_LABEL}={name}")["items"]
        if not p["metadata"].get("deletionTimestamp")
    ]


def condition(mpijob: dict[str, Any], kind: str) -> bool:
    return any(
        c["type"] == kind and c["status"] == "True" for c in mpijob.get("status", {}).get("conditions", [])
    )


def finished(fleet: Lab, name: str, timeout: float = 300) -> dict[str, Any]:
    """The MPIJob once Succeeded or Failed (fails the test after `timeout` seconds)."""
    deadline = time.monotonic() + timeout
    while True:
        mpijob = get(fleet, "-n", TEAM, "mpijob", name)
        if condition(mpijob, "Succeeded") or condition(mpijob, "Failed"):
            return mpijob
        if time.monotonic() > deadline:
            pods = [
                (p["metadata"]["name"], p["spec"].get("nodeName"), p["status"].get("phase"))
                for p in job_pods(fleet, name)
            ]
            raise AssertionError(
                f"MPIJob {name} has not finished in {timeout} s: {mpijob.get('status')}, pods {pods}"
            )
        time.sleep(2)


def launcher_runs(fleet: Lab, name: str) -> int:
    """How many times the job's launcher ran: its pods' container starts, failed pods' included."""
    pods = get(fleet, "-n", TEAM, "pods", "-l", f"batch.kubernetes.io/job-name={name}-launcher")["items"]
    return sum(1 + s.get("restartCount", 0) for p in pods for s in p["status"].get("containerStatuses", []))


def launcher_log(fleet: Lab, name: str) -> str:
    """The log of the job's newest launcher pod (its last run, when the pod ran more than once)."""
    pods = get(fleet, "-n", TEAM, "pods", "-l", f"batch.kubernetes.io/job-name={name}-launcher")["items"]
    assert pods, f"{name} has no launcher pod"
    newest = max(pods, key=lambda p: p["metadata"]["creationTimestamp"])
    nodes.approve_serving(fleet, [newest["spec"]["nodeName"]])  # the lab's kubelet certificates last minutes
    return ok(fleet, "-n", TEAM, "logs", newest["metadata"]["name"], "--tail=200")


@pytest.fixture(scope="module")
def trainer(cluster: Lab) -> Iterator[Lab]:
    """The team's namespace, and every GPU node advertising its pool's GPUs through the lab's device
    plugin (a DaemonSet of the layer's gpu-devices component, with the lab's stand-in image)."""
    team_namespace(cluster)
    deadline = time.monotonic() + 180
    while True:
        gpus = {
            n["metadata"]["name"]: n["status"].get("allocatable", {}).get(vmsizes.GPU_RESOURCE)
            for n in get(cluster, "nodes", "-l", f"{POOL_LABEL}=gpu")["items"]
        }
        if gpus and all(v == "8" for v in gpus.values()):
            break
        assert time.monotonic() < deadline, f"the GPU nodes advertise {gpus}, not 8 GPUs each"
        time.sleep(2)
    yield cluster
    kubectl(cluster, "-n", TEAM, "delete", "mpijobs", "--all", "--wait=true", "--timeout=60s")


def test_an_mpijob_runs_to_succeeded_through_the_real_operator_scheduler_and_dns(trainer: Lab) -> None:
    """The lab's example job, as `superkube job render` writes it, gang-scheduled by the real
    scheduler onto the two GPU nodes (whose device plugin gives each its 8 GPUs), its workers reached
    by mpirun over SSH by the names in the operator's hostfile, resolved by cluster DNS to their VNet
    pod IPs; the allreduce's sum is right and the MPIJob Succeeded."""
    mpijob = rendered(JOB)
    name = mpijob["metadata"]["name"]
    started = time.monotonic()
    ok(trainer, "apply", "--server-side", "-f", "-", stdin=json.dumps(mpijob))
    running_s = None
    while running_s is None:
        pods = job_pods(trainer, name)
        if len(pods) == 3 and all(p["status"].get("phase") == "Running" for p in pods):
            running_s = time.monotonic() - started
        assert time.monotonic() - started < 240, [(p["metadata"]["name"], p["status"]) for p in pods]
        time.sleep(0.2)
    # the workers and the gang as they ran (the operator deletes both once the job is done)
    workers = {p["metadata"]["name"]: p for p in pods if "-worker-" in p["metadata"]["name"]}
    group = get(trainer, "-n", TEAM, "podgroup", name)
    assert group["spec"]["minMember"] == 3, group  # launcher + 2 workers: all or none
    assert {p["spec"]["schedulerName"] for p in pods} == {gang.SCHEDULER_NAME}
    done = finished(trainer, name)
    log = launcher_log(trainer, name)
    assert condition(done, "Succeeded"), (done.get("status"), log)
    report = json.loads(
        next(line for line in log.splitlines() if line.startswith("allreduce {")).split(" ", 1)[1]
    )
    assert report["sum"] == report["expected"] == 10 and report["ranks"] == 4, report
    assert sorted(report["hosts"]) == sorted(workers), (report["hosts"], list(workers))
    # its first run was the one: the launcher waited for its workers instead of racing them
    assert launcher_runs(trainer, name) == 1, (
        get(trainer, "-n", TEAM, "job", f"{name}-launcher")["status"],
        log,
    )
    nodes_used = {p["spec"]["nodeName"] for p in workers.values()}
    assert nodes_used == {"gpu-1", "gpu-2"}, nodes_used
    for where in report["where"]:  # each rank on its worker's own pod IP, one of its node's VNet IPs
        pod = workers[where["host"]]
        assert where["ip"] == pod["status"]["podIP"] in trainer.host(pod["spec"]["nodeName"]).secondary
    print(
        f"\n  {name}: submitted to all 3 pods Running in {running_s:.1f} s; launcher: {log.splitlines()[-1]}"
    )


def test_a_killed_worker_fails_the_run_and_the_job_starts_again_whole(trainer: Lab) -> None:
    """A worker's pod deleted mid-run: mpirun loses it and exits non-zero, the launcher is started
    again (the job's retry budget), the operator makes the worker again, and the next run, from the
    start on every worker, succeeds."""
    command = ["mpirun", "python3", "/opt/superkube/allreduce.py", "--seconds", "30"]
    mpijob = rendered(JOB, name="allreduce-retry", command=command, retries=3)
    name = mpijob["metadata"]["name"]
    assert mpijob["spec"]["runPolicy"]["backoffLimit"] == 3
    ok(trainer, "apply", "--server-side", "-f", "-", stdin=json.dumps(mpijob))
    deadline = time.monotonic() + 240
    while True:
        pods = job_pods(trainer, name)
        if len(pods) == 3 and all(p["status"].get("phase") == "Running" for p in pods):
            break
        assert time.monotonic() < deadline, [(p["metadata"]["name"], p["status"].get("phase")) for p in pods]
        time.sleep(0.5)
    victim = f"{name}-worker-1"
    # mid-run: the victim's rank is reducing (the launcher first waits for every worker's SSH, then
    # mpirun starts the ranks: a fixed sleep could end before either)
    node = next(p["spec"]["nodeName"] for p in pods if p["metadata"]["name"] == victim)
    while not machines.ssh(trainer, trainer.host(node), "pgrep -f 'allreduce[.]py --seconds'").stdout.strip():
        assert time.monotonic() < deadline, f"no rank of {name} started on {node}"
        time.sleep(0.5)
    before = get(trainer, "-n", TEAM, "pod", victim)["metadata"]["uid"]
    ok(trainer, "-n", TEAM, "delete", "pod", victim, "--wait=false")
    deadline, again, restarts = time.monotonic() + 300, set(), 0
    while True:  # until it is done: the operator deletes its workers then
        for pod in job_pods(trainer, name):
            if pod["metadata"]["name"] == victim and pod["metadata"]["uid"] != before:
                again.add(pod["metadata"]["uid"])  # the worker, made again
            if "-launcher-" in pod["metadata"]["name"]:
                counts = [s.get("restartCount", 0) for s in pod["status"].get("containerStatuses", [])]
                restarts = max(restarts, *counts, 0)
        done = get(trainer, "-n", TEAM, "mpijob", name)
        if condition(done, "Succeeded") or condition(done, "Failed"):
            break
        assert time.monotonic() < deadline, done.get("status")
        time.sleep(0.5)
    log = launcher_log(trainer, name)
    assert condition(done, "Succeeded"), (done.get("status"), log)
    assert again, f"{victim} was not made again"
    launcher = get(trainer, "-n", TEAM, "job", f"{name}-launcher")
    failed_runs = launcher["status"].get("failed", 0) + restarts
    assert 1 <= failed_runs <= 3, (launcher["status"], restarts)
    assert "sum 10, expected 10: OK" in log, log
    print(f"\n  {name}: a worker killed mid-run; {failed_runs} failed run(s), then Succeeded")


def test_two_jobs_that_each_want_every_gpu_never_deadlock(trainer: Lab) -> None:
    """Two jobs, each asking for both GPU nodes whole, submitted at once: one runs while the other
    waits with no pod bound (all or nothing, on the real kubelets), then the other runs; both
    succeed."""
    long = ["mpirun", "python3", "/opt/superkube/allreduce.py", "--seconds", "15"]
    jobs_ = [rendered(JOB, name="whole-a", command=long), rendered(JOB, name="whole-b", command=long)]
    names = [j["metadata"]["name"] for j in jobs_]
    ok(trainer, "apply", "--server-side", "-f", "-", stdin="\n".join(json.dumps(j) for j in jobs_))
    deadline = time.monotonic() + 420
    seen_alone: set[str] = set()
    while True:
        bound = {}
        for n in names:
            pods = job_pods(trainer, n)
            bound[n] = [p["metadata"]["name"] for p in pods if p["spec"].get("nodeName")]
        workers = {n: [b for b in bound[n] if "-worker-" in b] for n in names}
        # never both holding GPU nodes: a half-placed gang on each would wait for the other forever
        assert not all(workers.values()), bound
        for n in names:
            other = next(m for m in names if m != n)
            if len(bound[n]) == 3 and not bound[other]:
                seen_alone.add(n)  # n runs whole, the other waits whole
        states = [get(trainer, "-n", TEAM, "mpijob", n) for n in names]
        if all(condition(s, "Succeeded") or condition(s, "Failed") for s in states):
            break
        assert time.monotonic() < deadline, (bound, [s.get("status") for s in states])
        time.sleep(0.5)
    assert all(condition(s, "Succeeded") for s in states), [
        (s.get("status"), launcher_log(trainer, n)) for n, s in zip(names, states, strict=True)
    ]
    assert seen_alone, "neither job was seen running whole while the other waited with nothing bound"
    print(
        f"\n  two whole-capacity jobs: {sorted(seen_alone)} seen running while the other waited; both Succeeded"
    )


GUIDE = ROOT / "docs" / "02-the-lab.md"
SEQUENCE = "<!-- the sequence tests/lab/test_training_job.py runs as written"


def guide_sequence() -> list[str]:
    """The lab guide's commands from nothing to a finished job, each without its comment."""
    text = GUIDE.read_text()
    block = text[text.index(SEQUENCE) :]
    body = block[block.index("```sh\n") + 6 :]
    body = body[: body.index("```")]
    return [line.split("  #")[0].strip() for line in body.splitlines() if line.strip()]


def test_the_lab_guide_s_sequence_runs_a_job_to_its_end_as_written(trainer: Lab) -> None:
    """The guide's sequence, each command as a person types it (bash, the installed superkube on the
    PATH, from the checkout), on the lab these tests share: its first commands are what that lab
    already did (the same shape, booted by `lab up`'s code and converged by converge's, which take
    most of the suite's time to do again), and its last (`lab down`) is the session's end. The job's
    log is read through the kubelet on the launcher's node, whose serving certificate the layer's
    approver Deployment keeps renewed: no test-side approval runs here."""
    steps = guide_sequence()
    assert steps[:4] == [
        'make doctor PATHS="offline lab"',
        "make install && . .venv/bin/activate",
        f"superkube lab up --hosts {CONTROL_PLANE}",
        "superkube converge",
    ], steps
    assert steps[-1] == "superkube lab down", steps
    script = [steps[0], *steps[4:-1]]  # make install: make test installed it, and the PATH has it
    kubectl(trainer, "-n", TEAM, "delete", "mpijob", "allreduce-lab", "--ignore-not-found", "--wait=true",
            "--timeout=60s")  # fmt: skip
    installed = str(Path(sys.executable).parent)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    env["PATH"] = f"{installed}{os.pathsep}{env.get('PATH', '')}"
    started = time.monotonic()
    proc = subprocess.run(
        ["bash", "-c", "set -eo pipefail\nset -x\n" + "\n".join(script)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=1200,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(
        next(line for line in proc.stdout.splitlines() if line.startswith("allreduce {")).split(" ", 1)[1]
    )
    assert report["sum"] == report["expected"] == 10 and report["ranks"] == 4, report
    # the approver that kept the kubelets reachable is the layer's Deployment, at work on the lab
    approver = ok(
        trainer, "-n", serving_certs.NAMESPACE, "logs", f"deployment/{serving_certs.NAME}", "--tail=-1"
    )
    assert "approved: the addresses of node" in approver, approver[-2000:]
    print(
        f"\n  the lab guide's sequence, after converge: {time.monotonic() - started:.0f} s to the job's log"
    )
