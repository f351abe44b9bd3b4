"""Gang scheduling run for real beside a loopback API server: the gang scheduler, the
scheduler-plugins controller and the MPI Operator, each from its Go module at the pinned version, with
the configuration, flags and identities production gives them.

- The scheduler is scheduler-plugins' kube-scheduler with the gang_scheduler role's own
  KubeSchedulerConfiguration and flags, rendered over the plan's first API-server host, as
  `system:kube-scheduler` (a client certificate from the cluster CA, as kube_pki issues it).
- The controller and the operator run as host processes with the args of the in-cluster layer's
  Deployments (`objects`: the gang component's manifests), each as its own service account with the
  layer's RBAC. Only what a pod gets from its kubelet is added: a kubeconfig with its token (a pod
  reads the same from its mounted service-account volume), and where to listen.
- The MPI Operator listens for health checks on port 8080 of every address, a port its flags cannot
  move. It runs in a network namespace of its own, where a relay on that namespace's loopback carries
  its connections to the API server's loopback port. Nothing else it opens is reachable from outside.
- The controller-manager runs the Job controller (the operator's launcher is a batch Job), the
  garbage collector (a deleted MPIJob's pods go with it) and the node lifecycle controller (it lifts
  the not-ready taint the API server puts on every new Node once the node reports Ready).

kwok (`superkube.harness.kwok`) plays every node's kubelet.
"""

from __future__ import annotations

import contextlib
import ctypes
import itertools
import json
import os
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml

from superkube.cluster import cloudinit
from superkube.cluster.gang import CONTROLLER_NAME, MPI_OPERATOR_NAME, POD_GROUP_LABEL
from superkube.harness import apiserver, build, kwok
from superkube.harness.errors import HarnessError
from superkube.model.teams import TEAM_KEY, TeamTuple

BUILT = ("scheduler-plugins", "scheduler-plugins-controller", "mpi-operator")
CONTROLLER, OPERATOR = CONTROLLER_NAME, MPI_OPERATOR_NAME
CONTROLLER_MANAGER = ("job", "garbagecollector", "nodelifecycle")
WORKLOAD_CONTROLLERS = ("deployment", "replicaset", "disruption")
"""What a Deployment's pods and a PodDisruptionBudget's status need besides: not run unless asked."""
TOKEN_LIFETIME = "24h"
_CLONE_NEWNET = 0x40000000
_netns_names = itertools.count()


def _setns(path: str) -> None:
    """Move the calling thread (only it) into the network namespace at `path`."""
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    fd = os.open(path, os.O_RDONLY)
    try:
        if libc.setns(fd, _CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns {path}: {os.strerror(err)}")
    finally:
        os.close(fd)


class Relay:
    """Listens on 127.0.0.1:`port` inside network namespace `netns` and carries each connection to
    127.0.0.1:`port` of this process's own namespace: a process in `netns` reaches the API server at
    the address its certificate names, and nothing in `netns` is reachable from the host."""

    def __init__(self, netns: str, port: int) -> None:
        self.port = port
        made: list[socket.socket | BaseException] = []

        def listen() -> None:  # a thread of its own: setns moves only the thread that calls it
            try:
                _setns(f"/run/netns/{netns}")
                s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                s.bind(("127.0.0.1", port))
                s.listen(128)
                made.append(s)
            except BaseException as exc:  # handed to the caller's thread
                made.append(exc)

        t = threading.Thread(target=listen)
        t.start()
        t.join()
        if isinstance(made[0], BaseException):
            raise HarnessError(f"relay into {netns}: {made[0]}")
        self._socket = made[0]
        self._stopped = False
        self._open: list[socket.socket] = []
        self._threads = [threading.Thread(target=self._serve, daemon=True, name=f"relay-{netns}")]
        self._threads[0].start()

    def _serve(self) -> None:
        while not self._stopped:
            try:
                inner, _ = self._socket.accept()
            except OSError:
                return
            try:
                outer = socket.create_connection(("127.0.0.1", self.port), timeout=5)
                outer.settimeout(None)
            except OSError:
                inner.close()
                continue
            self._open += [inner, outer]
            for a, b in ((inner, outer), (outer, inner)):
                t = threading.Thread(target=self._pump, args=(a, b), daemon=True)
                self._threads.append(t)
                t.start()

    @staticmethod
    def _pump(source: socket.socket, sink: socket.socket) -> None:
        try:
            while chunk := source.recv(65536):
                sink.sendall(chunk)
        except OSError:
            pass
        finally:
            for s, how in ((sink, socket.SHUT_WR), (source, socket.SHUT_RD)):
                with contextlib.suppress(OSError):
                    s.shutdown(how)

    def stop(self) -> None:
        """Stop listening, close every carried connection, and wait for each thread to end."""
        self._stopped = True
        for s in (self._socket, *self._open):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)  # wakes a thread blocked in accept or recv
            s.close()
        for t in self._threads:
            t.join(5)


