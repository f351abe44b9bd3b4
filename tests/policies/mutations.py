"""Single changes to a recorded plan document, each of which one rule must catch."""

from __future__ import annotations

import base64
import ipaddress
from collections.abc import Callable
from typing import Any

import yaml

from modules.platform import serving_certs
from superkube.cluster import dns, join

Doc = dict[str, Any]
VM = "azure-native:compute:VirtualMachine"
VMSS = "azure-native:compute:VirtualMachineScaleSet"
NIC = "azure-native:network:NetworkInterface"
ROLE_ASSIGNMENT = "azure-native:authorization:RoleAssignment"


def of(doc: Doc, type_: str, role: str | None = None) -> list[dict[str, Any]]:
    return [
        r
        for r in doc["resources"]
        if r["type"] == type_
        and (role is None or (r["inputs"].get("tags") or {}).get("superkube-role") == role)
    ]


def drop(doc: Doc, resources: list[dict[str, Any]]) -> None:
    urns = {r["urn"] for r in resources}
    doc["resources"] = [r for r in doc["resources"] if r["urn"] not in urns]


def rewrite_cloud_init(vmss: dict[str, Any], path: str, change: Callable[[str], str]) -> None:
    profile = vmss["inputs"]["virtualMachineProfile"]["osProfile"]
    text = base64.b64decode(profile["customData"]).decode()
    doc = yaml.safe_load(text)
    for f in doc["write_files"]:
        if f["path"] == path:
            f["content"] = change(f["content"])
    profile["customData"] = base64.b64encode(("#cloud-config\n" + yaml.safe_dump(doc)).encode()).decode()


def gpu_vmss(doc: Doc) -> dict[str, Any]:
    return of(doc, VMSS, "gpu_nodes")[0]


def drop_one_apiserver(doc: Doc) -> None:
    drop(doc, of(doc, VM, "apiservers")[-1:])


def drop_one_etcd_main(doc: Doc) -> None:
    drop(doc, of(doc, VM, "etcd_main")[-1:])


def drop_events_etcd(doc: Doc) -> None:
    drop(doc, of(doc, VM, "etcd_events") + of(doc, NIC, "etcd_events"))


def events_on_main_subnet(doc: Doc) -> None:
    main_subnet = of(doc, NIC, "etcd_main")[0]["inputs"]["ipConfigurations"][0]["subnet"]
    of(doc, NIC, "etcd_events")[0]["inputs"]["ipConfigurations"][0]["subnet"] = dict(main_subnet)


def apiserver_on_gpu_size(doc: Doc) -> None:
    of(doc, VM, "apiservers")[0]["inputs"]["hardwareProfile"]["vmSize"] = "Standard_ND96isr_H100_v5"


def peer_two_spokes(doc: Doc) -> None:
    spoke = of(doc, "azure-native:network:VirtualNetwork", "spoke")[0]
    other = {**spoke, "urn": spoke["urn"] + "-other", "name": "other-spoke"}
    other["inputs"] = {
        **spoke["inputs"],
        "virtualNetworkName": "vnet-other-cluster",
        "addressSpace": {"addressPrefixes": ["10.200.0.0/16"]},
    }
    peering = of(doc, "azure-native:network:VirtualNetworkPeering")[0]
    link = {**peering, "urn": peering["urn"] + "-to-other", "name": "spoke-to-other"}
    link["inputs"] = {
        **peering["inputs"],
        "virtualNetworkName": spoke["inputs"]["virtualNetworkName"],
        "remoteVirtualNetwork": {
            "id": spoke["id"].replace(spoke["inputs"]["virtualNetworkName"], "vnet-other-cluster")
        },
    }
    doc["resources"] += [other, link]


def add_public_ip(doc: Doc) -> None:
    nic = of(doc, NIC, "apiservers")[0]
    nic["inputs"]["ipConfigurations"][0]["publicIPAddress"] = {
        "id": "/subscriptions/x/resourceGroups/rg/providers/Microsoft.Network/publicIPAddresses/pip"
    }


def public_ip_on_scale_set(doc: Doc) -> None:
    ipc = gpu_vmss(doc)["inputs"]["virtualMachineProfile"]["networkProfile"][
        "networkInterfaceConfigurations"
    ][0]["ipConfigurations"][0]
    ipc["publicIPAddressConfiguration"] = {"name": "pip"}


