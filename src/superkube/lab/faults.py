"""Faults injected into one node of a running lab, for the health loop to find (`superkube lab fault`).

Each fault is real on the host, confined to it, and undone by `clear`:
- `scheduled-event`: Azure schedules a Reboot, Redeploy or Terminate for the host's VM; the lab's
  instance metadata (superkube.lab.imds) serves it in Azure's format, NotBefore `not_before_s` ahead,
  and records when the node's agent approves it.
- `disk-full`: a small tmpfs of the host's own (DISK_MIB, never the machine's disk) mounted where the
  health agent watches the root filesystem, filled past the fatal threshold.
- `api-unreachable`: the host's packets to the API servers' load balancer rejected (iptables, marked
  MARK), as a broken route or security rule would: the kubelet loses the API servers; the agent,
  which reaches them through the Service's endpoints, reports it.
- `gpu-fatal`: the GPU reading of the node shows Xid 79 (a GPU off the bus), as NVML would.
- `clear`: every fault above taken away. The node stays cordoned: health never uncordons (a person
  does, or remediation replaces the node).
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

from superkube.cluster.health import HEALTH_FS_DIR
from superkube.lab import agent_pods, imds
from superkube.lab.errors import LabError
from superkube.lab.machines import run_on
from superkube.lab.state import Lab

KINDS = ("scheduled-event", "disk-full", "api-unreachable", "gpu-fatal", "clear")
EVENT_TYPES = ("Reboot", "Redeploy", "Terminate")
MARK = "superkube-lab-fault"
DISK_MIB = 16
NOT_BEFORE_S = 300


def _vm_name(lab: Lab, host: str) -> str:
    docs = json.loads((Path(lab.state_dir) / "imds.json").read_text())
    if host not in docs:
        raise LabError(f"{host}: the lab's instance metadata has no document for it")
    return str(docs[host]["compute"]["name"])


def _api_address(lab: Lab) -> tuple[str, str]:
    url = str(lab.facts.get("apiserver_url", ""))
    hostport = url.removeprefix("https://").rstrip("/")
    host, _, port = hostport.rpartition(":")
    if not host or not port.isdigit():
        raise LabError(
            f"the lab's facts give no API servers' address ({url!r}); run `superkube lab up` again"
        )
    return host, port


def _node(lab: Lab, host: str) -> None:
    if not lab.host(host).is_node:
        raise LabError(f"{host} is not a node; `superkube lab status` lists the nodes (gpu-*, cpu-*)")


def inject(
    lab: Lab, host: str, kind: str, event_type: str = "Reboot", not_before_s: float = NOT_BEFORE_S
) -> str:
    """Put fault `kind` on node `host`; what was done, in a line."""
    if kind not in KINDS:
        raise LabError(f"fault {kind!r}: one of {', '.join(KINDS)}")
    _node(lab, host)
    if kind == "scheduled-event":
        if event_type not in EVENT_TYPES:
            raise LabError(f"--type {event_type!r}: one of {', '.join(EVENT_TYPES)}")
        vm = _vm_name(lab, host)
        event = imds.add_event(Path(lab.state_dir) / imds.EVENTS, vm, vm, event_type, not_before_s)
        return f"{host}: {event_type} scheduled for VM {vm}, not before {event['NotBefore']} (event {event['EventId']})"
    if kind == "disk-full":
        where = shlex.quote(HEALTH_FS_DIR)
        fill = (DISK_MIB * 1024) * 99 // 100
        run_on(lab, host, (
            f"mkdir -p {where} && (mountpoint -q {where} || "
            f"mount -t tmpfs -o size={DISK_MIB}m,mode=0755 {MARK} {where}) && "
            f"dd if=/dev/zero of={where}/{MARK} bs=1k count={fill} status=none"
        ))  # fmt: skip
        return f"{host}: {HEALTH_FS_DIR} is a {DISK_MIB} MiB filesystem of its own, 99% full"
    if kind == "api-unreachable":
        address, port = _api_address(lab)
        run_on(lab, host, (
            f"iptables -w -I OUTPUT -d {address} -p tcp --dport {port} -m comment --comment {MARK} "
            "-j REJECT --reject-with tcp-reset"
        ))  # fmt: skip
        return f"{host}: packets to the API servers at {address}:{port} rejected"
    if kind == "gpu-fatal":
        _gpu_reading(lab, host, "xid-79")
        return f"{host}: its GPUs read Xid 79 on GPU 0"
    return clear(lab, host)


def _gpu_reading(lab: Lab, host: str, fault: str) -> None:
    from superkube.model.vmsizes import size

    vm = size(lab.pools[lab.host(host).pool]["vm_size"], host)
    if not vm.gpus:
        raise LabError(f"{host} has no GPUs (its pool's size is {vm.name})")
    text = agent_pods.reading_text(host, vm.name, vm.gpus, fault)
    target = agent_pods.READING
    run_on(lab, host, f"printf %s {shlex.quote(text)} > {target}.new && mv {target}.new {target}")


def clear(lab: Lab, host: str) -> str:
    """Take every fault off `host`."""
    _node(lab, host)
    vm = _vm_name(lab, host)
    events = imds.clear_events(Path(lab.state_dir) / imds.EVENTS, vm)
    where = shlex.quote(HEALTH_FS_DIR)
    run_on(lab, host, (
        f"if [ \"$(findmnt -n -o SOURCE {where})\" = {MARK} ]; then umount {where}; fi; "
        f"iptables -w -S OUTPUT | grep -- '--comment {MARK}' | sed 's/^-A /-D /' | "
        "while read -r rule; do eval iptables -w $rule; done"
    ))  # fmt: skip
    from superkube.model.vmsizes import size

    if size(lab.pools[lab.host(host).pool]["vm_size"], host).gpus:
        _gpu_reading(lab, host, "healthy")
    return f"{host}: faults cleared ({events} scheduled event(s) gone); uncordon it when it reads healthy"
