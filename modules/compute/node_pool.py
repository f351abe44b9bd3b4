"""A node pool: one or more VM scale sets with alias-IP NICs, sized by the address plan."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import pulumi
from pulumi_azure_native import compute

from modules.common import child, image_reference, linux_ssh_only, require, tagged
from superkube.cluster import cloudinit
from superkube.cluster.autoscaling import discovery_tags, template_tag
from superkube.cluster.cloudinit import EGRESS_TAG
from superkube.cluster.kube import pool_group
from superkube.model.ipam import ScaleSetPlan
from superkube.model.spec import GALLERY_IMAGE
from superkube.model.spec import NodePool as PoolSpec
from superkube.model.vmsizes import GPU_RESOURCE

CUSTOM_DATA_PROPERTY = "virtualMachineProfile.osProfile.customData"
OS_IMAGE_NOTICE = "PT15M"
"""How long a reimage or OS upgrade waits for its scheduled event to be approved: the one value
Compute's API takes (osImageNotificationProfile.notBeforeTimeout, "must be 15 minutes";
https://learn.microsoft.com/rest/api/compute/virtual-machine-scale-sets/create-or-update#osimagenotificationprofile,
https://learn.microsoft.com/azure/virtual-machine-scale-sets/virtual-machine-scale-sets-terminate-notification
for the terminate notice beside it)."""


@dataclass(frozen=True, kw_only=True)
class NodePoolArgs:
    cluster: str
    """Cluster name, used in scale-set names and autoscaler discovery tags."""
    location: str
    """Azure region."""
    resource_group_name: pulumi.Input[str]
    """Resource group of the cluster."""
    pool: PoolSpec
    """The pool from the spec (VM size, GPUs, pod IPs, labels, taints)."""
    scale_sets: Sequence[ScaleSetPlan]
    """The pool's scale sets from the address plan, each with its capacity, zone and subnet."""
    subnet_ids: Mapping[str, pulumi.Input[str]]
    """Subnet IDs by subnet name, covering every scale set's subnet."""
    admin_username: str
    """Admin user; login by SSH key only."""
    ssh_public_key: str
    """OpenSSH public key of the admin user."""
    apiserver_endpoint: str
    """URL of the API servers' internal load balancer."""
    kubernetes_version: str
    """Kubernetes version of the kubelet."""
    join_jitter_seconds: int = 300
    """Random delay window before a new node's kubelet registers (default: 300)."""
    autoscaler: bool = True
    """Tag the scale sets for cluster-autoscaler discovery (default: on)."""
    tags: dict[str, str] = field(default_factory=dict)
    """Tags on every scale set (default: none)."""
    team: str | None = None
    """The team whose taint the nodes register with, from the spec's teams (default: none)."""
    image_id: pulumi.Input[str] | None = None
    """The ID of the cluster's gallery image definition for this pool's kind (`NodeImages`): a pool
    whose image is `gallery:<version>` boots that version of it (default: none)."""
    terminate_notice_minutes: int = 10
    """Minutes Azure waits after telling a VM it will be deleted (terminate notification, 5 to 15;
    https://learn.microsoft.com/azure/virtual-machine-scale-sets/virtual-machine-scale-sets-terminate-notification):
    the health agent has its node drained, then approves the deletion (default: 10)."""
    initial_max: Mapping[str, int] | None = None
    """Scale set name -> its first `max` tag, where the scale-up governor owns the tag after that
    (`modules.cluster.governed_maxes`); None: the tag is the set's capacity and Pulumi keeps it so."""

    def __post_init__(self) -> None:
        require(bool(self.scale_sets), "scale_sets", "a pool needs at least one scale set")
        require(
            all(s.pool == self.pool.name for s in self.scale_sets),
            "scale_sets",
            "every scale set must belong to this pool",
        )
        require(
            sum(s.capacity for s in self.scale_sets) == self.pool.nodes,
            "scale_sets",
            "capacities must add up to pool.nodes",
        )
        missing = {s.subnet for s in self.scale_sets} - set(self.subnet_ids)
        require(not missing, "subnet_ids", f"no subnet ID for {sorted(missing)}")
        require(
            self.image_id is not None or not self.pool.image.startswith(GALLERY_IMAGE),
            "image_id",
            f"pool {self.pool.name} boots {self.pool.image}: give the gallery's image definition",
        )
        require(5 <= self.terminate_notice_minutes <= 15, "terminate_notice_minutes", "must be 5 to 15")


