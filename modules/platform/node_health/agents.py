"""The node agents' DaemonSets (preflight, health, the GPU reset) and the periodic GPU test's CronJob."""

from __future__ import annotations

from modules.platform import objects
from modules.platform.balloons import tolerations as pool_tolerations
from modules.platform.foundation import GPU_TEST_PRIORITY, NAMESPACE, NODE_AGENT_PRIORITY
from modules.platform.node_health.facts import (
    ADM_GID,
    AGENT_RESOURCES,
    BURN_CPU,
    BURN_MEMORY,
    BURN_RESOURCES,
    COMPONENT,
    FILESYSTEMS,
    GPU_RESET,
    GPU_TEST,
    HEALTH,
    HOST_FS_DIR,
    HOST_LOG,
    PREFLIGHT,
    RESET_SECURITY,
    SCALE_UP_DELAY,
    SCRATCH,
    SCRATCH_MOUNT,
    THRESHOLDS_DIR,
    THRESHOLDS_NAME,
    Agent,
    NodeHealthArgs,
)
from modules.platform.objects import Manifest
from superkube.cluster import health
from superkube.cluster.cloudinit import POOL_LABEL, PREFLIGHT_PENDING
from superkube.cluster.kube import (
    CONTAINERD_METRICS_PORT,
    IMDS,
    KERNEL_LOG,
    KERNEL_LOG_DIR,
    KUBELET_HEALTHZ_PORT,
    NODE_AGENTS_METRICS_PORT,
    PREFLIGHT_METRICS_PORT,
)
from superkube.model.spec import PREFLIGHT_TAINT_KEY
from superkube.model.spec import NodePool as PoolSpec
from superkube.model.vmsizes import GPU_RESOURCE, VmSize


def daemonset(pool: PoolSpec, vm: VmSize, args: NodeHealthArgs, agent: Agent) -> Manifest:
    base = HEALTH if agent == "health" else PREFLIGHT
    name = f"{base}-{pool.name}"
    port = NODE_AGENTS_METRICS_PORT if agent == "health" else PREFLIGHT_METRICS_PORT
    flags = [
        f"--interval={args.interval_seconds}",
        f"--metrics-port={port}",
        f"--thresholds={THRESHOLDS_DIR}/{args.thresholds.name}",
    ]
    if args.dcgm_url and vm.gpus:
        flags.append(f"--dcgm-url={args.dcgm_url}")
    if agent == "health":
        flags += [
            *(f"--filesystem={name}={HOST_FS_DIR}/{name}" for name, _ in FILESYSTEMS),
            f"--kernel-log={HOST_LOG}/{KERNEL_LOG}",
            f"--kubelet-healthz=http://127.0.0.1:{KUBELET_HEALTHZ_PORT}/healthz",
            f"--runtime-metrics=http://127.0.0.1:{CONTAINERD_METRICS_PORT}/v1/metrics",
            *([f"--api-address={args.api_address}"] if args.api_address else []),
            *([f"--scheduled-events={IMDS}"] if args.scheduled_events else []),
            *([f"--peers={args.peers}"] if args.peers else []),
        ]
    selector = {POOL_LABEL: pool.name}
    if agent == "preflight":
        selector[PREFLIGHT_TAINT_KEY] = PREFLIGHT_PENDING  # the pod goes once the node has passed
        # the active check too: nothing else runs behind the preflight taint, so it has the GPUs
        flags.append(f"--burn-seconds={args.burn_seconds}")
    env = [
        *_node_env(pool, vm),
        {"name": "NODE_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.hostIP"}}},
        {"name": "NODE_POOL", "value": pool.name},
    ]
    if vm.gpus:
        env += [
            # every GPU visible through the NVIDIA runtime, none requested: the health agent only
            # reads them (NVML); preflight also computes on them, behind the taint that keeps jobs away
            {"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"},
            {
                "name": "NVIDIA_DRIVER_CAPABILITIES",
                "value": "utility" if agent == "health" else "compute,utility",
            },
        ]
    host_mounts = [
        # HostToContainer: a filesystem mounted (or remounted read-only) there later is seen too
        *(
            {
                "name": f"host-fs-{name}",
                "mountPath": f"{HOST_FS_DIR}/{name}",
                "readOnly": True,
                "mountPropagation": "HostToContainer",
            }
            for name, _ in FILESYSTEMS
        ),
        {"name": "host-kernel-log", "mountPath": HOST_LOG, "readOnly": True},
    ]
    host_volumes = [
        *(
            {"name": f"host-fs-{name}", "hostPath": {"path": path, "type": "DirectoryOrCreate"}}
            for name, path in FILESYSTEMS
        ),
        {"name": "host-kernel-log", "hostPath": {"path": KERNEL_LOG_DIR, "type": "DirectoryOrCreate"}},
    ]
    container = {
        "name": "agent",
        "image": args.image if agent == "health" else args.gpu_tests_image,
        "command": [
            "python",
            "-m",
            f"superkube.agents.{'node_health' if agent == 'health' else 'preflight'}",
            *flags,
        ],
        "env": env,
        "ports": [{"name": "metrics", "containerPort": port, "hostPort": port}],
        "resources": AGENT_RESOURCES if agent == "health" else BURN_RESOURCES,
        "livenessProbe": {
            "httpGet": {"path": "/metrics", "port": port},
            "periodSeconds": 30,
            "failureThreshold": 4,
        },
        "volumeMounts": [
            {"name": "thresholds", "mountPath": THRESHOLDS_DIR, "readOnly": True},
            *([SCRATCH_MOUNT] if agent == "preflight" else host_mounts),
        ],
        "securityContext": objects.restricted(),
    }
    pod = {
        "serviceAccountName": base,
        "priorityClassName": NODE_AGENT_PRIORITY,
        **({"securityContext": {"supplementalGroups": [ADM_GID]}} if agent == "health" else {}),
        "hostNetwork": True,
        "dnsPolicy": "ClusterFirstWithHostNet",
        "nodeSelector": selector,
        # on every node it selects: behind the preflight taint, cordoned, or tainted by its pool
        "tolerations": [{"operator": "Exists"}],
        "containers": [container],
        "volumes": [
            {"name": "thresholds", "configMap": {"name": THRESHOLDS_NAME}},
            *([SCRATCH] if agent == "preflight" else host_volumes),
        ],
    }
    return objects.daemonset(name, COMPONENT, NAMESPACE, pod)


