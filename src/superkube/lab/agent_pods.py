"""The in-cluster agents as pods on the lab's nodes, and the few things the lab gives them in place of
what only a GPU VM has. `superkube lab apply` applies the layer's objects with `lab_only` applied;
everything it changes is listed here, and nowhere else:

- GPU readings. A lab GPU node has no GPUs, so it carries the reading NVML would give as a file on the
  host, READING (`lab up` writes a healthy one for its pool's VM size, `write_reading` replaces it to
  fault a node). The health and preflight DaemonSets read it (`--reading`) through a hostPath mount,
  exactly as they read a saved reading in an incident.
- Preflight's active check. Preflight runs the CUDA image (Dockerfile.gputests) and burns every GPU
  for `gpu_burn_seconds`. The lab has neither, so its preflight is the agents' image with
  `--burn-seconds=0` and the agents' resources (the burn asks for 2 CPUs and 16 GiB): the probe, the
  verdict and the patch that lifts the taint are the production code; the burn is not run.
- Rounds every ROUND_S seconds instead of the layer's minute, so that a test waits seconds.
- The health controller's breaker at BREAKER_SHARE: the lab's GPU pool has two nodes and its tests
  fault the second before the first is back; production's 5 % lets only one node of such a pool go.
- The periodic GPU test's CronJob is left out: its image and its GPUs do not exist here.
- NVIDIA's device plugin (the gpu-devices DaemonSet) is the lab's own (images/lab-device-plugin):
  it registers the GPUs of the node's READING with the kubelet's device plugin API, as NVIDIA's
  registers the GPUs NVML finds, so a GPU node advertises its pool's `nvidia.com/gpu` count (one
  fewer when the reading says a GPU is gone, a GPU with an Xid error Unhealthy), and jobs that ask
  for whole nodes' GPUs are placed as on Azure. It reads READING through the same hostPath mount.
- The GPU reset's DaemonSet is applied as it is and never runs: its pods go only to nodes the health
  controller labels for a reset, and no lab fault is one a reset clears (a GPU gone, Xid 79); the
  reset is tested against a stand-in NVML instead (tests/agents/test_gpu_reset.py).
- The serving-certificate approver at one replica: its pods can go only to the lab's one CPU node
  (the GPU nodes carry the preflight and team taints), where a second would hold a pod IP and
  CPU for nothing; production runs two, a decision the other made first skipped as a conflict.
- Balloons at no replicas. Each asks for a whole node of its pool (GPUs included), which no lab node
  has; at the plan's count (the pool's maximum) they would be thousands of Pending pods.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from superkube.agents import AGENTS_IMAGE, gpu_probe
from superkube.cluster import autoscaling, health, kube
from superkube.lab.errors import LabError

READING_DIR = "/var/lib/superkube-lab"  # on each lab GPU host
READING = f"{READING_DIR}/gpu-reading.json"
MOUNT = "/run/superkube-lab"  # where the agents see READING_DIR
ROUND_S = 5
BREAKER_SHARE = 1.0
LAB_GPU = "NVIDIA H100 80GB HBM3 (lab reading)"
FAULTS = ("healthy", "gpu-missing", "xid-79")


def reading(node: str, vm_size: str, gpus: int, fault: str = "healthy") -> dict[str, Any]:
    """The reading of a lab GPU node: `gpus` healthy GPUs, or with one fault of FAULTS (a GPU gone
    from the bus: one fewer than the VM size has; Xid 79 on GPU 0)."""
    if fault not in FAULTS:
        raise ValueError(f"fault {fault!r}: one of {', '.join(FAULTS)}")
    count = gpus - 1 if fault == "gpu-missing" else gpus
    doc = {
        "node": node,
        "vm_size": vm_size,
        "expected_gpus": gpus,
        "gpus": [
            {
                "index": i,
                "uuid": f"GPU-lab-{node}-{i}",
                "name": LAB_GPU,
                "xid_errors": [79] if fault == "xid-79" and i == 0 else [],
            }
            for i in range(count)
        ],
    }
    gpu_probe.parse_reading(doc, f"lab reading of {node}")  # what the agents will accept
    return doc


def reading_text(node: str, vm_size: str, gpus: int, fault: str = "healthy") -> str:
    return json.dumps(reading(node, vm_size, gpus, fault), indent=2) + "\n"


def write_reading(root: Path, node: str, vm_size: str, gpus: int, fault: str = "healthy") -> None:
    """Put the node's reading under the host root `root`, replaced whole (the agent never reads half)."""
    target = root / READING.lstrip("/")
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_suffix(".new")
    partial.write_text(reading_text(node, vm_size, gpus, fault))
    partial.chmod(0o644)
    partial.replace(target)