def autoscaler_tags(
    cluster: str,
    pool: PoolSpec,
    plan: ScaleSetPlan,
    labels: Mapping[str, str],
    taints: Sequence[str],
    max_nodes: int | None = None,
) -> dict[str, str]:
    """Discovery, bounds and the node template cluster-autoscaler needs to scale a set from zero.
    `max_nodes`: the first max where the governor raises it step by step (default: the capacity)."""
    tags = {
        **discovery_tags(cluster),
        "min": str(plan.min_nodes),
        "max": str(plan.capacity if max_nodes is None else max_nodes),
    }
    for key, value in labels.items():
        tags[template_tag("label", key)] = value
    for taint in taints:
        key, _, effect = taint.partition(":")
        name, _, value = key.partition("=")
        tags[template_tag("taint", name)] = f"{value}:{effect}"
    if pool.gpus_per_node:
        tags[template_tag("resources", GPU_RESOURCE)] = str(pool.gpus_per_node)
    return tags


class NodePool(pulumi.ComponentResource):
    """One VM scale set per planned set: no public IPs, SSH keys only, NICs with 1 + pod IPs.

    Every NIC carries a primary IP configuration plus one secondary configuration per pod IP in the
    same subnet, so pods get VNet addresses directly (alias IPs, no overlay). The autoscaler owns
    the instance count; Pulumi sets it once (to min_nodes) and then ignores it.
    """

    def __init__(self, name: str, args: NodePoolArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("superkube:compute:NodePool", name, None, opts)
        pool = args.pool
        labels = cloudinit.node_labels(args.cluster, pool.name, pool.role, pool.labels)
        taints = cloudinit.node_taints(pool.role, pool.taints, args.team)
        document = cloudinit.render(
            cluster=args.cluster,
            pool=pool.name,
            role=pool.role,
            apiserver_endpoint=args.apiserver_endpoint,
            kubernetes_version=args.kubernetes_version,
            join_jitter_seconds=args.join_jitter_seconds,
            labels=labels,
            taints=taints,
        )
        custom_data = cloudinit.encode(document)
        self.documents = {plan.name: document for plan in args.scale_sets}
        """Each scale set's #cloud-config document, without credentials (the join-token publisher adds
        them, superkube.agents.join_tokens, from the in-cluster layer's copy of these)."""
        self.scale_sets: list[compute.VirtualMachineScaleSet] = []
        for plan in args.scale_sets:
            subnet = compute.ApiEntityReferenceArgs(id=args.subnet_ids[plan.subnet])
            ip_configurations = [
                compute.VirtualMachineScaleSetIPConfigurationArgs(
                    name="primary", primary=True, subnet=subnet, private_ip_address_version="IPv4"
                )
            ]
            ip_configurations += [
                compute.VirtualMachineScaleSetIPConfigurationArgs(
                    name=f"pod-{i:03d}", primary=False, subnet=subnet, private_ip_address_version="IPv4"
                )
                for i in range(1, pool.pod_ips_per_node + 1)
            ]
            tags = tagged(
                args.tags,
                superkube_role=pool_group(pool.role),
                superkube_pool=pool.name,
                superkube_pod_ips=str(pool.pod_ips_per_node),
                # the most VMs the plan lets this set hold, whether or not the autoscaler manages it
                superkube_capacity=str(plan.capacity),
            )
            if pool.egress_limit_bits:
                # read back by the node's CNI config writer from instance metadata at boot
                tags[EGRESS_TAG] = str(pool.egress_limit_bits)
            governed = args.autoscaler and args.initial_max is not None
            if args.autoscaler:
                first = args.initial_max.get(plan.name) if args.initial_max is not None else None
                tags.update(autoscaler_tags(args.cluster, pool, plan, labels, taints, first))
            self.scale_sets.append(
                compute.VirtualMachineScaleSet(
                    f"{name}-{plan.index}",
                    vm_scale_set_name=plan.name,
                    resource_group_name=args.resource_group_name,
                    location=args.location,
                    zones=list(plan.zones),
                    sku=compute.SkuArgs(name=pool.vm_size, tier="Standard", capacity=plan.min_nodes),
                    overprovision=False,
                    single_placement_group=False,
                    platform_fault_domain_count=1,
                    upgrade_policy=compute.UpgradePolicyArgs(mode=compute.UpgradeMode.MANUAL),
                    virtual_machine_profile=compute.VirtualMachineScaleSetVMProfileArgs(
                        # a Terminate scheduled event before any delete (the autoscaler's, remediation's,
                        # a person's), which the node's health agent drains the node for and approves;
                        # and one before a reimage or OS upgrade replaces the OS disk
                        scheduled_events_profile=compute.ScheduledEventsProfileArgs(
                            terminate_notification_profile=compute.TerminateNotificationProfileArgs(
                                enable=True, not_before_timeout=f"PT{args.terminate_notice_minutes}M"
                            ),
                            os_image_notification_profile=compute.OSImageNotificationProfileArgs(
                                enable=True, not_before_timeout=OS_IMAGE_NOTICE
                            ),
                        ),
                        os_profile=compute.VirtualMachineScaleSetOSProfileArgs(
                            computer_name_prefix=plan.computer_name_prefix,
                            admin_username=args.admin_username,
                            linux_configuration=linux_ssh_only(args.admin_username, args.ssh_public_key),
                            custom_data=custom_data,
                        ),
                        storage_profile=compute.VirtualMachineScaleSetStorageProfileArgs(
                            image_reference=self._image(args),
                            os_disk=compute.VirtualMachineScaleSetOSDiskArgs(
                                create_option="FromImage",
                                caching=compute.CachingTypes.READ_ONLY,
                                disk_size_gb=pool.os_disk_gb,
                                managed_disk=compute.VirtualMachineScaleSetManagedDiskParametersArgs(
                                    storage_account_type="Premium_LRS"
                                ),
                            ),
                        ),
                        network_profile=compute.VirtualMachineScaleSetNetworkProfileArgs(
                            network_interface_configurations=[
                                compute.VirtualMachineScaleSetNetworkConfigurationArgs(
                                    name="primary",
                                    primary=True,
                                    enable_accelerated_networking=True,
                                    enable_ip_forwarding=False,
                                    ip_configurations=ip_configurations,
                                )
                            ]
                        ),
                    ),
                    tags=tags,
                    # the autoscaler owns the count, where governed the governor the max tag, and the
                    # join-token publisher the model's custom data once it has added a join token
                    # (superkube.cluster.join): `pulumi up` writes the plan's document at creation only
                    opts=child(
                        self,
                        ignore_changes=[
                            "sku.capacity",
                            *(['tags["max"]'] if governed else []),
                            CUSTOM_DATA_PROPERTY,
                        ],
                    ),
                )
            )
        self.register_outputs({"scale_set_ids": [s.id for s in self.scale_sets]})

    @staticmethod
    def _image(args: NodePoolArgs) -> compute.ImageReferenceArgs:
        """The marketplace image, or the named version of the cluster's own node image."""
        image = args.pool.image
        if not image.startswith(GALLERY_IMAGE) or args.image_id is None:
            return image_reference(image)
        version = image.removeprefix(GALLERY_IMAGE)
        return compute.ImageReferenceArgs(id=pulumi.Output.concat(args.image_id, "/versions/", version))
