"""kwok beside the lab: simulated Nodes, and the pods bound to them, on the lab's real API server.

kwok (built from its Go module at `build.KWOK_VERSION`) plays a kubelet for every Node carrying the
`kwok.x-k8s.io/node: fake` annotation: it marks the Node Ready, renews its Lease in
kube-node-lease as a kubelet does (every quarter of the lease's duration), reports status on a
kubelet's schedule, runs the pods the scheduler binds there (Running, Ready, an IP) and finishes a
deleted pod as a kubelet would. Nothing else is faked: the Nodes, pods, Leases and Events are the API
server's own, so what an agent reads and writes at 7,500 nodes is what it would on the flagship.

The stages below are this project's: what a kubelet on the flagship reports (node status every
5 minutes, as the kubelet's nodeStatusReportFrequency; the Lease renewed every 10 s of a 40 s lease).
"""

from __future__ import annotations

import contextlib
import subprocess
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from superkube.harness import apiserver, build
from superkube.harness.apiserver import die_with_parent
from superkube.harness.errors import HarnessError

ANNOTATION = "kwok.x-k8s.io/node"
"""the annotation that hands a Node to kwok (value `fake`)"""
LEASE_DURATION_S = 40  # a kubelet's nodeLeaseDurationSeconds; kwok renews every quarter of it, as it does
STATUS_REPORT_MS = 300_000  # a kubelet's nodeStatusReportFrequency (5 min) when nothing changes

_CONDITIONS = (
    ("MemoryPressure", "False", "KubeletHasSufficientMemory", "kubelet has sufficient memory available"),
    ("DiskPressure", "False", "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
    ("PIDPressure", "False", "KubeletHasSufficientPID", "kubelet has sufficient PID available"),
    ("Ready", "True", "KubeletReady", "kubelet is posting ready status"),
)


def _conditions(transition: str) -> str:
    """The conditions block of a status template: every condition heartbeated now."""
    return "".join(
        f"- type: {kind}\n  status: {status!r}\n  reason: {reason}\n  message: {message}\n"
        f"  lastHeartbeatTime: {{{{ $now | Quote }}}}\n  lastTransitionTime: {transition}\n"
        for kind, status, reason, message in _CONDITIONS
    )


def _stage(
    name: str,
    kind: str,
    selector: Sequence[Mapping[str, Any]],
    next_: Mapping[str, Any],
    delay_ms: int = 0,
    jitter_ms: int = 0,
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "resourceRef": {"apiGroup": "v1", "kind": kind},
        "selector": {"matchExpressions": list(selector)},
        "next": dict(next_),
    }
    if delay_ms:
        spec["delay"] = {"durationMilliseconds": delay_ms, "jitterDurationMilliseconds": delay_ms + jitter_ms}
    return {"apiVersion": "kwok.x-k8s.io/v1alpha1", "kind": "Stage", "metadata": {"name": name}, "spec": spec}


READY = '.status.conditions.[] | select( .type == "Ready" ) | .status'
COMPLETE_ANNOTATION = "superkube.io/lab-complete"
"""set to "true" on a running pod and kwok finishes it as its containers exiting 0 would (lab-only:
how a test ends a simulated job's launcher, since nothing runs in a kwok pod)"""


def stages() -> list[dict[str, Any]]:
    """A kubelet's life as kwok Stages: join (Ready), report on schedule, run bound pods, complete a pod
    a test marks done, finish deleted ones."""
    now = "{{ $now := Now }}\n"
    return [
        _stage(
            "superkube-node-ready",
            "Node",
            [{"key": READY, "operator": "NotIn", "values": ["True"]}],
            {"statusTemplate": now + "phase: Running\nconditions:\n" + _conditions("{{ $now | Quote }}")},
        ),
        _stage(
            "superkube-node-status-report",
            "Node",
            [
                {"key": ".status.phase", "operator": "In", "values": ["Running"]},
                {"key": READY, "operator": "In", "values": ["True"]},
            ],
            {
                "statusTemplate": now
                + "conditions:\n"
                + _conditions("{{ or .metadata.creationTimestamp $now | Quote }}")
            },
            delay_ms=STATUS_REPORT_MS,
            jitter_ms=STATUS_REPORT_MS // 10,
        ),
        _stage(
            "superkube-pod-running",
            "Pod",
            [
                {"key": ".metadata.deletionTimestamp", "operator": "DoesNotExist"},
                {"key": ".status.phase", "operator": "In", "values": ["Pending"]},
                {"key": ".spec.nodeName", "operator": "Exists"},
            ],
            {
                "statusTemplate": now
                + "phase: Running\nstartTime: {{ $now | Quote }}\nconditions:\n"
                + "".join(
                    f"- type: {kind}\n  status: 'True'\n  lastTransitionTime: {{{{ $now | Quote }}}}\n"
                    for kind in ("PodScheduled", "Initialized", "ContainersReady", "Ready")
                )
                + "containerStatuses:\n{{ range .spec.containers }}\n- name: {{ .name | Quote }}\n"
                "  image: {{ .image | Quote }}\n  ready: true\n  started: true\n  restartCount: 0\n"
                "  state: {running: {startedAt: {{ $now | Quote }}}}\n{{ end }}\n"
                "{{ with NodeIPWith .spec.nodeName }}hostIP: {{ . | Quote }}\n{{ end }}"
                '{{ with PodIPWith .spec.nodeName ( or .spec.hostNetwork false ) ( or .metadata.uid "" ) '
                '( or .metadata.name "" ) ( or .metadata.namespace "" ) }}podIP: {{ . | Quote }}\n{{ end }}'
            },
        ),
        _stage(
            "superkube-pod-complete",
            "Pod",
            [
                {"key": ".metadata.deletionTimestamp", "operator": "DoesNotExist"},
                {"key": ".status.phase", "operator": "In", "values": ["Running"]},
                {
                    "key": f'.metadata.annotations["{COMPLETE_ANNOTATION}"]',
                    "operator": "In",
                    "values": ["true"],
                },
            ],
            {
                "statusTemplate": now
                + "phase: Succeeded\nconditions:\n"
                + "".join(
                    f"- type: {kind}\n  status: 'False'\n  reason: PodCompleted\n"
                    f"  lastTransitionTime: {{{{ $now | Quote }}}}\n"
                    for kind in ("Ready", "ContainersReady")
                )
                + "containerStatuses:\n{{ range .spec.containers }}\n- name: {{ .name | Quote }}\n"
                "  image: {{ .image | Quote }}\n  ready: false\n  started: false\n  restartCount: 0\n"
                "  state: {terminated: {exitCode: 0, reason: Completed, finishedAt: {{ $now | Quote }}}}\n"
                "{{ end }}\n"
            },
        ),
        # an evicted or deleted pod: its containers stop and the kubelet removes it
        _stage(
            "superkube-pod-gone",
            "Pod",
            [{"key": ".metadata.deletionTimestamp", "operator": "Exists"}],
            {"delete": True},
        ),
    ]


def node(
    name: str,
    labels: Mapping[str, str],
    capacity: Mapping[str, str],
    taints: Sequence[Mapping[str, str]] = (),
    address: str = "",
) -> tuple[dict[str, Any], dict[str, Any]]:
    """A Node as its kubelet registers it (handed to kwok), and the status it reports at registration."""
    body = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": dict(labels), "annotations": {ANNOTATION: "fake"}},
        "spec": {"taints": [dict(t) for t in taints]} if taints else {},
    }
    status: dict[str, Any] = {"capacity": dict(capacity), "allocatable": dict(capacity)}
    if address:
        status["addresses"] = [
            {"type": "InternalIP", "address": address},
            {"type": "Hostname", "address": name},
        ]
    return body, {"status": status}