def public_ip_resource(doc: Doc) -> None:
    nic = of(doc, NIC, "apiservers")[0]
    doc["resources"].append(
        {
            **nic,
            "urn": nic["urn"] + "-pip",
            "type": "azure-native:network:PublicIPAddress",
            "name": "pip",
            "inputs": {"tags": nic["inputs"]["tags"]},
        }
    )


def public_ip_inline_on_vm(doc: Doc) -> None:
    vm = of(doc, VM, "etcd_main")[0]
    vm["inputs"]["networkProfile"]["networkInterfaceConfigurations"] = [
        {
            "name": "inline",
            "ipConfigurations": [{"name": "ip", "publicIPAddressConfiguration": {"name": "pip"}}],
        }
    ]


def public_lb_frontend(doc: Doc) -> None:
    lb = of(doc, "azure-native:network:LoadBalancer")[0]
    lb["inputs"]["frontendIPConfigurations"][0]["publicIPPrefix"] = {
        "id": "/subscriptions/x/publicIPPrefixes/p"
    }


def allow_ssh_from_internet(doc: Doc) -> None:
    nsg = of(doc, "azure-native:network:NetworkSecurityGroup", "spoke")[0]
    nsg["inputs"]["securityRules"].append(
        {
            "name": "ssh",
            "priority": 100,
            "direction": "Inbound",
            "access": "Allow",
            "protocol": "Tcp",
            "sourceAddressPrefix": "Internet",
            "destinationPortRange": "22",
        }
    )


def allow_from(
    field: str, value: Any, access: str = "Allow", direction: str = "Inbound"
) -> Callable[[Doc], None]:
    """An Allow rule on the spoke's NSG from `value`, written with `field` (singular or plural)."""

    def change(doc: Doc) -> None:
        nsg = of(doc, "azure-native:network:NetworkSecurityGroup", "spoke")[0]
        nsg["inputs"]["securityRules"].append(
            {
                "name": "web",
                "priority": 110,
                "direction": direction,
                "access": access,
                "protocol": "Tcp",
                field: value,
                "destinationPortRange": "443",
            }
        )

    return change


def allow_as_security_rule(doc: Doc) -> None:
    """The same Allow, but as a separate SecurityRule resource attached to the NSG."""
    nsg = of(doc, "azure-native:network:NetworkSecurityGroup", "spoke")[0]
    doc["resources"].append(
        {
            "urn": nsg["urn"] + "-ssh",
            "type": "azure-native:network:SecurityRule",
            "name": "ssh",
            "custom": True,
            "parent": nsg["parent"],
            "dependencies": [],
            "inputs": {
                "securityRuleName": "ssh",
                "networkSecurityGroupName": nsg["inputs"]["networkSecurityGroupName"],
                "resourceGroupName": nsg["inputs"].get("resourceGroupName", ""),
                "priority": 120,
                "direction": "Inbound",
                "access": "Allow",
                "protocol": "Tcp",
                "sourceAddressPrefix": "Internet",
                "destinationPortRange": "22",
            },
        }
    )


def inline_route_to_the_internet(doc: Doc) -> None:
    """A route written inside the hub's route table, sending the service range out to the internet."""
    table = of(doc, "azure-native:network:RouteTable")[0]
    service = next(r for r in of(doc, "azure-native:network:Route"))["inputs"]["addressPrefix"]
    table["inputs"]["routes"] = [{"name": "leak", "addressPrefix": service, "nextHopType": "Internet"}]


def more_specific_route_elsewhere(doc: Doc) -> None:
    """Half the service range on its own, more specific (so winning) route to the internet."""
    route = next(r for r in of(doc, "azure-native:network:Route"))
    half = str(next(ipaddress.ip_network(route["inputs"]["addressPrefix"]).subnets(1)))
    doc["resources"].append(
        {
            **route,
            "urn": route["urn"] + "-half",
            "inputs": {
                **route["inputs"],
                "addressPrefix": half,
                "nextHopType": "Internet",
                "nextHopIpAddress": None,
            },
        }
    )


