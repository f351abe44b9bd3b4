"""Ansible inventory for real clusters: the Azure dynamic-inventory configuration.

The Pulumi program tags every VM and scale set with `superkube-role` (gpu_nodes, cpu_nodes,
nat_host, etcd_main, etcd_events, apiservers); the azure.azcollection.azure_rm plugin turns those
tags into the same groups the lab's inventory has, and the stack's network facts become host
variables the roles read (superkube_cluster, superkube_cluster_cidrs, ...).
"""

from __future__ import annotations

import json
from typing import Any

import yaml

from superkube.cluster import autoscaling, join, kube, remediation
from superkube.model.ipam import AddressPlan
from superkube.model.spec import ClusterSpec


def cluster_facts(spec: ClusterSpec, addresses: AddressPlan) -> dict[str, Any]:
    """What the roles need to know of the cluster (inventory vars, without the superkube_ prefix)."""
    spoke, hub = str(addresses.spoke.address_space), str(addresses.hub.address_space)
    return {
        "cluster_cidrs": [spoke, hub, spec.service_cidr],
        "service_cidr": spec.service_cidr,
        "hub_cidrs": [hub],
        "node_cidrs": [spoke],
        "kubernetes_version": spec.kubernetes_version,
        "apiserver_address": str(addresses.apiserver_lb_ip),
        # cluster-autoscaler's command line for its host service on the API servers (none: not run)
        "autoscaler_flags": autoscaling.flags(spec, addresses.cluster) if spec.autoscaler_enabled else [],
        "autoscaler_user": autoscaling.USER,
        "scale_governor_user": autoscaling.GOVERNOR_USER,
        # the scale-up governor beside it (none: not run); the host adds the scope and identity
        "scale_governor": autoscaling.governor_settings(spec, addresses),
        # the join-token publisher on the API servers: each token's life and how often a new one comes
        "join_tokens": {"ttl_s": join.DEFAULT_TTL_S, "rotate_s": join.DEFAULT_ROTATE_S},
        # remediation beside them (none: not run); the host adds the scope and identity
        "remediation": remediation.settings(spec, addresses),
        "remediation_user": remediation.USER,
        "join_tokens_user": join.PUBLISHER,
        "join_tokens_documents_from": f"{join.PUBLISHER_NAMESPACE}/{join.DOCUMENTS_CONFIGMAP}",
        **kube.facts(spec, addresses),
    }


def resource_group(cluster: str, hub: bool = False) -> str:
    """The cluster's resource group (its spoke's), or its hub's."""
    return f"rg-{cluster}-hub" if hub else f"rg-{cluster}"


BUILDER_TAG = "superkube-builder"
"""The tag on a capture's builder VM (superkube.fleet.capture), naming the version it bakes."""


PLUGIN = "azure.azcollection.azure_rm"
"""The dynamic-inventory plugin the config names (and by which a file of it is recognised)."""


def azure_rm(spec: ClusterSpec, addresses: AddressPlan) -> dict[str, Any]:
    cluster = addresses.cluster
    groups = [resource_group(cluster), resource_group(cluster, hub=True)]
    facts = {
        "superkube_cluster": cluster,
        **{f"superkube_{k}": v for k, v in cluster_facts(spec, addresses).items()},
    }
    return {
        "plugin": PLUGIN,
        "auth_source": "auto",
        "include_vm_resource_groups": list(groups),
        "include_vmss_resource_groups": list(groups),
        "plain_host_names": True,
        # nodes have no public IPs: Ansible reaches them on their private address, through the hub
        "hostvar_expressions": {
            "ansible_host": "private_ipv4_addresses | first",
            "ansible_user": f"'{spec.admin_username}'",
            # expressions: a quoted string, or JSON (lists and mappings are also Jinja literals)
            **{k: json.dumps(v) if isinstance(v, list | dict) else f"'{v}'" for k, v in facts.items()},
            # a scale-set instance's pool, from the tag NodePool sets (empty on the control plane)
            "superkube_pool": "tags['superkube-pool'] | default('')",
            # a capture's builder VM (superkube image capture) carries its pool's tags, so a converge
            # of the whole fleet reaches it too: it never gets a join credential, whoever converges it
            "kubelet_write_bootstrap_kubeconfig": f"'{BUILDER_TAG}' not in tags",
            # on the API servers: the identity cluster-autoscaler uses and the group it acts in
            "superkube_autoscaler_identity": f"tags['{autoscaling.IDENTITY_TAG}'] | default('')",
            "superkube_autoscaler_scope": f"tags['{autoscaling.SCOPE_TAG}'] | default('')",
            "superkube_remediation_identity": f"tags['{remediation.IDENTITY_TAG}'] | default('')",
        },
        "exclude_host_filters": [f"tags['cluster'] | default('') != '{cluster}'", "powerstate != 'running'"],
        "keyed_groups": [
            {"prefix": "", "separator": "", "key": "tags['superkube-role'] | default('untagged')"}
        ],
        "conditional_groups": {
            "cluster": f"tags['superkube-role'] | default('') in {json.dumps(list(kube.GROUPS))}"
        },
    }


def render(spec: ClusterSpec, addresses: AddressPlan) -> str:
    header = (
        "# Azure dynamic inventory for cluster "
        f"{addresses.cluster}, written by `superkube inventory`.\n"
        "# Use: ansible-inventory -i this-file.azure_rm.yml --graph (needs azure.azcollection and Azure credentials)\n"
    )
    dumper = yaml.SafeDumper
    dumper.ignore_aliases = lambda self, data: True  # type: ignore[method-assign]
    return header + yaml.dump(azure_rm(spec, addresses), Dumper=dumper, sort_keys=False, width=120)
