"""A user's short job description -> an MPIJob that runs as one gang on whole GPU nodes.

    name: allreduce
    image: registry.example.com/team/trainer:1.4.2
    command: [mpirun, python, train.py]
    workers: 4
    team: research

becomes a `kubeflow.org/v2beta1` MPIJob whose workers each request a whole node of the GPU pool
(all its GPUs, and its CPU and memory less the node agents' share), carry the team's label and
toleration (the webhook would add the same), and whose launcher and workers carry the pod-group
label; `runPolicy.schedulingPolicy.minAvailable` = launcher + workers, so the MPI Operator's
PodGroup makes Coscheduling place all of them or none. The result is checked against the MPIJob
CRD schema (data/crds) and each pod template against the official pod schema of the cluster's
version. A job that can never fit fails with one line.

A job that fails (a worker lost or killed mid-run, so mpirun exits non-zero) is started again whole,
`retries` times: the launcher is a batch Job whose backoffLimit is the MPIJob's runPolicy.backoffLimit,
and each time its container starts again (restartPolicy OnFailure) it runs mpirun from the start on
every worker. Workers restart OnFailure, so a
worker whose SSH server died is back in its own pod for that next try, and one whose pod is gone is
made again by the operator (and gang-scheduled as a member of the job's running PodGroup).

The launcher is created at startup (launcherCreationPolicy AtStartup): with WaitForWorkersReady
the launcher, a member of the gang, would wait for workers that themselves wait at Permit for the
whole gang, launcher included, and the job would never start. Started beside its workers, though,
mpirun races them: a worker's name resolves only once its pod is ready (its Service publishes no
addresses before), and ssh does not retry a name that does not resolve, so a launcher that starts
first fails at once and spends the job's retries before any rank ran (the MPI Operator leaves that
to the launcher Job's retries). So the launcher first waits, at most `wait_for_workers_seconds`, until
every host of its hostfile answers over SSH as mpirun will reach it, then runs the job's command
(after the wait with a line saying which worker did not answer, and mpirun says the rest).
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator

from superkube.cluster import gang
from superkube.cluster.cloudinit import POOL_LABEL
from superkube.model import files, teams, vmsizes
from superkube.model.spec import ClusterSpec, NodePool
from superkube.model.vmsizes import GPU_RESOURCE

_NAME = re.compile(r"^[a-z]([a-z0-9-]{0,38}[a-z0-9])?$")


class JobError(ValueError):
    """A job that cannot be rendered or can never run: one line saying what, where and how to fix it."""


class JobSpec(BaseModel):
    """The short description of one MPI job."""

    model_config = ConfigDict(extra="forbid", frozen=True, str_strip_whitespace=True)

    name: str = Field(description="Job name (a DNS label of at most 40 characters; pods add suffixes).")
    namespace: str | None = Field(
        default=None,
        description=(
            "Namespace the MPIJob is created in: one labelled with the job's team when the stack has "
            "teams (the team webhook admits a team's pods only there); default: `default` on a stack "
            "without teams."
        ),
    )
    image: str = Field(
        description="Container image of the launcher and the workers, pinned by tag or digest."
    )
    command: list[str] = Field(min_length=1, description="The launcher's command (usually mpirun ...).")
    worker_command: list[str] = Field(
        default=["/usr/sbin/sshd", "-De"], min_length=1, description="The workers' command (an SSH server)."
    )
    workers: int = Field(ge=1, le=100_000, description="Worker pods, one per GPU node.")
    gpus_per_worker: int | None = Field(
        default=None,
        ge=1,
        description=(
            "MPI ranks (slots) per worker (default: one per GPU of the node). A worker always takes the "
            "whole node and all its GPUs; fewer ranks leave GPUs to the ranks' own use (threads, "
            "several GPUs per rank)."
        ),
    )
    team: str = Field(description="The team the job runs as (its pods' superkube.io/team label).")
    borrow: bool = Field(default=False, description="Also run on capacity marked any.")
    pool: str | None = Field(default=None, description="GPU pool (default: the stack's only GPU pool).")
    mpi_implementation: Literal["OpenMPI", "Intel", "MPICH"] = Field(
        default="OpenMPI",
        description="The MPI the image's mpirun is: it decides the hostfile's format (OpenMPI, Intel, MPICH).",
    )
    schedule_timeout_seconds: int = Field(
        default=600,
        ge=1,
        description=(
            "How long the gang may wait for room for every pod (its PodGroup's scheduleTimeoutSeconds) "
            "before the scheduler gives its place to other gangs and tries it again."
        ),
    )
    retries: int = Field(
        default=0,
        ge=0,
        le=100,
        description=(
            "Times the whole job is started again after it fails (a worker lost or killed mid-run, mpirun "
            "exiting non-zero): the MPIJob's runPolicy.backoffLimit. Each retry runs mpirun from the "
            "start on every worker; the program resumes from its own checkpoints."
        ),
    )
    worker_cpu: str | None = Field(
        default=None,
        description="CPU each worker asks for (a Kubernetes quantity); default: the whole node's less the node agents'.",
    )
    launcher_cpu: str = Field(
        default="1", description="CPU the launcher (mpirun) asks for (a Kubernetes quantity)."
    )
    launcher_memory: str = Field(
        default="2Gi", description="Memory the launcher asks for and is held to (a Kubernetes quantity)."
    )
    worker_memory: str | None = Field(
        default=None,
        description="Memory each worker asks for and is held to (a Kubernetes quantity); default: the whole node's less the node agents'.",
    )
    env: dict[str, str] = Field(default_factory=dict, description="Environment of every container.")
    wait_for_workers_seconds: int = Field(
        default=300,
        ge=0,
        le=86_400,
        description=(
            "How long the launcher waits for every worker to answer over SSH before it runs the command "
            "(0: no wait); mpirun started before a worker is ready fails and spends a retry."
        ),
    )

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not _NAME.match(v):
            raise ValueError(
                f"{v!r} is not a job name; use 1-40 characters a-z, 0-9 and '-', starting with a letter"
            )
        return v

    @field_validator("worker_cpu", "launcher_cpu", "worker_memory", "launcher_memory", mode="before")
    @classmethod
    def _number(cls, v: object) -> object:
        """`worker_cpu: 2` in YAML is a number: a quantity all the same."""
        return str(v) if isinstance(v, int | float) and not isinstance(v, bool) else v

    @field_validator("worker_cpu", "launcher_cpu", "worker_memory", "launcher_memory")
    @classmethod
    def _quantity(cls, v: str | None, info: ValidationInfo) -> str | None:
        if v is not None:
            (millicores if str(info.field_name).endswith("_cpu") else mebibytes)(v)
        return v

    @field_validator("image")
    @classmethod
    def _image(cls, v: str) -> str:
        tag = v.rsplit("/", 1)[-1]
        if "@sha256:" not in v and (":" not in tag or tag.endswith(":latest")):
            raise ValueError(f"{v!r} is not pinned; write image:version or image@sha256:<digest>")
        return v


_QUANTITY = re.compile(r"^([0-9]+(?:\.[0-9]+)?)(m|k|M|G|T|Ki|Mi|Gi|Ti)?$")
_FACTORS = {
    "": 1.0,
    "k": 1e3,
    "M": 1e6,
    "G": 1e9,
    "T": 1e12,
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
}


def millicores(quantity: str) -> int:
    """A CPU quantity (`2`, `500m`, `1.5`) in millicores, or ValueError saying how to write one."""
    m = _QUANTITY.match(quantity)
    if not m or m.group(2) not in (None, "m") or float(m.group(1)) <= 0:
        raise ValueError(f"{quantity!r} is not a CPU quantity; write cores (2, 1.5) or millicores (500m)")
    return round(float(m.group(1)) * (1 if m.group(2) == "m" else 1000))


def mebibytes(quantity: str) -> float:
    """A memory quantity (`512Mi`, `2Gi`, `1G`) in MiB, or ValueError saying how to write one."""
    m = _QUANTITY.match(quantity)
    if not m or m.group(2) == "m" or float(m.group(1)) <= 0:
        raise ValueError(f"{quantity!r} is not a memory quantity; write it like 512Mi or 16Gi")
    return float(m.group(1)) * _FACTORS[m.group(2) or ""] / 2**20


def load(path: Path) -> JobSpec:
    try:
        data = files.load(
            path,
            fix="write a YAML mapping of name, image, command, workers, team, ... (examples/jobs/ shows them)",
            what="a YAML mapping of name, image, command, workers, team, ...",
        )
    except files.FileError as e:
        raise JobError(str(e)) from None
    try:
        return JobSpec.model_validate(data)
    except ValidationError as e:
        # an unknown key first: `worker: 4` is a misspelt workers, not a missing one
        errors = sorted(e.errors(include_url=False), key=lambda x: x["type"] != "extra_forbidden")
        err = errors[0]
        loc = ".".join(str(p) for p in err["loc"])
        msg = str(err["msg"]).removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            close = difflib.get_close_matches(str(err["loc"][-1]), list(JobSpec.model_fields), n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            msg = f"unknown key; {hint}use one of: {', '.join(JobSpec.model_fields)}"
        elif err["type"] == "missing":
            msg = "is required; add it"
        if "; " not in msg:
            msg += "; examples/jobs/ shows whole jobs"
        raise JobError(f"{path}: {loc}: {msg}") from None


def _pool(job: JobSpec, spec: ClusterSpec) -> NodePool:
    gpu_pools = [p for p in spec.node_pools if p.role == "gpu"]
    if job.pool is None:
        if len(gpu_pools) != 1:
            raise JobError(
                f"job {job.name}: the stack has GPU pools {[p.name for p in gpu_pools]}; name one as pool:"
            )
        return gpu_pools[0]
    for p in spec.node_pools:
        if p.name == job.pool:
            if p.role != "gpu":
                raise JobError(
                    f"job {job.name}: pool {p.name} has no GPUs; use a GPU pool: {[q.name for q in gpu_pools]}"
                )
            return p
    raise JobError(
        f"job {job.name}: no pool {job.pool!r} in the stack; use one of {[p.name for p in gpu_pools]}"
    )


def _launcher_pool(spec: ClusterSpec) -> NodePool | None:
    """The pool the launcher runs on: the stack's first CPU pool (none: beside the workers)."""
    return next((p for p in spec.node_pools if p.role == "cpu"), None)