def etcd_disk_attached_standard(doc: Doc) -> None:
    """An etcd member's data disk as a separate Disk resource of a standard SKU, attached by ID."""
    vm = of(doc, VM, "etcd_main")[0]
    disk = vm["inputs"]["storageProfile"]["dataDisks"][0]
    disk["createOption"] = "Attach"
    disk["managedDisk"] = {
        "id": "/subscriptions/x/resourceGroups/rg/providers/Microsoft.Compute/disks/etcd-0-data"
    }
    doc["resources"].append(
        {
            **vm,
            "urn": vm["urn"] + "-disk",
            "type": "azure-native:compute:Disk",
            "name": "etcd-0-data",
            "inputs": {
                "diskName": "etcd-0-data",
                "sku": {"name": "Standard_LRS"},
                "tags": vm["inputs"]["tags"],
            },
        }
    )


def inline_spoke_to_spoke_peering(doc: Doc) -> None:
    """A peering written inline in the spoke's VirtualNetwork, to another spoke."""
    spoke = of(doc, "azure-native:network:VirtualNetwork", "spoke")[0]
    spoke["inputs"]["virtualNetworkPeerings"] = [
        {
            "name": "to-other",
            "remoteVirtualNetwork": {
                "id": "/subscriptions/x/resourceGroups/rg-other/providers/Microsoft.Network/virtualNetworks/vnet-other"
            },
        }
    ]


def route_to_wrong_hop(doc: Doc) -> None:
    of(doc, "azure-native:network:Route")[0]["inputs"]["nextHopIpAddress"] = "10.0.0.200"


def nat_forwarding_off(doc: Doc) -> None:
    of(doc, NIC, "nat_host")[0]["inputs"]["enableIPForwarding"] = False


def drop_a_pod_ip(doc: Doc) -> None:
    gpu_vmss(doc)["inputs"]["virtualMachineProfile"]["networkProfile"]["networkInterfaceConfigurations"][0][
        "ipConfigurations"
    ].pop()


def vnet_over_ip_limit(doc: Doc) -> None:
    vmss = gpu_vmss(doc)
    vmss["inputs"]["tags"]["max"] = "999"
    nic = vmss["inputs"]["virtualMachineProfile"]["networkProfile"]["networkInterfaceConfigurations"][0]
    first = nic["ipConfigurations"][1]
    nic["ipConfigurations"] += [{**first, "name": f"pod-x{i}"} for i in range(80)]
    vmss["inputs"]["tags"]["superkube-pod-ips"] = str(len(nic["ipConfigurations"]) - 1)


def nic_over_ip_limit(doc: Doc) -> None:
    nic = gpu_vmss(doc)["inputs"]["virtualMachineProfile"]["networkProfile"][
        "networkInterfaceConfigurations"
    ][0]
    first = nic["ipConfigurations"][1]
    nic["ipConfigurations"] += [{**first, "name": f"pod-y{i}"} for i in range(300)]


def overlapping_subnet(doc: Doc) -> None:
    subnets = [
        s
        for s in of(doc, "azure-native:network:Subnet")
        if s["inputs"]["subnetName"] in ("etcd-main", "etcd-events")
    ]
    subnets[1]["inputs"]["addressPrefix"] = subnets[0]["inputs"]["addressPrefix"]


def password_login(doc: Doc) -> None:
    profile = of(doc, VM, "etcd_main")[0]["inputs"]["osProfile"]
    profile["linuxConfiguration"]["disablePasswordAuthentication"] = False
    profile["adminPassword"] = "correct horse battery staple"


def scale_set_over_vm_limit(doc: Doc) -> None:
    gpu_vmss(doc)["inputs"]["tags"]["max"] = "1200"


def remove_preflight_taint(doc: Doc) -> None:
    def strip(text: str) -> str:  # the preflight taint out of the list, whatever else it holds
        text = text.replace("superkube.io/preflight=pending:NoSchedule,", "")
        text = text.replace(",superkube.io/preflight=pending:NoSchedule", "")
        return text.replace(" --register-with-taints=superkube.io/preflight=pending:NoSchedule", "")

    rewrite_cloud_init(gpu_vmss(doc), "/etc/default/kubelet", strip)