@dataclass
class Gang:
    api: apiserver.LocalApi
    dir: Path
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    netns: str = ""
    relay: Relay | None = None
    scheduler_argv: list[str] = field(default_factory=list)
    scheduler_config_path: Path = Path()
    scheduler_kubeconfig: Path = Path()

    def start_scheduler(self, config: str) -> None:
        """(Re)start the scheduler with KubeSchedulerConfiguration `config` and the role's flags."""
        old = self.processes.pop("kube-scheduler", None)
        if old is not None:
            old.terminate()
            old.wait(30)
        self.scheduler_config_path.write_text(_local(config, self.scheduler_kubeconfig, self.dir))
        _spawn(self, "kube-scheduler", self.scheduler_argv)

    def dead(self) -> dict[str, str]:
        """Each process that has exited: its exit status and its log's last lines."""
        out = {}
        for name, p in self.processes.items():
            if p.poll() is not None:
                tail = (self.dir / f"{name}.log").read_text(errors="replace").strip().splitlines()[-3:]
                out[name] = f"exited with {p.returncode}: {' | '.join(tail)}"
        return out

    def log(self, name: str) -> str:
        return (self.dir / f"{name}.log").read_text(errors="replace")

    def stop(self) -> None:
        for p in self.processes.values():
            if p.poll() is None:
                p.terminate()
        for p in self.processes.values():
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        if self.relay:
            self.relay.stop()
        if self.netns:
            subprocess.run(["ip", "netns", "delete", self.netns], check=False, capture_output=True)


_KUBECONFIG, _CONFIG_DIR = "/lab/kube-scheduler.kubeconfig", "/lab/config"
"""placeholders for this machine's paths, which exist only once the scheduler starts"""


def scheduler(engine: Any, **role_vars: Any) -> tuple[str, dict[str, str]]:
    """The gang_scheduler role's KubeSchedulerConfiguration and flags as a converge writes them on the
    plan's first API-server host (`engine`: a `superkube.cluster.wiring.Wiring`); `start` puts this
    machine's paths in for the kubeconfig and the configuration's folder. `role_vars`: the role's
    variables set otherwise, as an inventory would."""
    host = next(h for h in engine.hosts if h.group == "apiservers")
    paths = {"gang_scheduler_kubeconfig": _KUBECONFIG, "gang_scheduler_config_dir": _CONFIG_DIR, **role_vars}
    text = engine.template("gang_scheduler", host, "scheduler-config.yaml.j2", **paths)
    flags = engine.render("gang_scheduler", host, ["gang_scheduler_flags"], **paths)["gang_scheduler_flags"]
    return text, {k: str(v) for k, v in flags.items()}


def prerequisites(engine: Any) -> list[dict[str, Any]]:
    """What converge applies before the gang scheduler starts, as the kube_apiserver role writes it on
    the plan's first API-server host: the CRDs its Coscheduling plugin waits for (the role copies them
    from data/crds) and the scheduler's access to them (its bootstrap objects)."""
    from superkube.cluster import gang
    from superkube.harness import joins

    host = next(h for h in engine.hosts if h.group == "apiservers")
    names = engine.render("kube_apiserver", host, ["kube_apiserver_scheduler_crds"])[
        "kube_apiserver_scheduler_crds"
    ]
    bootstrap = joins.role_objects(engine)
    # the scheduler's access: the bindings of its identity and the roles they grant
    bindings = [
        o
        for o in bootstrap
        if o["kind"] == "ClusterRoleBinding"
        and any(s["name"] == "system:kube-scheduler" for s in o.get("subjects") or [])
    ]
    granted = {b["roleRef"]["name"] for b in bindings}
    roles = [o for o in bootstrap if o["kind"] == "ClusterRole" and o["metadata"]["name"] in granted]
    return [*(gang.crd(name) for name in names), *roles, *bindings]


