"""Gang scheduling and MPI in the cluster: the CRDs kept as data, the scheduler-plugins controller at
the scheduler's own release, the MPI Operator pointed at our scheduler's name; and `superkube job
render`: examples become MPIJobs valid against the MPIJob CRD and the official pod schema, one gang
of whole GPU nodes, and jobs that can never fit fail with one line."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from typer.testing import CliRunner

from superkube.cli import app
from superkube.cluster import gang, jobs, render
from superkube.model import teams, vmsizes
from superkube.plan import engine as planning
from superkube.plan import layer
from superkube.plan.engine import Plan
from tests.conftest import ROOT

EXAMPLES = sorted((ROOT / "examples" / "jobs").glob("*.yaml"))
ALLREDUCE = ROOT / "examples" / "jobs" / "allreduce.yaml"
PODGROUP_SPEC_V1ALPHA1 = {"minMember", "minResources", "scheduleTimeoutSeconds"}
PODGROUP_STATUS_V1ALPHA1 = {"phase", "occupiedBy", "running", "succeeded", "failed", "scheduleStartTime"}


def of_kind(plan: Plan, kind: str, component: str = "gang-scheduling") -> list[dict[str, Any]]:
    return [o for o in layer.objects(plan).get(component, []) if o["kind"] == kind]


def deployment(plan: Plan, name: str) -> dict[str, Any]:
    (d,) = [d for d in of_kind(plan, "Deployment") if d["metadata"]["name"] == name]
    return d


def test_the_podgroup_crd_is_the_releases_api(dev_plan: Plan) -> None:
    crds = {c["metadata"]["name"]: c for c in of_kind(dev_plan, "CustomResourceDefinition")}
    assert set(crds) == set(gang.MPI_CRDS)  # the PodGroup CRDs come with converge (kube_apiserver)
    crds.update({name: gang.crd(name) for name in gang.GANG_CRDS})
    (version,) = crds["podgroups.scheduling.x-k8s.io"]["spec"]["versions"]
    assert (version["name"], version["storage"]) == ("v1alpha1", True)
    schema = version["schema"]["openAPIV3Schema"]
    assert set(schema["properties"]["spec"]["properties"]) == PODGROUP_SPEC_V1ALPHA1
    assert set(schema["properties"]["status"]["properties"]) == PODGROUP_STATUS_V1ALPHA1
    gang_ = {"apiVersion": gang.PODGROUP_API, "kind": "PodGroup", "metadata": {"name": "job"},
             "spec": {"minMember": 65, "minResources": {"nvidia.com/gpu": 512}, "scheduleTimeoutSeconds": 300}}  # fmt: skip
    assert render.validate(gang_, "1.35.0") == []
    assert render.validate({**gang_, "spec": {"minMember": 0}}, "1.35.0")
    assert render.validate({**gang_, "spec": {"minMembers": 2}}, "1.35.0")  # strict: a misspelt field


def test_the_controller_runs_the_schedulers_own_release(dev_plan: Plan) -> None:
    release = yaml.safe_load((gang.RELEASES / "release-1.35.yml").read_text())["kube_component_release"]
    scheduler_tag = release["images"]["kube-scheduler"]["ref"].rsplit(":", 1)[1]
    container = deployment(dev_plan, "scheduler-plugins-controller")["spec"]["template"]["spec"][
        "containers"
    ][0]
    assert container["image"] == f"registry.k8s.io/scheduler-plugins/controller:{scheduler_tag}"
    # (the scheduler's own access to PodGroups comes with converge: tests/playbooks/test_rendered_objects)


def test_the_mpi_operator_gangs_through_our_scheduler(dev_plan: Plan) -> None:
    container = deployment(dev_plan, "mpi-operator")["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == f"mpioperator/mpi-operator:{gang.MPI_OPERATOR_VERSION}"
    flags = dict(a.removeprefix("--").partition("=")[::2] for a in container["args"])
    # the value is the schedulerName it writes into pods: the gang scheduler's one profile
    template = (ROOT / "playbooks/roles/gang_scheduler/templates/scheduler-config.yaml.j2").read_text()
    assert f"schedulerName: {flags['gang-scheduling']}" in template
    assert flags["lock-namespace"] == "superkube-system"
    # its health server always takes port 8080 (no flag moves it): metrics on the same port made the
    # operator exit at start in the lab ("bind: address already in use")
    assert flags["monitoring-port"] != "8080"
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"metrics": int(flags["monitoring-port"]), "healthz": 8080}
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": 8080}
    roles = {r["metadata"]["name"]: r for r in of_kind(dev_plan, "ClusterRole")}
    operator = roles["mpi-operator"]["rules"]
    assert any("podgroups" in r["resources"] and "create" in r["verbs"] for r in operator)
    assert (
        roles["superkube:mpijobs-edit"]["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-edit"]
        == "true"
    )


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_each_example_renders_one_valid_gang_of_whole_nodes(path: Path) -> None:
    stack = "flagship" if "flagship" in path.read_text() else "dev"
    _, spec, _ = planning.load(ROOT, stack)
    job = jobs.load(path)
    mpijob = jobs.render(job, spec)
    assert jobs.problems(mpijob, spec.kubernetes_version) == []
    pool = next(p for p in spec.node_pools if p.role == "gpu")
    vm = vmsizes.size(pool.vm_size, "test")
    replicas = mpijob["spec"]["mpiReplicaSpecs"]
    assert mpijob["spec"]["runPolicy"]["schedulingPolicy"]["minAvailable"] == job.workers + 1
    assert replicas["Worker"]["replicas"] == job.workers and replicas["Launcher"]["replicas"] == 1
    worker = replicas["Worker"]["template"]["spec"]
    requests = worker["containers"][0]["resources"]["requests"]
    assert requests["nvidia.com/gpu"] == str(vm.gpus)  # the whole node's GPUs
    whole = vmsizes.fill_one_node(vm)  # and its CPU and memory, unless the job asks for less
    assert requests == {
        **whole,
        "cpu": job.worker_cpu or whole["cpu"],
        "memory": job.worker_memory or whole["memory"],
    }
    assert mpijob["spec"]["slotsPerWorker"] == (job.gpus_per_worker or vm.gpus)
    for role in ("Launcher", "Worker"):
        template = replicas[role]["template"]
        assert template["metadata"]["labels"][gang.POD_GROUP_LABEL] == job.name
        assert template["metadata"]["labels"][teams.TEAM_KEY] == job.team
        assert template["spec"]["tolerations"] == teams.tolerations_for(job.team, job.borrow)
    assert mpijob["spec"]["launcherCreationPolicy"] == "AtStartup"  # WaitForWorkersReady deadlocks a gang


def test_the_mpijob_schema_is_strict_and_the_templates_are_pod_checked() -> None:
    _, spec, _ = planning.load(ROOT, "dev")
    mpijob = jobs.render(jobs.load(ALLREDUCE), spec)
    bad = yaml.safe_load(yaml.safe_dump(mpijob))
    bad["spec"]["slotsPerWorkr"] = 8
    assert any("unknown field" in p for p in jobs.problems(bad, "1.35.0"))
    bad = yaml.safe_load(yaml.safe_dump(mpijob))
    bad["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]["imagePullPolice"] = (
        "Always"
    )
    assert any(p.startswith("Worker template:") for p in jobs.problems(bad, "1.35.0"))
    bad = yaml.safe_load(yaml.safe_dump(mpijob))
    bad["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["metadata"]["labels"].pop(gang.POD_GROUP_LABEL)
    assert jobs.problems(bad, "1.35.0") == [
        f"Launcher template: label {gang.POD_GROUP_LABEL} is None, not the job's name 'allreduce'"
    ]
    schema = render.crd_schemas()[(gang.MPIJOB_API, "MPIJob")]
    jsonschema.validate(mpijob, schema)


def job_file(tmp_path: Path, **change: Any) -> Path:
    base = yaml.safe_load(ALLREDUCE.read_text())
    base.update(change)
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(base))
    return path


@pytest.mark.parametrize(
    ("change", "words"),
    [
        (
            {"gpus_per_worker": 16},
            "16 GPUs per worker, but a Standard_ND96isr_H100_v5 node of pool gpu has 8",
        ),
        ({"workers": 5}, "5 workers, but pool gpu holds at most 4 nodes"),
        ({"team": "reserch"}, "team 'reserch' is not in the stack's teams (research)"),
        ({"pool": "cpu"}, "pool cpu has no GPUs"),
        ({"pool": "h200"}, "no pool 'h200' in the stack"),
        ({"image": "trainer:latest"}, "image: 'trainer:latest' is not pinned"),
        ({"name": "All_Reduce"}, "name: 'All_Reduce' is not a job name"),
        ({"gpus": 8}, "gpus: unknown key"),
        ({"workers": 0}, "workers: Input should be greater than or equal to 1"),
        ({"retries": -1}, "retries: Input should be greater than or equal to 0"),
        ({"image": "registry.example.com/team/trainer"}, "is not pinned; write image:version"),
        (
            {"worker_cpu": "200"},
            "worker_cpu 200 is more than a Standard_ND96isr_H100_v5 node of pool gpu has",
        ),
        ({"worker_memory": "lots"}, "worker_memory: 'lots' is not a memory quantity; write it like 512Mi"),
        ({"worker_cpu": "500Mi"}, "worker_cpu: '500Mi' is not a CPU quantity"),
        ({"launcher_memory": "64Gi"}, "a launcher of 1 CPU and 64Gi is more than a Standard_D8s_v5 node"),
    ],
    ids=[
        "too many GPUs",
        "too many workers",
        "unknown team",
        "cpu pool",
        "no such pool",
        "latest",
        "name",
        "unknown key",
        "no workers",
        "negative retries",
        "no tag",
        "more CPU than a node",
        "memory not a quantity",
        "CPU in bytes",
        "launcher bigger than a CPU node",
    ],
)
def test_a_job_that_can_never_run_is_one_line_and_exit_2(
    tmp_path: Path, change: dict[str, Any], words: str
) -> None:
    result = CliRunner().invoke(
        app, ["job", "render", str(job_file(tmp_path, **change)), "--stack", "dev", "--project", str(ROOT)]
    )
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and words in lines[0], result.output


def test_a_retry_budget_restarts_the_whole_job(tmp_path: Path) -> None:
    """retries is the launcher Job's backoffLimit; workers restart in their pods, so the launcher's
    next try reaches every one of them (with Never, a killed worker would end the job for good)."""
    _, spec, _ = planning.load(ROOT, "dev")
    once = jobs.render(jobs.load(ALLREDUCE), spec)
    assert once["spec"]["runPolicy"]["backoffLimit"] == 0  # no budget unless asked for
    mpijob = jobs.render(jobs.load(job_file(tmp_path, retries=3)), spec)
    assert mpijob["spec"]["runPolicy"]["backoffLimit"] == 3
    replicas = mpijob["spec"]["mpiReplicaSpecs"]
    assert replicas["Worker"]["restartPolicy"] == "OnFailure"
    assert replicas["Launcher"]["restartPolicy"] == "OnFailure"
    assert jobs.problems(mpijob, spec.kubernetes_version) == []


def test_workers_may_ask_for_less_than_the_whole_node(tmp_path: Path) -> None:
    """worker_cpu and worker_memory replace the whole node's CPU and memory; the GPUs stay whole."""
    _, spec, _ = planning.load(ROOT, "dev")
    mpijob = jobs.render(jobs.load(job_file(tmp_path, worker_cpu="500m", worker_memory="1Gi")), spec)
    resources = mpijob["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]["resources"]
    assert resources["requests"] == {"cpu": "500m", "memory": "1Gi", "nvidia.com/gpu": "8"}
    assert resources["limits"] == {"memory": "1Gi", "nvidia.com/gpu": "8"}
    assert jobs.millicores("1.5") == 1500 and jobs.mebibytes("2Gi") == 2048
    whole_cores = jobs.render(jobs.load(job_file(tmp_path, worker_cpu=2)), spec)  # YAML's number 2
    assert (
        whole_cores["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]["resources"][
            "requests"
        ]["cpu"]
        == "2"
    )


def test_the_cli_writes_the_mpijob(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        app, ["job", "render", str(ALLREDUCE), "--stack", "dev", "--project", str(ROOT)]
    )
    assert result.exit_code == 0, result.output
    (doc,) = list(yaml.safe_load_all(result.output))
    assert (doc["apiVersion"], doc["kind"], doc["metadata"]["name"]) == (
        gang.MPIJOB_API,
        "MPIJob",
        "allreduce",
    )


def _launch(tmp_path: Path, hostfile: str, answers_after: dict[str, int], wait_s: int) -> tuple[str, str]:
    """The launcher's command as rendered, run by /bin/sh with the hostfile at a path of the test's and
    an `ssh` first on PATH that answers for a host only from its Nth try (a host not named: never);
    it returns the command's output and the wait's stderr."""
    (tmp_path / "hostfile").write_text(hostfile)
    tries = tmp_path / "tries"
    tries.mkdir()
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    ssh = bin_ / "ssh"
    needed = " ".join(f"{h}={n}" for h, n in answers_after.items())
    ssh.write_text(
        "#!/bin/sh\n"
        'for a in "$@"; do [ "$a" = true ] && break; host="$a"; done\n'  # ... HOST true
        f'echo x >> "{tries}/$host"\n'
        f"for pair in {needed}; do\n"
        '  [ "${pair%%=*}" = "$host" ] || continue\n'
        f'  [ "$(wc -l < "{tries}/$host")" -ge "${{pair#*=}}" ] && exit 0\n'
        "done\n"
        "exit 255\n"
    )
    ssh.chmod(0o755)
    job = jobs.JobSpec(
        name="waits", image="trainer:1", command=["echo", "ran with", "$HOME"], workers=2, team="t",
        wait_for_workers_seconds=wait_s,
    )  # fmt: skip
    command = jobs.launcher_command(job)
    assert command[:2] == ["/bin/sh", "-c"] and command[4:] == job.command
    script = command[2].replace(jobs.HOSTFILE, str(tmp_path / "hostfile"))
    env = {"PATH": f"{bin_}:/usr/bin:/bin", jobs.WAIT_SECONDS_ENV: str(wait_s)}
    proc = subprocess.run(
        [command[0], command[1], script, *command[3:]], env=env, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout, proc.stderr


def test_the_launcher_waits_until_every_worker_answers_over_ssh(tmp_path: Path) -> None:
    """mpirun started before a worker's name resolves fails at once and spends a retry: the launcher
    first tries each host of the operator's hostfile (OpenMPI's `name slots=N`, Intel's `name:N`)
    until ssh runs there, then runs the job's command with its arguments as given."""
    out, err = _launch(tmp_path, "w-0.svc slots=8\nw-1.svc:8\n", {"w-0.svc": 2, "w-1.svc": 3}, 120)
    assert out == "ran with $HOME\n" and err == ""
    assert {p.name: len(p.read_text().split()) for p in (tmp_path / "tries").iterdir()} == {
        "w-0.svc": 2,
        "w-1.svc": 3,
    }


def test_a_worker_that_never_answers_ends_the_wait_with_one_line(tmp_path: Path) -> None:
    out, err = _launch(tmp_path, "w-0.svc slots=8\nw-1.svc slots=8\n", {"w-0.svc": 1}, 1)
    assert out == "ran with $HOME\n"
    assert err.strip().splitlines() == [
        "superkube: worker w-1.svc did not answer over SSH within 1s; running the command all the same"
    ]


def test_no_wait_leaves_the_command_as_given(tmp_path: Path) -> None:
    _, spec, _ = planning.load(ROOT, "dev")
    mpijob = jobs.render(jobs.load(job_file(tmp_path, wait_for_workers_seconds=0)), spec)
    launcher = mpijob["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"][0]
    assert launcher["command"] == jobs.load(ALLREDUCE).command
    assert jobs.WAIT_SECONDS_ENV not in {e["name"] for e in launcher.get("env", [])}
    assert jobs.problems(mpijob, spec.kubernetes_version) == []
    waits = jobs.render(jobs.load(ALLREDUCE), spec)
    launcher = waits["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"][0]
    assert {"name": jobs.WAIT_SECONDS_ENV, "value": "300"} in launcher["env"]
    assert jobs.problems(waits, spec.kubernetes_version) == []


def test_every_field_of_a_job_is_in_the_guide_s_table() -> None:
    """The guide's table of a job's fields names each field JobSpec has, and none it does not."""
    import re

    text = (ROOT / "docs" / "06-jobs-and-teams.md").read_text()
    table = text[text.index("| field | default | what it is |") :]
    table = table[: table.index("\n\n")]
    named = {f for row in table.splitlines()[2:] for f in re.findall(r"`([a-z_]+)`", row.split("|")[1])}
    assert named == set(jobs.JobSpec.model_fields), named ^ set(jobs.JobSpec.model_fields)