def remove_autoscaler_discovery(doc: Doc) -> None:
    del gpu_vmss(doc)["inputs"]["tags"]["cluster-autoscaler-enabled"]


def strip_apiserver_identity(doc: Doc) -> None:
    """The API server that runs cluster-autoscaler loses the identity it resizes scale sets as."""
    of(doc, VM, "apiservers")[0]["inputs"].pop("identity")


def standard_etcd_disk(doc: Doc) -> None:
    of(doc, VM, "etcd_events")[0]["inputs"]["storageProfile"]["dataDisks"][0]["managedDisk"][
        "storageAccountType"
    ] = "Standard_LRS"


def no_join_jitter(doc: Doc) -> None:
    rewrite_cloud_init(
        gpu_vmss(doc),
        "/usr/local/sbin/superkube-join",
        lambda t: "\n".join(line for line in t.splitlines() if "sleep" not in line),
    )


def no_terminate_notification(doc: Doc) -> None:
    """A scale set that deletes a VM under a running job: no Terminate notice to drain it for."""
    gpu_vmss(doc)["inputs"]["virtualMachineProfile"].pop("scheduledEventsProfile")


def no_os_image_notification(doc: Doc) -> None:
    """A scale set whose reimage or OS upgrade replaces a node's OS disk with no scheduled event first."""
    events = gpu_vmss(doc)["inputs"]["virtualMachineProfile"]["scheduledEventsProfile"]
    events["osImageNotificationProfile"]["enable"] = False


VIRTUAL_MACHINE_CONTRIBUTOR = "9980e02c-c2be-4d73-94e8-173b1dc7cf3c"  # Azure's built-in role ID


def builtin_contributor_on_the_group(doc: Doc) -> None:
    """The autoscaler's identity given Virtual Machine Contributor on the group instead of its custom role."""
    (assignment,) = [r for r in of(doc, ROLE_ASSIGNMENT) if r["name"].endswith("-autoscaler-role")]
    subscription = assignment["inputs"]["scope"].split("/resourceGroups/")[0]
    assignment["inputs"]["roleDefinitionId"] = (
        f"{subscription}/providers/Microsoft.Authorization/roleDefinitions/{VIRTUAL_MACHINE_CONTRIBUTOR}"
    )


def join_token_in_custom_data(doc: Doc) -> None:
    """A bootstrap kubeconfig planned into a scale set's custom data (and so kept in Pulumi's state)."""
    vmss = gpu_vmss(doc)
    profile = vmss["inputs"]["virtualMachineProfile"]["osProfile"]
    text = base64.b64decode(profile["customData"]).decode()
    kubeconfig = join.bootstrap_kubeconfig("https://10.0.0.4:6443", "CA", join.new_token(), "flagship")
    profile["customData"] = base64.b64encode(join.with_credentials(text, kubeconfig).encode()).decode()


def missing_owner_tag(doc: Doc) -> None:
    del of(doc, "azure-native:network:VirtualNetwork", "hub")[0]["inputs"]["tags"]["owner"]


def move_apiserver_lb(doc: Doc) -> None:
    lb = of(doc, "azure-native:network:LoadBalancer")[0]
    lb["inputs"]["frontendIPConfigurations"][0]["privateIPAddress"] = "10.64.255.250"


def service_route_elsewhere(doc: Doc) -> None:
    (route,) = [
        r
        for r in of(doc, "azure-native:network:Route")
        if r["inputs"].get("nextHopType") == "VirtualAppliance"
    ]
    route["inputs"]["addressPrefix"] = "10.129.0.0/16"


def one_pod_ip_fewer(doc: Doc) -> None:
    profile = gpu_vmss(doc)["inputs"]["virtualMachineProfile"]
    profile["networkProfile"]["networkInterfaceConfigurations"][0]["ipConfigurations"].pop()


def node_template_label_differs(doc: Doc) -> None:
    gpu_vmss(doc)["inputs"]["tags"]["k8s.io_cluster-autoscaler_node-template_label_superkube.io_pool"] = (
        "other"
    )