def reset_daemonset(pool: PoolSpec, vm: VmSize, args: NodeHealthArgs) -> Manifest:
    """The pool's GPU reset (superkube.agents.gpu_reset): a pod only on the nodes the health controller
    labelled for a reset (drained, every fatal finding one a reset may clear), gone once it removes the
    label. Not on the host network: it reaches only the API server, and serves its outcomes' counter on
    its pod's `metrics` port, where the node-agents scrape job finds it by pod discovery."""
    flags = [
        f"--interval={min(args.interval_seconds, 30)}",
        f"--thresholds={THRESHOLDS_DIR}/{args.thresholds.name}",
        *([f"--dcgm-url={args.dcgm_url}"] if args.dcgm_url else []),
    ]
    container = {
        "name": "reset",
        "image": args.image,
        "command": ["python", "-m", "superkube.agents.gpu_reset", *flags],
        "env": [
            *_node_env(pool, vm),
            {"name": "NODE_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.hostIP"}}},
            {"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"},
            {"name": "NVIDIA_DRIVER_CAPABILITIES", "value": "utility"},
        ],
        "ports": [{"name": "metrics", "containerPort": NODE_AGENTS_METRICS_PORT}],
        "resources": AGENT_RESOURCES,
        "volumeMounts": [{"name": "thresholds", "mountPath": THRESHOLDS_DIR, "readOnly": True}],
        "securityContext": RESET_SECURITY,
    }
    pod = {
        "serviceAccountName": GPU_RESET,
        "priorityClassName": NODE_AGENT_PRIORITY,
        "nodeSelector": {POOL_LABEL: pool.name, health.GPU_RESET_LABEL: health.RESET_REQUESTED},
        "tolerations": [{"operator": "Exists"}],  # the node is cordoned, and may carry its pool's taints
        "containers": [container],
        "volumes": [{"name": "thresholds", "configMap": {"name": THRESHOLDS_NAME}}],
    }
    return objects.daemonset(f"{GPU_RESET}-{pool.name}", COMPONENT, NAMESPACE, pod)