def _fits(job: JobSpec, spec: ClusterSpec, pool: NodePool, vm: vmsizes.VmSize) -> None:
    if job.gpus_per_worker is not None and job.gpus_per_worker > vm.gpus:
        raise JobError(
            f"job {job.name}: {job.gpus_per_worker} GPUs per worker, but a {vm.name} node of pool {pool.name} "
            f"has {vm.gpus}; use at most {vm.gpus} per worker and more workers"
        )
    if job.workers > pool.nodes:
        raise JobError(
            f"job {job.name}: {job.workers} workers, but pool {pool.name} holds at most {pool.nodes} nodes "
            "(one worker per node); use fewer workers or raise the pool's nodes"
        )
    whole = vmsizes.fill_one_node(vm)
    for what, given, most, unit in (
        ("worker_cpu", job.worker_cpu, millicores(whole["cpu"]), millicores),
        ("worker_memory", job.worker_memory, mebibytes(whole["memory"]), mebibytes),
    ):
        if given is not None and unit(given) > most:
            raise JobError(
                f"job {job.name}: {what} {given} is more than a {vm.name} node of pool {pool.name} has for "
                f"pods ({whole[what.removeprefix('worker_')]}); ask for at most that, or leave {what} out"
            )
    home = _launcher_pool(spec) or pool
    room = vmsizes.fill_one_node(vmsizes.size(home.vm_size, f"node_pools[{home.name}].vm_size"))
    if millicores(job.launcher_cpu) > millicores(room["cpu"]) or mebibytes(job.launcher_memory) > mebibytes(
        room["memory"]
    ):
        raise JobError(
            f"job {job.name}: a launcher of {job.launcher_cpu} CPU and {job.launcher_memory} is more than a "
            f"{home.vm_size} node of pool {home.name} has for pods ({room['cpu']}, {room['memory']}); ask for less"
        )


