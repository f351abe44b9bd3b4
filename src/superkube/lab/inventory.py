"""The lab's Ansible inventory: production's groups over the lab's hosts, with what the lab sets in
place of what it cannot have.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from superkube.cluster.kube import (
    GROUPS,
    LAB_ONLY_KUBE_PROXY_CONFIG,
    LAB_ONLY_KUBELET_CONFIG,
    LAB_ONLY_NODE_SOFTWARE,
)
from superkube.fleet.converge import set_current_inventory
from superkube.lab.fabric import HOST_GROUPS
from superkube.lab.machines import proxy_command
from superkube.lab.state import LAB_STACK, Lab

PUBLISHED_MODELS = "/var/lib/superkube/join-tokens/models"
"""Where the join-token publisher on the lab's API-server hosts writes the scale sets' models (the
join_tokens role's `join_tokens_directory`): the lab's stand-in for Resource Manager's copy of them."""


LAB_CERT_DURATION = "3m"
"""What the lab's controller-manager signs kubelet certificates for. It backdates each by 5 minutes,
so a kubelet (rotating at 70-90 % of the 8-minute span) renews 0.6-2.2 minutes after each issue."""


def write_inventory(lab: Lab) -> Path:
    """An Ansible inventory whose groups match production's, plus hub and internet."""
    common = f"-o ProxyCommand='{proxy_command()}' -o UserKnownHostsFile={lab.known_hosts} -o StrictHostKeyChecking=yes"
    groups: dict[str, Any] = {g: {"hosts": {}} for g in (*HOST_GROUPS, "hub", "internet")}
    for h in lab.hosts:
        groups[h.group]["hosts"][h.name] = {
            "ansible_host": h.address,
            **({"superkube_pool": h.pool} if h.pool else {}),
        }
    children = {g: v for g, v in groups.items() if v["hosts"]}
    inventory = {
        "all": {
            "vars": {
                "ansible_user": "root",
                "ansible_ssh_private_key_file": str(lab.key),
                "ansible_ssh_common_args": common,
                "ansible_python_interpreter": "/usr/bin/python3",
                "superkube_lab": True,
                "superkube_cluster": LAB_STACK,
                **{f"superkube_{k}": v for k, v in lab.facts.items()},
                "superkube_lab_builds": lab.builds,
                "superkube_lab_images": lab.images,
                **(
                    {"node_software_sandbox_image": lab.images["pause"]["ref"]}
                    if "pause" in lab.images
                    else {}
                ),
                **LAB_ONLY_NODE_SOFTWARE,
                "kubelet_extra_config": LAB_ONLY_KUBELET_CONFIG,
                "kube_proxy_extra_config": LAB_ONLY_KUBE_PROXY_CONFIG,
                # no Resource Manager: the API servers' join-token publisher writes the models here
                "join_tokens_directory": PUBLISHED_MODELS,
                # kubelet client certificates for minutes, not a year: a test sees one rotate
                "kube_controller_manager_extra_flags": {"cluster-signing-duration": LAB_CERT_DURATION},
            },
            "children": {
                **children,
                "cluster": {"children": {g: {} for g in GROUPS if g in children}},
            },
        }
    }
    lab.inventory.write_text(yaml.safe_dump(inventory, sort_keys=False))
    set_current_inventory(lab.inventory)  # converge and etcd status find it there
    return lab.inventory