def cloud_init_label_differs(doc: Doc) -> None:
    rewrite_cloud_init(
        gpu_vmss(doc),
        "/etc/default/kubelet",
        lambda t: t.replace("superkube.io/pool=", "superkube.io/pool=x"),
    )


def scale_set_of_another_cluster(doc: Doc) -> None:
    gpu_vmss(doc)["inputs"]["tags"]["cluster"] = "another"


def move_a_store_host(doc: Doc) -> None:
    """One metrics store host's NIC at another address than the plan gave the inventory."""
    (nic,) = [
        n for n in of(doc, NIC) if n["inputs"].get("networkInterfaceName", "").startswith("nic-metrics-")
    ][:1]
    nic["inputs"]["ipConfigurations"][0]["privateIPAddress"] = "10.65.16.77"


def drop_the_serving_approver(doc: Doc) -> None:
    """The in-cluster layer without the kubelets' serving-certificate approver."""
    doc["resources"] = [
        r for r in doc["resources"]
        if not (r["type"] == "kubernetes:apps/v1:Deployment"
                and r["inputs"]["metadata"]["name"] == serving_certs.NAME)
    ]  # fmt: skip


def dns_service_elsewhere(doc: Doc) -> None:
    """The layer's DNS Service at another address of the service range than the kubelets'."""
    (service,) = [
        r for r in of(doc, "kubernetes:core/v1:Service") if r["inputs"]["metadata"]["name"] == dns.SERVICE
    ]
    service["inputs"]["spec"]["clusterIP"] = "10.128.0.53"


def drop_the_dns_deployment(doc: Doc) -> None:
    """The layer's DNS Service with no CoreDNS behind it."""
    doc["resources"] = [
        r for r in doc["resources"]
        if not (r["type"] == "kubernetes:apps/v1:Deployment" and r["inputs"]["metadata"]["name"] == dns.NAME)
    ]  # fmt: skip


# rule -> the single change that must make it fire
BY_RULE: dict[str, Callable[[Doc], None]] = {
    "topology-apiserver-count": drop_one_apiserver,
    "topology-etcd-main-quorum": drop_one_etcd_main,
    "topology-etcd-events-present": drop_events_etcd,
    "topology-etcd-events-separate": events_on_main_subnet,
    "topology-controlplane-not-on-gpu": apiserver_on_gpu_size,
    "network-peering-hub-only": peer_two_spokes,
    "network-nic-no-public-ip": add_public_ip,
    "network-nsg-deny-internet-inbound": allow_ssh_from_internet,
    "network-route-service-cidr-via-nat": route_to_wrong_hop,
    "network-nic-nat-ip-forwarding": nat_forwarding_off,
    "network-vmss-alias-ip-count": drop_a_pod_ip,
    "network-vnet-ip-limit": vnet_over_ip_limit,
    "network-nic-ip-limit": nic_over_ip_limit,
    "network-subnet-no-overlap": overlapping_subnet,
    "compute-vm-no-password-login": password_login,
    "compute-vmss-vm-limit": scale_set_over_vm_limit,
    "compute-vmss-preflight-taint": remove_preflight_taint,
    "compute-vmss-autoscaler-tags": remove_autoscaler_discovery,
    "compute-autoscaler-identity-on-apiservers": strip_apiserver_identity,
    "compute-disk-etcd-premium": standard_etcd_disk,
    "compute-vmss-join-jitter": no_join_jitter,
    "compute-vmss-custom-data-no-credentials": join_token_in_custom_data,
    "compute-vmss-terminate-notification": no_terminate_notification,
    "iam-role-assignment-no-builtin-contributor": builtin_contributor_on_the_group,
    "hygiene-resource-required-tags": missing_owner_tag,
    "wiring-apiserver-endpoint": move_apiserver_lb,
    "wiring-service-cidr": service_route_elsewhere,
    "wiring-kubelet-max-pods": one_pod_ip_fewer,
    "wiring-node-registration": node_template_label_differs,
    "wiring-cluster-name": scale_set_of_another_cluster,
}
# network-peering-group-ip-limit is caught by its config (other clusters' spokes), see test_rules.py;
# wiring-etcd-urls and wiring-component-config by the Ansible side (the plan's etcd hosts are the
# inventory's; configs come from the roles), see test_wiring.py