def _team_fits(job: JobSpec, spec: ClusterSpec, pool: NodePool, cluster: str) -> str:
    """The job's namespace, once its team can be placed on the pool; else a JobError saying why not."""
    if not spec.teams:
        return job.namespace or "default"
    named = {t.team for t in spec.teams} - {teams.ANY}
    if job.team not in named:
        raise JobError(
            f"job {job.name}: team {job.team!r} is not in the stack's teams ({', '.join(sorted(named))}); "
            "use one of them or add the team's tuples to superkube:teams"
        )
    owner = spec.pool_team(pool, cluster)
    later = spec.later_teams(pool, cluster)
    if not (owner in (None, job.team) or (owner == teams.ANY and job.borrow) or job.team in later):
        mine = [p for p, t in spec.team_pools(cluster).items() if t == job.team and p != pool.name]
        if owner == teams.ANY:
            fix = "set borrow: true to run on it"
        else:
            fix = (
                f"run it on {job.team}'s pool ({', '.join(mine)})"
                if mine
                else f"give {job.team} nodes in superkube:teams"
            )
        raise JobError(
            f"job {job.name}: pool {pool.name}'s nodes belong to team {owner!r} (superkube:teams), so team "
            f"{job.team!r}'s workers could never be placed; {fix}"
        )
    if job.namespace is None:
        raise JobError(
            f"job {job.name}: no namespace, and the team webhook admits {job.team}'s pods only in a namespace "
            f"labelled {teams.TEAM_KEY}={job.team}; set namespace: to that namespace "
            f"(a cluster admin labels one: kubectl label namespace <name> {teams.TEAM_KEY}={job.team})"
        )
    return job.namespace


