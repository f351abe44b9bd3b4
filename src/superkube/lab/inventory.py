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
from superkube.cluster.monitoring import AUTOSCALER_JOB
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


LAB_SHARDS = 2
"""Prometheus shards the lab's monitoring host runs beside a few hosts (both on that host, a port
each); one where it watches a control plane (a lab with API servers), at 15 s, so that scraping every
etcd member, API server and node does not take the lab's few cores from what it watches."""
LAB_HOST_JOBS = ["etcd-main", "etcd-events", "node-exporter", "iptables-exporter", "join-tokens", "prometheus",
                 "metrics-store"]  # fmt: skip
"""The scrape jobs the lab's monitoring runs until the cluster's CA and metrics token are placed on it
(monitoring_pki_placed, which the role's preflight sets): what its hosts serve without credentials."""
LAB_SKIPPED_JOBS = [AUTOSCALER_JOB, "scale-governor", "remediation"]
"""Jobs of programs the lab does not run: they write to Azure."""
WATCHES_CLUSTER = "groups['apiservers'] | default([]) | length > 0"

LAB_ROLE_VARS: dict[str, Any] = {
    # no route to a package mirror: what a role installs from Debian is baked into the lab's image
    **{
        f"{role}_apt_update": False
        for role in ("node_software", "iptables_base", "iptables_exporter", "join_tokens", "monitoring")
    },
    # nothing can be fetched: every component the lab runs is its build of the pinned version
    # (superkube_local_builds), and one it has no build of is neither installed nor started
    "kube_component_install": False,
    "kube_component_start": "{{ kube_component_artefact in superkube_local_builds }}",
    "kube_apiserver_apply_addons": "{{ 'kube-apiserver' in superkube_local_builds }}",
    "etcd_install_release": False,
    "node_software_runtime_from_release": False,
    "node_software_cni_source": "distribution",
    "monitoring_install_release": False,
    "monitoring_grafana_install": False,
    # hosts are containers: no data disk, no clock or sysctls of their own to set, no GPU driver
    "etcd_data_device": "",
    "monitoring_data_device": "",
    "node_software_apply_sysctls": False,
    "node_software_chrony_service": False,
    "node_software_install_nvidia_driver": False,
    # no Azure: no identity tags to check, and none of the programs that act on Azure run
    "cluster_autoscaler_check_identity": False,
    "remediation_start": False,
    "scale_governor_start": False,
    "monitoring_autoscaler": False,
    "monitoring_skipped_jobs": LAB_SKIPPED_JOBS,
    # monitoring: its shards on one host, VictoriaMetrics' single-node store, answering up to the last
    # second (its default hides the newest 30 s, for samples still arriving from many senders); a lab
    # of a few hosts scrapes every 5 s so tests see samples soon, one watching a control plane every 15
    "monitoring_shards": f"{{{{ 1 if {WATCHES_CLUSTER} else {LAB_SHARDS} }}}}",
    "monitoring_host_shards": "{{ range(monitoring_shards | int) | list }}",
    "monitoring_scrape_interval": f"{{{{ '15s' if {WATCHES_CLUSTER} else '5s' }}}}",
    "monitoring_jobs": f"{{{{ [] if monitoring_pki_placed else {LAB_HOST_JOBS} }}}}",
    "monitoring_nodes_from_kubernetes": "{{ monitoring_pki_placed }}",
    "monitoring_single_node_store": True,
    "monitoring_store_flags": ["-search.latencyOffset=1s"],
}
"""What the lab's inventory sets in place of production's role defaults, each for what the lab lacks.
The roles never ask whether they run on the lab (tests/playbooks hold that)."""


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
                "superkube_cluster": LAB_STACK,
                **{f"superkube_{k}": v for k, v in lab.facts.items()},
                "superkube_local_builds": lab.builds,
                "node_software_images": lab.images,
                **LAB_ROLE_VARS,
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