def _flags(command: list[str], replace: dict[str, str]) -> list[str]:
    """`command` with each `--name=value` flag named in `replace` set to its value (added if absent)."""
    out = [c for c in command if c.split("=", 1)[0].removeprefix("--") not in replace]
    return out + [f"--{name}={value}" for name, value in replace.items()]


def left_out(obj: dict[str, Any]) -> bool:
    """An object the lab cannot run: the periodic GPU test (its CUDA image, its GPUs)."""
    meta = obj.get("metadata") or {}
    return obj.get("kind") == "CronJob" and str(meta.get("name", "")).startswith(health.GPU_TEST)


DEVICE_PLUGIN = "lab-device-plugin"  # its image among the lab's (superkube.lab.images)


def lab_only(obj: dict[str, Any], images: Mapping[str, Mapping[str, str]] | None = None) -> dict[str, Any]:
    """The object as the lab runs it (see the module's list); any other object is returned as it is."""
    kind, name = obj.get("kind"), str((obj.get("metadata") or {}).get("name", ""))
    agent = next((a for a in (health.PREFLIGHT_AGENT, health.HEALTH_AGENT) if name.startswith(f"{a}-")), None)
    if kind == "DaemonSet" and agent is not None:
        out = copy.deepcopy(obj)
        pod = out["spec"]["template"]["spec"]
        container = pod["containers"][0]
        gpus = {e["name"]: e.get("value") for e in container.get("env", [])}.get("EXPECTED_GPUS") != "0"
        if not gpus:  # a CPU pool's health agent: its host checks are the production ones
            container["command"] = _flags(container["command"], {"interval": str(ROUND_S)})
            return out
        flags = {"reading": f"{MOUNT}/{Path(READING).name}", "interval": str(ROUND_S)}
        if agent == health.PREFLIGHT_AGENT:
            flags["burn-seconds"] = "0"
            container["image"] = AGENTS_IMAGE
            container["resources"] = copy.deepcopy(health.AGENT_RESOURCES)
        container["command"] = _flags(container["command"], flags)
        container["volumeMounts"] = [
            *container.get("volumeMounts", []),
            {"name": "lab-reading", "mountPath": MOUNT, "readOnly": True},
        ]
        pod["volumes"] = [
            *pod.get("volumes", []),
            {"name": "lab-reading", "hostPath": {"path": READING_DIR, "type": "DirectoryOrCreate"}},
        ]
        return out
    if kind == "DaemonSet" and name.startswith(f"{kube.GPU_DEVICES_NAME}-"):
        out = copy.deepcopy(obj)
        pod = out["spec"]["template"]["spec"]
        container = pod["containers"][0]
        if not images or DEVICE_PLUGIN not in images:
            raise LabError(
                f"the lab has no {DEVICE_PLUGIN} image: run `superkube lab down`, then `lab up` again"
            )
        container["image"] = images[DEVICE_PLUGIN]["ref"]
        container["command"] = [
            "/lab-device-plugin",
            f"--reading={MOUNT}/{Path(READING).name}",
            f"--interval={ROUND_S}s",
        ]
        container.pop("env", None)
        # root, as NVIDIA's image runs: the kubelet's plugin directory and socket are root's (the lab
        # image's default user is nobody)
        container["securityContext"] = {**container.get("securityContext", {}), "runAsUser": 0}
        container["volumeMounts"] = [
            *container.get("volumeMounts", []),
            {"name": "lab-reading", "mountPath": MOUNT, "readOnly": True},
        ]
        pod["volumes"] = [
            *pod.get("volumes", []),
            {"name": "lab-reading", "hostPath": {"path": READING_DIR, "type": "DirectoryOrCreate"}},
        ]
        return out
    component = ((obj.get("metadata") or {}).get("labels") or {}).get("app.kubernetes.io/component")
    if kind == "Deployment" and component == autoscaling.BALLOONS:
        # each balloon asks for a whole node of its pool (its GPUs, most of its CPU and memory), which
        # no lab node has: at the plan's replicas (a pool's maximum, 7,500) they would only be
        # thousands of Pending pods the scheduler keeps retrying
        out = copy.deepcopy(obj)
        out["spec"]["replicas"] = 0
        return out
    if kind == "Deployment" and name == health.HEALTH_CONTROLLER:
        out = copy.deepcopy(obj)
        container = out["spec"]["template"]["spec"]["containers"][0]
        container["command"] = _flags(container["command"], {"max-cordoned-share": str(BREAKER_SHARE)})
        return out
    if kind == "Deployment" and name == kube.SERVING_CERTS_NAME:
        out = copy.deepcopy(obj)
        out["spec"]["replicas"] = 1
        return out
    return obj