def _container(name: str, job: JobSpec, command: list[str], resources: dict[str, Any]) -> dict[str, Any]:
    container: dict[str, Any] = {"name": name, "image": job.image, "command": command, "resources": resources}
    if job.env:
        container["env"] = [{"name": k, "value": v} for k, v in sorted(job.env.items())]
    return container


HOSTFILE = "/etc/mpi/hostfile"
"""Where the MPI Operator mounts the job's hostfile in the launcher (`name slots=N` for OpenMPI,
`name:N` for Intel MPI and MPICH)."""
WAIT_SECONDS_ENV = "SUPERKUBE_WAIT_FOR_WORKERS_SECONDS"
WAIT_FOR_WORKERS = f"""\
deadline=$(( $(date +%s) + ${{{WAIT_SECONDS_ENV}}} ))
for host in $(sed -e 's/[: ].*//' {HOSTFILE}); do
  until ssh -o BatchMode=yes -o ConnectTimeout=5 "$host" true </dev/null >/dev/null 2>&1; do
    if [ "$(date +%s)" -ge "$deadline" ]; then
      echo "superkube: worker $host did not answer over SSH within ${{{WAIT_SECONDS_ENV}}}s; running the command all the same" >&2
      break
    fi
    sleep 2
  done
done
exec "$@"
"""
"""The launcher's wait (POSIX sh, the tools an MPI image has): each host of the hostfile in turn until
ssh, configured as the image configures it for mpirun, runs `true` there; then the job's command."""


def launcher_command(job: JobSpec) -> list[str]:
    """The launcher's command: the job's, after the wait for its workers (none when the wait is 0)."""
    if not job.wait_for_workers_seconds:
        return list(job.command)
    return ["/bin/sh", "-c", WAIT_FOR_WORKERS, "superkube-wait-for-workers", *job.command]


