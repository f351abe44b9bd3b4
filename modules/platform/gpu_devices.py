"""The GPUs as the scheduler sees them: NVIDIA's device plugin on every node of every GPU pool.

A GPU node's kubelet advertises `nvidia.com/gpu` only once a device plugin registers the node's GPUs
with it (the kubelet's device plugin API); until then a pod that asks for GPUs, a job's worker among
them, fits no node. Per GPU pool a DaemonSet runs NVIDIA's plugin on the pool's nodes, on the host's
network, at system-node-critical, tolerating every taint (it must advertise the GPUs while preflight still holds
the node, so the GPUs are there when the taint lifts; a cordon must not take them away either). It
sees only the kubelet's plugin directory. It reads the GPUs through NVIDIA's container runtime, which
the node's containerd must run it with: the node_software role's containerd configuration has only
runc so far (docs/04-in-cluster-layer.md says so), and until it has NVIDIA's runtime too the plugin
fails at start on a GPU node (FAIL_ON_INIT_ERROR) instead of advertising no GPUs.

In the lab the same DaemonSet runs the lab's device plugin instead (superkube.lab.agent_pods), which
advertises the GPUs of the node's reading.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pulumi

from modules.common import require
from modules.platform import objects
from modules.platform.foundation import NAMESPACE
from modules.platform.objects import Manifest
from superkube.cluster.cloudinit import POOL_LABEL
from superkube.cluster.kube import GPU_DEVICES_COMPONENT, GPU_DEVICES_NAME

COMPONENT = GPU_DEVICES_COMPONENT
NAME = GPU_DEVICES_NAME
VERSION = "v0.17.1"
IMAGE = f"nvcr.io/nvidia/k8s-device-plugin:{VERSION}"
"""NVIDIA's release (its static deployment's image)."""
PLUGIN_DIR = "/var/lib/kubelet/device-plugins"
NODE_CRITICAL = "system-node-critical"


@dataclass(frozen=True, kw_only=True)
class GpuDevicesArgs:
    pools: Sequence[str]
    """The GPU pools' names: their nodes run the plugin."""
    image: str = IMAGE

    def __post_init__(self) -> None:
        require(len(set(self.pools)) == len(self.pools), "pools", "names a pool twice")


def daemonset(pool: str, image: str) -> Manifest:
    """The plugin on pool `pool`'s nodes, on the host's network: it talks to the kubelet over a unix
    socket and takes none of the pod IPs the node's NIC has for the jobs (kube.HOST_NETWORK_PODS)."""
    pod = {
        "hostNetwork": True,
        "priorityClassName": NODE_CRITICAL,
        "tolerations": [{"operator": "Exists"}],
        "nodeSelector": {POOL_LABEL: pool},
        "containers": [
            {
                "name": "plugin",
                "image": image,
                # a node whose GPUs cannot be read fails the pod, visibly, rather than advertising none
                "env": [{"name": "FAIL_ON_INIT_ERROR", "value": "true"}],
                "resources": {"requests": {"cpu": "10m", "memory": "32Mi"}, "limits": {"memory": "128Mi"}},
                "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
                "volumeMounts": [{"name": "device-plugins", "mountPath": PLUGIN_DIR}],
            }
        ],
        "volumes": [{"name": "device-plugins", "hostPath": {"path": PLUGIN_DIR, "type": "Directory"}}],
    }
    return objects.daemonset(f"{NAME}-{pool}", COMPONENT, NAMESPACE, pod)


def manifests(args: GpuDevicesArgs) -> list[Manifest]:
    return [daemonset(pool, args.image) for pool in args.pools]


class GpuDevices(pulumi.ComponentResource):
    """NVIDIA's device plugin on every GPU pool's nodes."""

    def __init__(self, name: str, args: GpuDevicesArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("superkube:platform:GpuDevices", name, None, opts)
        self.resources = objects.create(self, name, manifests(args))
        self.register_outputs({"image": args.image, "pools": list(args.pools)})