def default_profile(config: str) -> str:
    """`config` (the role's) with its profile on the scheduler's default plugins: no Coscheduling,
    each pod placed on its own, for comparison on the same nodes."""
    doc = yaml.safe_load(config)
    doc["profiles"] = [{"schedulerName": p["schedulerName"]} for p in doc["profiles"]]
    return str(yaml.safe_dump(doc, sort_keys=False))


def _local(text: str, kubeconfig: Path, config_dir: Path) -> str:
    return text.replace(_KUBECONFIG, str(kubeconfig)).replace(_CONFIG_DIR, str(config_dir))


def _container(objects: Sequence[Mapping[str, Any]], deployment: str) -> dict[str, Any]:
    for o in objects:
        if o.get("kind") == "Deployment" and o["metadata"]["name"] == deployment:
            (container,) = o["spec"]["template"]["spec"]["containers"]
            return dict(container)
    raise HarnessError(f"the gang component has no Deployment {deployment}: is the MPI Operator turned off?")


def _token(api: apiserver.LocalApi, namespace: str, account: str) -> str:
    return apiserver.kubectl(
        api, "create", "token", account, "-n", namespace, f"--duration={TOKEN_LIFETIME}"
    ).strip()


def _spawn(gang: Gang, name: str, argv: list[str], env: Mapping[str, str] | None = None) -> None:
    with (gang.dir / f"{name}.log").open("ab") as log:
        gang.processes[name] = subprocess.Popen(
            argv,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=apiserver.die_with_parent,
            env={**os.environ, **(env or {})},
        )


def start(
    api: apiserver.LocalApi,
    workdir: Path,
    objects: Sequence[Mapping[str, Any]],
    scheduler_config: str,
    scheduler_flags: Mapping[str, str],
    progress: Callable[[str], None] = lambda line: None,
) -> Gang:
    """Build what the cache lacks, apply the gang component's objects but its Deployments, and start
    the scheduler, the controller, the operator and the controller-manager (`CONTROLLER_MANAGER`)."""
    wanted = [c for c in build.components() if c.name in BUILT]
    try:
        built = {
            b.component.name: b for b in build.build_all(wanted, lambda c, what: progress(f"{c}: {what}"))
        }
    except build.BuildError as exc:
        raise HarnessError(str(exc)) from None
    workdir.mkdir(parents=True, exist_ok=True)
    gang = Gang(api, workdir)
    try:
        _start(gang, built, objects, scheduler_config, scheduler_flags)
    except BaseException:
        gang.stop()
        raise
    return gang