def render(job: JobSpec, spec: ClusterSpec, cluster: str = "") -> dict[str, Any]:
    """The MPIJob of a job description on this stack's cluster (named `cluster`; default: its
    superkube:cluster_name), or a JobError saying why it can never run."""
    pool = _pool(job, spec)
    vm = vmsizes.size(pool.vm_size, f"node_pools[{pool.name}].vm_size")
    _fits(job, spec, pool, vm)
    namespace = _team_fits(job, spec, pool, cluster or spec.cluster_name)
    whole_node = vmsizes.fill_one_node(vm)
    whole_node["cpu"] = job.worker_cpu or whole_node["cpu"]
    whole_node["memory"] = job.worker_memory or whole_node["memory"]
    labels = {teams.TEAM_KEY: job.team, gang.POD_GROUP_LABEL: job.name}
    if job.borrow:
        labels[teams.BORROW_LABEL] = "true"
    tolerations = teams.tolerations_for(job.team, job.borrow)
    launcher_spec: dict[str, Any] = {
        "containers": [
            _container(
                "launcher",
                job,
                launcher_command(job),
                {
                    "requests": {"cpu": job.launcher_cpu, "memory": job.launcher_memory},
                    "limits": {"memory": job.launcher_memory},
                },
            )
        ],
        "tolerations": tolerations,
    }
    if job.wait_for_workers_seconds:
        launcher_spec["containers"][0].setdefault("env", []).append(
            {"name": WAIT_SECONDS_ENV, "value": str(job.wait_for_workers_seconds)}
        )
    launcher_pool = _launcher_pool(spec)
    if launcher_pool:  # the launcher needs no GPU: keep it off the GPU nodes
        launcher_spec["nodeSelector"] = {POOL_LABEL: launcher_pool.name}
    worker_spec = {
        "containers": [
            _container(
                "worker",
                job,
                job.worker_command,
                {
                    "requests": dict(whole_node),
                    "limits": {"memory": whole_node["memory"], GPU_RESOURCE: str(vm.gpus)},
                },
            )
        ],
        "nodeSelector": {POOL_LABEL: pool.name},
        "tolerations": tolerations,
    }
    return {
        "apiVersion": gang.MPIJOB_API,
        "kind": "MPIJob",
        "metadata": {"name": job.name, "namespace": namespace, "labels": {teams.TEAM_KEY: job.team}},
        "spec": {
            "slotsPerWorker": job.gpus_per_worker or vm.gpus,
            "runLauncherAsWorker": False,
            "launcherCreationPolicy": "AtStartup",
            "mpiImplementation": job.mpi_implementation,
            "runPolicy": {
                "cleanPodPolicy": "Running",
                "backoffLimit": job.retries,
                "schedulingPolicy": {
                    "minAvailable": job.workers + 1,
                    "scheduleTimeoutSeconds": job.schedule_timeout_seconds,
                },
            },
            "mpiReplicaSpecs": {
                "Launcher": {
                    "replicas": 1,
                    "restartPolicy": "OnFailure",
                    "template": {"metadata": {"labels": dict(labels)}, "spec": launcher_spec},
                },
                "Worker": {
                    "replicas": job.workers,
                    # a worker's SSH server that dies comes back in its pod (same name and IP), so the
                    # launcher's next try reaches every worker; with Never it would stay down for good
                    "restartPolicy": "OnFailure",
                    "template": {"metadata": {"labels": dict(labels)}, "spec": worker_spec},
                },
            },
        },
    }


def pod_group_problems(mpijob: Mapping[str, Any]) -> list[str]:
    """What keeps an MPIJob from running as one gang: a replica template without the pod-group label
    naming the job, or a minAvailable short of launcher + workers."""
    name = (mpijob.get("metadata") or {}).get("name", "")
    spec = mpijob.get("spec") or {}
    replicas = spec.get("mpiReplicaSpecs") or {}
    out = []
    for role in sorted(replicas):
        template = (replicas[role] or {}).get("template") or {}
        label = ((template.get("metadata") or {}).get("labels") or {}).get(gang.POD_GROUP_LABEL)
        if label != name:
            out.append(
                f"{role} template: label {gang.POD_GROUP_LABEL} is {label!r}, not the job's name {name!r}"
            )
    members = sum(int((r or {}).get("replicas", 1)) for r in replicas.values())
    wanted = ((spec.get("runPolicy") or {}).get("schedulingPolicy") or {}).get("minAvailable")
    if wanted is not None and int(wanted) < members:
        out.append(
            f"runPolicy.schedulingPolicy.minAvailable {wanted} is below launcher + workers ({members})"
        )
    return out


def problems(mpijob: dict[str, Any], kubernetes_version: str) -> list[str]:
    """Schema problems of an MPIJob (its CRD's) and of each template (the official Pod schema)."""
    from superkube.cluster import render as objects

    out = [str(p) for p in objects.validate(mpijob, kubernetes_version, "job")]
    for role, replica in sorted(((mpijob.get("spec") or {}).get("mpiReplicaSpecs") or {}).items()):
        template = (replica or {}).get("template") or {}
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": f"{mpijob['metadata']['name']}-{role.lower()}",
                **(template.get("metadata") or {}),
            },
            "spec": template.get("spec") or {},
        }
        out += [f"{role} template: {p}" for p in objects.validate(pod, kubernetes_version, "job")]
    return out + pod_group_problems(mpijob)
