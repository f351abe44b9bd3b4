"""cloud-init for pool nodes: how the kubelet registers, and when it joins.

cloud-init is the one writer of a node's registration (its labels and taints, in
/etc/default/kubelet): it runs on every scale-set instance, the autoscaler's too, and the labels and
taints come from the same functions as the autoscaler's node-template tags. The node roles write
everything else (the kubelet and its configuration), once into the pool's image or by converge.

Joining waits for the bootstrap kubeconfig: `superkube-join.path` fires once it exists. An instance
gets it from its own custom data, which the join-token publisher completes in the scale set's model
(superkube.cluster.join); a node converge reaches before it joined gets it from the kubelet role. The
join then sleeps a random 0..jitter seconds before its kubelet starts. Hundreds of
VMs that the autoscaler adds at once would otherwise all register, list and watch within seconds of
each other (cluster-autoscaler's --max-nodes-per-scaleup only caps one scale-up; it does not pace
joins).
"""

from __future__ import annotations

import base64
import re
import shlex
from collections.abc import Mapping, Sequence

import yaml

from superkube.cluster.join import BOOTSTRAP_KUBECONFIG as BOOTSTRAP_KUBECONFIG  # its arrival starts the join
from superkube.model import teams
from superkube.model.spec import CLUSTER_LABEL, POOL_LABEL, PREFLIGHT_TAINT_KEY, ROLE_LABEL

PREFLIGHT_PENDING = "pending"  # the preflight taint's and label's value until the node passes
PREFLIGHT_TAINT = f"{PREFLIGHT_TAINT_KEY}={PREFLIGHT_PENDING}:NoSchedule"
PREFLIGHT_LABEL = f"{PREFLIGHT_TAINT_KEY}={PREFLIGHT_PENDING}"
REGISTRATION_FILE = "/etc/default/kubelet"
JOIN_SCRIPT = "/usr/local/sbin/superkube-join"
JOIN_PATH_UNIT = "/etc/systemd/system/superkube-join.path"


EGRESS_TAG = "superkube-egress-limit"
"""The scale-set tag carrying a pool's default pod egress limit (bits/s); a node reads it from its
instance metadata (`superkube.agents.cni_config`, which runs alone on nodes, keeps the same name)."""
JITTER_COMMAND = "shuf -i 0-{seconds} -n 1"
_JITTER = re.compile(r"shuf -i 0-(\d+) -n 1")


def join_jitter_seconds(join_script: str) -> int | None:
    """The jitter window a join script sleeps within, read back from the script (None if it does not)."""
    m = _JITTER.search(join_script)
    if not m or join_script.find("sleep") > join_script.find("systemctl enable --now kubelet"):
        return None
    return int(m.group(1))


def node_labels(cluster: str, pool: str, role: str, extra: Mapping[str, str]) -> dict[str, str]:
    labels = {
        CLUSTER_LABEL: cluster,
        POOL_LABEL: pool,
        ROLE_LABEL: role,
    }
    if role == "gpu":
        labels[PREFLIGHT_TAINT_KEY] = PREFLIGHT_PENDING
    labels.update(extra)
    return labels


def node_taints(role: str, extra: Sequence[str], team: str | None = None) -> list[str]:
    """The taints a pool's nodes register with: preflight on GPU nodes, the pool's own, and its
    team's (`ClusterSpec.pool_team`), so a node is its team's from its first moment and the
    autoscaler's template says so too (a template without it would plan a pod onto a node the
    team reconciler then taints against it)."""
    team_taint = [f"{teams.TEAM_KEY}={team}:{teams.TAINT_EFFECT}"] if team else []
    return ([PREFLIGHT_TAINT] if role == "gpu" else []) + list(extra) + team_taint


def render(
    *,
    cluster: str,
    pool: str,
    role: str,
    apiserver_endpoint: str,
    kubernetes_version: str,
    join_jitter_seconds: int,
    labels: Mapping[str, str],
    taints: Sequence[str],
) -> str:
    """The #cloud-config document for one pool's nodes."""
    kubelet_args = [
        f"--node-labels={','.join(f'{k}={v}' for k, v in sorted(labels.items()))}",
    ]
    if taints:
        kubelet_args.append(f"--register-with-taints={','.join(taints)}")
    join = "\n".join(
        [
            "#!/bin/sh",
            "# Spread kubelet registration of nodes that start together over the jitter window.",
            "set -eu",
            f'sleep "$({JITTER_COMMAND.format(seconds=join_jitter_seconds)})"',
            "systemctl enable --now kubelet",
            "",
        ]
    )
    join_path = "\n".join(
        [
            "[Unit]",
            "Description=Join the cluster once the kubelet's bootstrap kubeconfig is there",
            "",
            "[Path]",
            f"PathExists={BOOTSTRAP_KUBECONFIG}",
            "Unit=superkube-join.service",
            "",
            "[Install]",
            "WantedBy=multi-user.target",
            "",
        ]
    )
    join_service = "\n".join(
        [
            "[Unit]",
            "Description=Start the kubelet after a random join delay",
            f"ConditionPathExists={BOOTSTRAP_KUBECONFIG}",
            "",
            "[Service]",
            "Type=oneshot",
            f"ExecStart={JOIN_SCRIPT}",
            "RemainAfterExit=true",
            "",
        ]
    )
    doc = {
        "write_files": [
            {
                "path": REGISTRATION_FILE,
                "permissions": "0644",
                "content": f"KUBELET_EXTRA_ARGS={shlex.quote(' '.join(kubelet_args))}\n",
            },
            {
                "path": "/etc/superkube/node.env",
                "permissions": "0644",
                "content": "".join(
                    f"{k}={shlex.quote(v)}\n"
                    for k, v in {
                        "SUPERKUBE_CLUSTER": cluster,
                        "SUPERKUBE_POOL": pool,
                        "SUPERKUBE_ROLE": role,
                        "SUPERKUBE_APISERVER": apiserver_endpoint,
                        "SUPERKUBE_KUBERNETES_VERSION": kubernetes_version,
                        "SUPERKUBE_JOIN_JITTER_SECONDS": str(join_jitter_seconds),
                    }.items()
                ),
            },
            {"path": JOIN_SCRIPT, "permissions": "0755", "content": join},
            {"path": JOIN_PATH_UNIT, "permissions": "0644", "content": join_path},
            {
                "path": "/etc/systemd/system/superkube-join.service",
                "permissions": "0644",
                "content": join_service,
            },
        ],
        "runcmd": [["systemctl", "daemon-reload"], ["systemctl", "enable", "--now", "superkube-join.path"]],
    }
    return "#cloud-config\n" + yaml.safe_dump(doc, sort_keys=False, width=1_000)


def encode(document: str) -> str:
    return base64.b64encode(document.encode()).decode()


def decode(custom_data: str) -> dict[str, object]:
    text = base64.b64decode(custom_data).decode()
    if not text.startswith("#cloud-config\n"):
        raise ValueError("custom data is not a #cloud-config document")
    # libyaml's safe loader: the policy rules decode every VM's and scale set's custom data
    return yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