def _start(
    gang: Gang,
    built: Mapping[str, build.Built],
    objects: Sequence[Mapping[str, Any]],
    scheduler_config: str,
    scheduler_flags: Mapping[str, str],
) -> None:
    api = gang.api
    controller, operator = _container(objects, CONTROLLER), _container(objects, OPERATOR)
    namespace = next(o["metadata"]["namespace"] for o in objects if o.get("kind") == "Deployment")
    if namespace not in apiserver.kubectl(api, "get", "namespaces", "-o", "name"):
        apiserver.kubectl(api, "create", "namespace", namespace)
    applied = [o for o in objects if o.get("kind") != "Deployment"]
    apiserver.kubectl(api, "apply", "--server-side", "--field-manager=superkube", "-f", "-",
                      stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": applied}))  # fmt: skip
    crds = [o["metadata"]["name"] for o in objects if o.get("kind") == "CustomResourceDefinition"]
    apiserver.kubectl(api, "wait", "--for=condition=Established", "--timeout=60s",
                      *(f"crd/{c}" for c in crds))  # fmt: skip
    _start_scheduling(gang, built["scheduler-plugins"], scheduler_config, scheduler_flags)

    # the controller: the layer's args, with its token, listening on loopback only
    config = api.token_kubeconfig(CONTROLLER, _token(api, namespace, CONTROLLER))
    _spawn(gang, CONTROLLER, [str(built["scheduler-plugins-controller"].binary("controller")), *controller["args"],
                              f"--metricsAddr=127.0.0.1:{apiserver.free_port()}",
                              f"--probeAddr=127.0.0.1:{apiserver.free_port()}"],
           env={"KUBECONFIG": str(config)})  # fmt: skip

    # the operator, in a network namespace of its own (see the module doc)
    gang.netns = f"superkube-gang-{os.getpid()}-{next(_netns_names)}"
    subprocess.run(["ip", "netns", "add", gang.netns], check=True, capture_output=True)
    subprocess.run(["ip", "-n", gang.netns, "link", "set", "lo", "up"], check=True, capture_output=True)
    gang.relay = Relay(gang.netns, int(api.url.rsplit(":", 1)[1]))
    config = api.token_kubeconfig(OPERATOR, _token(api, namespace, OPERATOR))
    _spawn(gang, OPERATOR, ["ip", "netns", "exec", gang.netns, str(built["mpi-operator"].binary("mpi-operator")),
                            *operator["args"], f"--kubeConfig={config}"])  # fmt: skip


def _start_scheduling(
    gang: Gang,
    built: build.Built,
    config: str,
    flags: Mapping[str, str],
    controllers: Sequence[str] = CONTROLLER_MANAGER,
) -> None:
    """The controller-manager (running `controllers`), and the scheduler with the role's configuration
    as system:kube-scheduler."""
    api, d = gang.api, gang.dir
    api.start_controller_manager(controllers)
    gang.scheduler_kubeconfig = api.client_kubeconfig("kube-scheduler", "system:kube-scheduler")
    local = {k: _local(v, gang.scheduler_kubeconfig, d) for k, v in flags.items()}
    local["secure-port"] = str(apiserver.free_port())  # not the default: several labs on one machine
    gang.scheduler_argv = [str(built.binary("kube-scheduler")), *(f"--{k}={v}" for k, v in local.items())]
    gang.scheduler_config_path = Path(local["config"])
    gang.start_scheduler(config)


@contextlib.contextmanager
def scheduling(
    api: apiserver.LocalApi,
    workdir: Path,
    scheduler_config: str,
    scheduler_flags: Mapping[str, str],
    progress: Callable[[str], None] = lambda line: None,
    controllers: Sequence[str] = CONTROLLER_MANAGER,
) -> Iterator[Gang]:
    """Only the scheduler and the controller-manager of `running`: for what needs pods placed (and
    nodes' not-ready taints lifted) but no gang controller or MPI Operator. `controllers`: the
    controller-manager's (`CONTROLLER_MANAGER` unless given), e.g. with `WORKLOAD_CONTROLLERS` for
    Deployments and PodDisruptionBudgets."""
    wanted = [c for c in build.components() if c.name == "scheduler-plugins"]
    try:
        (built,) = build.build_all(wanted, lambda c, what: progress(f"{c}: {what}"))
    except build.BuildError as exc:
        raise HarnessError(str(exc)) from None
    workdir.mkdir(parents=True, exist_ok=True)
    gang = Gang(api, workdir)
    try:
        _start_scheduling(gang, built, scheduler_config, scheduler_flags, controllers)
        yield gang
    finally:
        gang.stop()


@contextlib.contextmanager
def running(
    api: apiserver.LocalApi,
    workdir: Path,
    objects: Sequence[Mapping[str, Any]],
    scheduler_config: str,
    scheduler_flags: Mapping[str, str],
    progress: Callable[[str], None] = lambda line: None,
) -> Iterator[Gang]:
    gang = start(api, workdir, objects, scheduler_config, scheduler_flags, progress)
    try:
        yield gang
    finally:
        gang.stop()


def leader(api: apiserver.LocalApi, namespace: str, lease: str) -> str:
    """The holder of a leader-election Lease ("" while none holds it)."""
    out = apiserver.kubectl(api, "get", "lease", lease, "-n", namespace, "-o", "json", check=False)
    return str((yaml.safe_load(out or "{}") or {}).get("spec", {}).get("holderIdentity") or "")


# --- the flagship's nodes as kwok plays them, and what the scheduler did -------------------------------

GPU_CAPACITY = {"cpu": "96", "memory": "1900Gi", "nvidia.com/gpu": "8", "pods": "110"}
CPU_CAPACITY = {"cpu": "32", "memory": "128Gi", "pods": "110"}


def gpu_node(
    name: str, team: str, teams: Sequence[TeamTuple], cluster: str = "flagship"
) -> tuple[dict[str, Any], dict[str, Any]]:
    """A GPU node as it stands once joined: the plan's labels, past preflight, the labels of `team`'s
    tuple among the plan's `teams` (its rack group), and the taint the team reconciler keeps for it
    (`team` "any": capacity anyone may borrow)."""
    labels = cloudinit.node_labels(cluster, "gpu", "gpu", {})
    labels.pop(cloudinit.PREFLIGHT_TAINT_KEY, None)
    labels.update({"kubernetes.io/hostname": name, "nvidia.com/gpu.count": GPU_CAPACITY["nvidia.com/gpu"]})
    selectors = [t.selector for t in teams if t.team == team]
    if not selectors:
        raise HarnessError(
            f"no team {team!r} among the plan's teams: {', '.join(sorted({t.team for t in teams}))}"
        )
    labels.update(selectors[0])
    return kwok.node(name, labels, GPU_CAPACITY, [{"key": TEAM_KEY, "value": team, "effect": "NoSchedule"}])


def cpu_node(name: str, cluster: str = "flagship") -> tuple[dict[str, Any], dict[str, Any]]:
    labels = cloudinit.node_labels(cluster, "cpu", "cpu", {})
    labels.pop(cloudinit.PREFLIGHT_TAINT_KEY, None)
    labels["kubernetes.io/hostname"] = name
    return kwok.node(name, labels, CPU_CAPACITY)


def wait_for(what: str, check: Callable[[], Any], timeout: float, every: float = 0.5) -> Any:
    """`check()`'s first truthy value, polled every `every` s; HarnessError after `timeout` s."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(every)
    raise HarnessError(f"timed out after {timeout:.0f} s waiting for {what}")


def register(api: apiserver.LocalApi, nodes: Sequence[tuple[dict[str, Any], dict[str, Any]]]) -> None:
    """Create the Nodes and report their status, as their kubelets do at registration."""
    items = [body for body, _ in nodes]
    apiserver.kubectl(
        api, "create", "-f", "-", stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": items})
    )
    for body, status in nodes:
        apiserver.kubectl(api, "patch", "node", body["metadata"]["name"], "--subresource=status",
                          "--type=merge", "-p", json.dumps(status))  # fmt: skip


def job_pods(
    api: apiserver.LocalApi, namespace: str, job: str, terminating: bool = False
) -> list[dict[str, Any]]:
    """The job's pods (those of its pod group); those being deleted, which still hold their nodes,
    only with `terminating`."""
    out = apiserver.kubectl(
        api, "get", "pods", "-n", namespace, "-l", f"{POD_GROUP_LABEL}={job}", "-o", "json"
    )
    items: list[dict[str, Any]] = json.loads(out)["items"]
    return [p for p in items if terminating or not p["metadata"].get("deletionTimestamp")]


def bound(api: apiserver.LocalApi, namespace: str, job: str) -> dict[str, str]:
    """pod -> node, for the job's pods the scheduler has bound."""
    pods = job_pods(api, namespace, job)
    return {p["metadata"]["name"]: p["spec"]["nodeName"] for p in pods if p["spec"].get("nodeName")}


def scheduled_times(api: apiserver.LocalApi, namespace: str, job: str) -> list[datetime]:
    """When the scheduler bound each of the job's pods, from its Scheduled events (microseconds)."""
    out = apiserver.kubectl(api, "get", "events.events.k8s.io", "-n", namespace, "-o", "json")
    return sorted(
        datetime.fromisoformat(e["eventTime"].replace("Z", "+00:00"))
        for e in json.loads(out)["items"]
        if e.get("reason") == "Scheduled" and e["regarding"]["name"].startswith(f"{job}-")
    )