def _node_env(pool: PoolSpec, vm: VmSize) -> list[Manifest]:
    return [
        {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
        {"name": "VM_SIZE", "value": vm.name},
        {"name": "EXPECTED_GPUS", "value": str(vm.gpus)},
        {"name": "HOME", "value": "/tmp"},
    ]


def periodic_test(pool: PoolSpec, vm: VmSize, args: NodeHealthArgs) -> Manifest:
    """The pool's periodic GPU test: a CronJob whose pods each take every GPU of one node.

    - Only idle nodes: a pod requesting all of a node's GPUs fits only where none is in use.
    - Never in the way: its class is below the autoscaler's expendable cutoff (a pending test never
      adds a node; the pod-scale-up-delay beyond the deadline says the same to the autoscaler) and
      never preempts, so it waits for idle nodes and any real pod preempts it.
    - One node per pod (anti-affinity), at most `test_nodes` per run, each index on its own: a node
      that fails is not retried and does not stop the others (backoffLimitPerIndex 0).
    - Its pool's taints and any team's are tolerated, the preflight taint never: a node in preflight
      is preflight's, and a cordoned node takes no pod at all.
    """
    name = f"{GPU_TEST}-{pool.name}"
    labels = objects.labels(COMPONENT, name)
    container = {
        "name": "test",
        "image": args.gpu_tests_image,
        "command": [
            "python",
            "-m",
            "superkube.agents.gpu_test",
            f"--thresholds={THRESHOLDS_DIR}/{args.thresholds.name}",
            f"--burn-seconds={args.burn_seconds}",
            *([f"--dcgm-url={args.dcgm_url}"] if args.dcgm_url else []),
        ],
        "env": [
            *_node_env(pool, vm),
            {"name": "NODE_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.hostIP"}}},
        ],
        "resources": {
            "requests": {"cpu": BURN_CPU, "memory": BURN_MEMORY, GPU_RESOURCE: str(vm.gpus)},
            "limits": {"memory": BURN_MEMORY, GPU_RESOURCE: str(vm.gpus)},
        },
        "volumeMounts": [
            {"name": "thresholds", "mountPath": THRESHOLDS_DIR, "readOnly": True},
            SCRATCH_MOUNT,
        ],
        "securityContext": objects.restricted(),
    }
    return {
        "apiVersion": "batch/v1",
        "kind": "CronJob",
        "metadata": objects.meta(name, COMPONENT, NAMESPACE),
        "spec": {
            "schedule": args.test_schedule,
            "concurrencyPolicy": "Forbid",
            "startingDeadlineSeconds": 600,
            "successfulJobsHistoryLimit": 3,
            "failedJobsHistoryLimit": 3,
            "jobTemplate": {
                "spec": {
                    "completionMode": "Indexed",
                    "completions": args.test_nodes,
                    "parallelism": args.test_nodes,
                    "backoffLimitPerIndex": 0,
                    "maxFailedIndexes": args.test_nodes,
                    "activeDeadlineSeconds": args.test_deadline_seconds,
                    "ttlSecondsAfterFinished": 86400,
                    "template": {
                        "metadata": {
                            "labels": labels,
                            "annotations": {SCALE_UP_DELAY: f"{2 * args.test_deadline_seconds}s"},
                        },
                        "spec": {
                            "restartPolicy": "Never",
                            "serviceAccountName": GPU_TEST,
                            "priorityClassName": GPU_TEST_PRIORITY,
                            "nodeSelector": {POOL_LABEL: pool.name},
                            "tolerations": pool_tolerations(pool),
                            "affinity": {
                                "podAntiAffinity": {
                                    "requiredDuringSchedulingIgnoredDuringExecution": [
                                        {
                                            "topologyKey": "kubernetes.io/hostname",
                                            "labelSelector": {"matchLabels": labels},
                                        }
                                    ]
                                }
                            },
                            "containers": [container],
                            "volumes": [
                                {"name": "thresholds", "configMap": {"name": THRESHOLDS_NAME}},
                                SCRATCH,
                            ],
                        },
                    },
                }
            },
        },
    }