@dataclass
class Kwok:
    process: subprocess.Popen[bytes]
    log: Path

    def alive(self) -> bool:
        return self.process.poll() is None

    def stop(self) -> None:
        apiserver.terminate(self.process, 15)


def start(
    kubeconfig: Path,
    workdir: Path,
    progress: Callable[[str], None] = lambda line: None,
    lease_duration_s: int = LEASE_DURATION_S,
    cidr: str = "10.64.0.0/10",
) -> Kwok:
    """Build kwok if the cache lacks it, and start it against the API server `kubeconfig` names."""
    import yaml

    wanted = [c for c in build.components() if c.name == "kwok"]
    try:
        (built,) = build.build_all(wanted, lambda label, what: progress(f"{label}: {what}"))
    except build.BuildError as exc:
        raise HarnessError(f"kwok: {exc}") from None
    workdir.mkdir(parents=True, exist_ok=True)
    config = workdir / "kwok.yaml"
    config.write_text(yaml.safe_dump_all(stages(), sort_keys=False))
    log = workdir / "kwok.log"
    argv = [
        str(built.binary("kwok")),
        f"--kubeconfig={kubeconfig}",
        f"--config={config}",
        f"--manage-nodes-with-annotation-selector={ANNOTATION}=fake",
        f"--node-lease-duration-seconds={lease_duration_s}",
        f"--cidr={cidr}",
        "--node-ip=10.0.0.1",
    ]
    with log.open("ab") as out:
        # it dies with whoever started it: a killed benchmark must not leave it retrying a gone server
        process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                                   preexec_fn=die_with_parent)  # fmt: skip
    kwok = Kwok(process, log)
    time.sleep(0.5)
    if not kwok.alive():
        tail = log.read_text(errors="replace").strip().splitlines()[-3:]
        raise HarnessError(f"kwok exited at start: {' | '.join(tail) or 'no output'} (log: {log})")
    return kwok


@contextlib.contextmanager
def running(
    kubeconfig: Path, workdir: Path, progress: Callable[[str], None] = lambda line: None, **kwargs: Any
) -> Iterator[Kwok]:
    kwok = start(kubeconfig, workdir, progress, **kwargs)
    try:
        yield kwok
    finally:
        kwok.stop()
