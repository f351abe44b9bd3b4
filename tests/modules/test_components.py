"""Per component, on the real program recorded under the mock engine."""

from __future__ import annotations

import ipaddress
import shlex
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from modules.compute.node_pool import CUSTOM_DATA_PROPERTY
from superkube.agents import scale_governor
from superkube.cluster import cloudinit
from superkube.model.policy import TAGLESS_TYPES
from superkube.plan import engine as planning
from superkube.plan.engine import Plan, Resource
from tests.conftest import ROOT, dev_config

VMSS = "azure-native:compute:VirtualMachineScaleSet"
VM = "azure-native:compute:VirtualMachine"
NIC = "azure-native:network:NetworkInterface"
PEERING = "azure-native:network:VirtualNetworkPeering"
VNET = "azure-native:network:VirtualNetwork"
SUBNET = "azure-native:network:Subnet"
REQUIRED_TAGS = {"cluster", "owner", "environment"}


def parent_type(plan: Plan, r: Resource) -> str:
    assert r.parent is not None, f"{r.name} has no parent"
    if r.parent.endswith(f"pulumi:pulumi:Stack::superkube-{plan.stack}"):
        return "pulumi:pulumi:Stack"
    return plan.by_urn(r.parent).type


def role_of(r: Resource) -> str:
    return r.inputs["tags"]["superkube-role"]


def test_every_resource_has_a_superkube_component_parent(any_plan: Plan) -> None:
    for r in any_plan.resources:
        expected_root = r.type == "superkube:cluster:Cluster"
        if expected_root:
            assert parent_type(any_plan, r) == "pulumi:pulumi:Stack"
        else:
            assert parent_type(any_plan, r).startswith("superkube:"), r.urn


@pytest.mark.parametrize(
    ("child", "parent"),
    [
        (VNET, {"superkube:network:Hub", "superkube:network:Spoke"}),
        (SUBNET, {"superkube:network:Hub", "superkube:network:Spoke"}),
        (PEERING, {"superkube:network:Spoke"}),
        ("azure-native:network:Route", {"superkube:network:NatHost"}),
        ("azure-native:network:LoadBalancer", {"superkube:control_plane:ApiServers"}),
        (VMSS, {"superkube:compute:NodePool"}),
        (VM, {"superkube:compute:Machine"}),
        (NIC, {"superkube:compute:Machine"}),
        (
            "superkube:compute:Machine",
            {
                "superkube:network:NatHost",
                "superkube:control_plane:ApiServers",
                "superkube:control_plane:EtcdCluster",
                "superkube:compute:MonitoringHosts",
            },
        ),
    ],
)
def test_resource_types_live_in_their_component(any_plan: Plan, child: str, parent: set[str]) -> None:
    resources = any_plan.of_type(child)
    assert resources, f"no {child} recorded"
    assert {parent_type(any_plan, r) for r in resources} <= parent


def test_every_taggable_resource_has_the_required_tags(any_plan: Plan) -> None:
    taggable = [
        r
        for r in any_plan.resources
        if r.custom and r.type.startswith("azure-native:") and r.type not in TAGLESS_TYPES
    ]
    assert len(taggable) > 20
    for r in taggable:
        tags = r.inputs.get("tags") or {}
        assert set(tags) >= REQUIRED_TAGS, f"{r.name} lacks {REQUIRED_TAGS - set(tags)}"
        assert tags["cluster"] == any_plan.cluster


def test_no_public_ip_anywhere(any_plan: Plan) -> None:
    assert not any("PublicIP" in r.type for r in any_plan.resources)
    for nic in any_plan.of_type(NIC):
        for ipc in nic.inputs["ipConfigurations"]:
            assert "publicIPAddress" not in ipc
    for vmss in any_plan.of_type(VMSS):
        for nic in vmss.inputs["virtualMachineProfile"]["networkProfile"]["networkInterfaceConfigurations"]:
            for ipc in nic["ipConfigurations"]:
                assert "publicIPAddressConfiguration" not in ipc


def test_ssh_keys_only(any_plan: Plan) -> None:
    profiles = [r.inputs["osProfile"] for r in any_plan.of_type(VM)]
    profiles += [r.inputs["virtualMachineProfile"]["osProfile"] for r in any_plan.of_type(VMSS)]
    assert profiles
    for p in profiles:
        assert "adminPassword" not in p
        linux = p["linuxConfiguration"]
        assert linux["disablePasswordAuthentication"] is True
        assert linux["ssh"]["publicKeys"][0]["keyData"] == any_plan.spec.ssh_public_key


def test_ip_configurations_per_nic_are_pod_ips_plus_one(any_plan: Plan) -> None:
    pools = {p.name: p for p in any_plan.spec.node_pools}
    for vmss in any_plan.of_type(VMSS):
        pool = pools[vmss.inputs["tags"]["superkube-pool"]]
        nics = vmss.inputs["virtualMachineProfile"]["networkProfile"]["networkInterfaceConfigurations"]
        assert len(nics) == 1
        ipcs = nics[0]["ipConfigurations"]
        assert len(ipcs) == pool.pod_ips_per_node + 1
        assert [c["primary"] for c in ipcs].count(True) == 1
        assert len({c["subnet"]["id"] for c in ipcs}) == 1, "pod IPs share the node's subnet"
        assert len({c["name"] for c in ipcs}) == len(ipcs)


def test_pools_split_into_scale_sets_within_the_vm_limit(flagship_plan: Plan) -> None:
    sets = flagship_plan.of_type(VMSS)
    assert len(sets) > 7
    gpu = [s for s in sets if s.inputs["tags"]["superkube-pool"] == "gpu"]
    maxima = [int(s.inputs["tags"]["superkube-capacity"]) for s in gpu]
    assert len(gpu) == 8 and sum(maxima) == 7_500 and max(maxima) <= 1_000
    assert max(maxima) - min(maxima) <= 1, "balanced split"
    for s in sets:
        assert s.inputs["singlePlacementGroup"] is False
        assert s.inputs["sku"]["capacity"] <= int(s.inputs["tags"]["max"])


def test_governed_scale_sets_start_one_refresh_of_room_above_their_mins(any_plan: Plan) -> None:
    """With the scale-up governor, a set's first max tag is its min plus a share of one refresh's
    room, and `pulumi up` leaves the tag to the governor afterwards; the autoscaler's first look
    cannot see a pool's whole capacity."""
    sets = any_plan.of_type(VMSS)
    room = scale_governor.budget(any_plan.spec.safe_join_rate_per_minute)
    opened = 0
    for s in sets:
        tags = s.inputs["tags"]
        low, high, capacity = int(tags["min"]), int(tags["max"]), int(tags["superkube-capacity"])
        assert low <= high <= capacity, s.name
        opened += high - low
        assert s.ignore_changes == ("sku.capacity", 'tags["max"]', CUSTOM_DATA_PROPERTY), s.name
    assert 0 < opened <= room


def test_autoscaler_tags_let_every_pool_scale_from_zero(any_plan: Plan) -> None:
    for s in any_plan.of_type(VMSS):
        tags = s.inputs["tags"]
        assert tags["cluster-autoscaler-enabled"] == "true"
        assert tags["cluster-autoscaler-name"] == any_plan.cluster
        assert int(tags["min"]) <= int(tags["max"])
        assert (
            tags["k8s.io_cluster-autoscaler_node-template_label_superkube.io_pool"] == tags["superkube-pool"]
        )
        if role_of(s) == "gpu_nodes":
            assert tags["min"] == "0"
            assert (
                tags["k8s.io_cluster-autoscaler_node-template_taint_superkube.io_preflight"]
                == "pending:NoSchedule"
            )
            assert int(tags["k8s.io_cluster-autoscaler_node-template_resources_nvidia.com_gpu"]) >= 1


def test_pool_minimum_is_split_over_its_scale_sets(flagship_plan: Plan) -> None:
    from superkube.model.ipam import plan_addresses
    from superkube.model.spec import from_config

    config = {k.partition(":")[2]: v for k, v in flagship_plan.config.items()}
    config["node_pools"] = (
        config["node_pools"]
        .replace("min_nodes: 16", "min_nodes: 17")
        .replace("nodes: 128", "nodes: 1500")
        .replace("pod_ips_per_node: 30", "pod_ips_per_node: 1")
    )
    addresses = plan_addresses(from_config(config), "flagship")
    cpu = addresses.pool_scale_sets("cpu")
    assert [s.capacity for s in cpu] == [750, 750]
    assert [s.min_nodes for s in cpu] == [9, 8]
    for pool in flagship_plan.spec.node_pools:
        sets = [s for s in flagship_plan.of_type(VMSS) if s.inputs["tags"]["superkube-pool"] == pool.name]
        assert sum(int(s.inputs["tags"]["min"]) for s in sets) == pool.min_nodes
        assert all(s.inputs["sku"]["capacity"] == int(s.inputs["tags"]["min"]) for s in sets)


def test_gpu_nodes_register_behind_the_preflight_taint_after_a_jitter(any_plan: Plan) -> None:
    for s in any_plan.of_type(VMSS):
        doc = cloudinit.decode(s.inputs["virtualMachineProfile"]["osProfile"]["customData"])
        files = {f["path"]: f["content"] for f in doc["write_files"]}  # type: ignore[index]
        kubelet = files["/etc/default/kubelet"]
        join = files["/usr/local/sbin/superkube-join"]
        assert f"shuf -i 0-{any_plan.spec.autoscaler_join_jitter_seconds} -n 1" in join
        assert join.index("sleep") < join.index("systemctl enable --now kubelet")
        if role_of(s) == "gpu_nodes":
            assert "--register-with-taints=superkube.io/preflight=pending:NoSchedule" in kubelet
            assert "superkube.io/preflight=pending" in kubelet.split("--node-labels=")[1]
        else:
            assert "preflight" not in kubelet


def test_each_pools_nodes_register_with_their_teams_taint_and_the_template_says_so(any_plan: Plan) -> None:
    """A node is its team's from registration, and the autoscaler's template carries the same taint:
    a template without it would plan a pending pod onto a node that the team reconciler then taints
    against the pod. The team is the one the reconciler computes from the node's labels once joined."""
    from superkube.model import teams

    spec = any_plan.spec
    assert spec.teams, f"{any_plan.stack} has no teams: nothing here would be shown"
    for s in any_plan.of_type(VMSS):
        pool = next(p for p in spec.node_pools if p.name == s.inputs["tags"]["superkube-pool"])
        doc = cloudinit.decode(s.inputs["virtualMachineProfile"]["osProfile"]["customData"])
        kubelet = next(f["content"] for f in doc["write_files"] if f["path"] == "/etc/default/kubelet")  # type: ignore[index]
        (args,) = shlex.split(kubelet.split("KUBELET_EXTRA_ARGS=", 1)[1])
        flags = dict(a.removeprefix("--").split("=", 1) for a in args.split())
        registered = dict(pair.split("=", 1) for pair in flags["node-labels"].split(","))
        taints = set(filter(None, flags.get("register-with-taints", "").split(",")))
        joined = {**registered, "kubernetes.io/hostname": "x", "topology.kubernetes.io/zone": "1"}
        team = teams.owner(spec.teams, joined)
        assert team == spec.pool_team(pool, any_plan.cluster)
        tag = s.inputs["tags"].get("k8s.io_cluster-autoscaler_node-template_taint_superkube.io_team")
        team_taints = {t for t in taints if t.startswith("superkube.io/team=")}
        if team is None:
            assert not team_taints and tag is None
        else:
            assert team_taints == {f"superkube.io/team={team}:NoSchedule"}
            assert tag == f"{team}:NoSchedule"


def test_peering_only_between_hub_and_spoke(any_plan: Plan) -> None:
    peerings = any_plan.of_type(PEERING)
    hub = f"vnet-{any_plan.cluster}-hub"
    spoke = f"vnet-{any_plan.cluster}"
    pairs = {
        (p.inputs["virtualNetworkName"], p.inputs["remoteVirtualNetwork"]["id"].rsplit("/", 1)[1])
        for p in peerings
    }
    assert pairs == {(hub, spoke), (spoke, hub)}
    for p in peerings:
        assert p.inputs["allowForwardedTraffic"] is True
        assert p.inputs["useRemoteGateways"] is False


def test_service_cidr_route_goes_via_the_nat_host(any_plan: Plan) -> None:
    (route,) = any_plan.of_type("azure-native:network:Route")
    nat_vm = [v for v in any_plan.of_type(VM) if role_of(v) == "nat_host"]
    (nat_nic,) = [n for n in any_plan.of_type(NIC) if role_of(n) == "nat_host"]
    assert len(nat_vm) == 1
    nat_ip = nat_nic.inputs["ipConfigurations"][0]["privateIPAddress"]
    assert route.inputs["addressPrefix"] == any_plan.spec.service_cidr
    assert route.inputs["nextHopType"] == "VirtualAppliance"
    assert route.inputs["nextHopIpAddress"] == nat_ip
    assert nat_nic.inputs["enableIPForwarding"] is True
    # the route's table is the one on the hub's shared subnet
    (table,) = any_plan.of_type("azure-native:network:RouteTable")
    shared = next(
        s
        for s in any_plan.of_type(SUBNET)
        if s.inputs["subnetName"] == "shared" and "hub" in s.inputs["virtualNetworkName"]
    )
    assert shared.inputs["routeTable"]["id"].endswith(f"/routeTables/{table.inputs['routeTableName']}")
    assert route.inputs["routeTableName"] == table.inputs["routeTableName"]
    # and the NAT host sits in the hub
    nat_subnet = nat_nic.inputs["ipConfigurations"][0]["subnet"]["id"]
    assert f"/virtualNetworks/vnet-{any_plan.cluster}-hub/subnets/nat" in nat_subnet


def test_five_api_servers_behind_an_internal_load_balancer(flagship_plan: Plan) -> None:
    apis = [v for v in flagship_plan.of_type(VM) if role_of(v) == "apiservers"]
    assert len(apis) == 5
    (lb,) = flagship_plan.of_type("azure-native:network:LoadBalancer")
    frontend = lb.inputs["frontendIPConfigurations"][0]
    assert "publicIPAddress" not in frontend and frontend["privateIPAddress"]
    rule = lb.inputs["loadBalancingRules"][0]
    assert (rule["frontendPort"], rule["backendPort"]) == (6443, 6443)
    pool_id = rule["backendAddressPool"]["id"]
    api_nics = [n for n in flagship_plan.of_type(NIC) if role_of(n) == "apiservers"]
    assert len(api_nics) == 5
    for nic in api_nics:
        assert nic.inputs["ipConfigurations"][0]["loadBalancerBackendAddressPools"][0]["id"] == pool_id
    # the probe the lab's load balancer copies: /readyz over TLS, one failure out, one success back,
    # and every server kept when all fail at once (an events etcd outage makes each one unready)
    (probe,) = lb.inputs["probes"]
    assert probe == {
        "name": "apiserver-readyz",
        "protocol": "Https",
        "port": 6443,
        "requestPath": "/readyz",
        "intervalInSeconds": 5,
        "probeThreshold": 1,
        "noHealthyBackendsBehavior": "AllProbedUp",
    }
    assert rule["probe"]["id"].endswith("/probes/apiserver-readyz") and rule["idleTimeoutInMinutes"] == 30


def test_etcd_main_and_events_are_separate_vms_with_premium_data_disks(any_plan: Plan) -> None:
    main = [v for v in any_plan.of_type(VM) if role_of(v) == "etcd_main"]
    events = [v for v in any_plan.of_type(VM) if role_of(v) == "etcd_events"]
    assert len(main) == any_plan.spec.etcd_main_count and len(events) == any_plan.spec.etcd_events_count
    assert not {v.inputs["vmName"] for v in main} & {v.inputs["vmName"] for v in events}
    for v in main + events:
        (disk,) = v.inputs["storageProfile"]["dataDisks"]
        assert disk["managedDisk"]["storageAccountType"] in (
            "Premium_LRS",
            "PremiumV2_LRS",
            "UltraSSD_LRS",
            "Premium_ZRS",
        )
        assert disk["lun"] == 0
    # each store has its own subnet, and the override names every events member
    nic_subnet = {
        n.inputs["networkInterfaceName"].removeprefix("nic-"): n.inputs["ipConfigurations"][0]
        for n in any_plan.of_type(NIC)
    }
    main_nets = {nic_subnet[v.inputs["vmName"]]["subnet"]["id"] for v in main}
    event_nets = {nic_subnet[v.inputs["vmName"]]["subnet"]["id"] for v in events}
    assert len(main_nets) == len(event_nets) == 1 and main_nets != event_nets
    override = any_plan.outputs["etcd_servers_overrides"]
    assert override.startswith("/events#")
    urls = override.removeprefix("/events#").split(";")
    assert sorted(urls) == sorted(
        f"https://{nic_subnet[v.inputs['vmName']]['privateIPAddress']}:2379" for v in events
    )


def test_control_plane_never_on_gpu_sizes_and_nodes_only_in_the_spoke(any_plan: Plan) -> None:
    gpu_sizes = {p.vm_size for p in any_plan.spec.node_pools if p.role == "gpu"}
    for v in any_plan.of_type(VM):
        assert v.inputs["hardwareProfile"]["vmSize"] not in gpu_sizes
    spoke = ipaddress.IPv4Network(any_plan.spec.spoke_address_space)
    for n in any_plan.of_type(NIC):
        ip = ipaddress.IPv4Address(n.inputs["ipConfigurations"][0]["privateIPAddress"])
        assert (ip in spoke) == (role_of(n) != "nat_host")


def test_every_machines_role_tag_is_an_inventory_group(any_plan: Plan) -> None:
    """The tag the program writes is what the inventory groups hosts by: one list, kube.MACHINE_GROUPS."""
    from superkube.cluster.kube import MACHINE_GROUPS

    machines = any_plan.of_type("azure-native:compute:VirtualMachine") + any_plan.of_type(VMSS)
    roles = {m.inputs["tags"]["superkube-role"] for m in machines}
    assert roles == set(MACHINE_GROUPS)


def test_the_autoscalers_identity_may_resize_and_tag_in_its_group_only(any_plan: Plan) -> None:
    """The autoscaler's identity on the API-server VMs holds one custom role on the cluster's resource
    group, with the pinned autoscaler's actions (and the governor's tag write where it runs), and no
    built-in role; remediation's identity holds a custom role of its own there, and nothing else."""
    from policies.rules.iam import broad_builtin_role
    from superkube.cluster import autoscaling, remediation

    roles = any_plan.of_type("azure-native:authorization:RoleAssignment")
    (group,) = [
        g for g in any_plan.of_type("azure-native:resources:ResourceGroup") if not g.name.endswith("-hub-rg")
    ]
    definitions = {
        d.name.rsplit("-", 3)[-3]: d for d in any_plan.of_type("azure-native:authorization:RoleDefinition")
    }
    assert set(definitions) == {"autoscaler", "remediation"}
    assert [r for r in roles if broad_builtin_role(r.inputs["roleDefinitionId"])] == []
    by_definition = {r.inputs["roleDefinitionId"]: r for r in roles}
    assert len(by_definition) == len(roles) == 2
    autoscaler, mine = (by_definition[definitions[k].id] for k in ("autoscaler", "remediation"))
    assert {r.inputs["scope"] for r in roles} == {group.id}
    assert mine.inputs["principalId"] != autoscaler.inputs["principalId"], "an identity of its own"
    assert any_plan.spec.autoscaler_governor
    assert definitions["autoscaler"].inputs["permissions"] == [
        {"actions": [*autoscaling.ROLE_ACTIONS, "Microsoft.Resources/tags/write"]}
    ]
    assert definitions["remediation"].inputs["permissions"] == [{"actions": list(remediation.ROLE_ACTIONS)}]
    for d in definitions.values():
        assert d.inputs["roleType"] == "CustomRole"
        assert d.inputs["assignableScopes"] == [group.id] and d.inputs["scope"] == group.id
        assert not any("*" in a for a in d.inputs["permissions"][0]["actions"])


def test_the_autoscalers_role_has_no_tag_write_without_the_governor(dev_plan: Plan) -> None:
    from superkube.cluster import autoscaling
    from superkube.model.spec import from_config

    config = {k.partition(":")[2]: v for k, v in dev_plan.config.items()}
    with_governor = from_config({**config, "autoscaler_governor": "true"})
    without = from_config({**config, "autoscaler_governor": "false"})
    assert autoscaling.role_actions(with_governor) == (
        *autoscaling.ROLE_ACTIONS,
        "Microsoft.Resources/tags/write",
    )
    assert autoscaling.role_actions(without) == autoscaling.ROLE_ACTIONS


def test_every_scale_set_announces_deletes_and_os_image_changes(any_plan: Plan) -> None:
    """A Terminate notice of the stack's minutes and an OS image notice of the one timeout Azure takes."""
    from modules.compute.node_pool import OS_IMAGE_NOTICE

    assert OS_IMAGE_NOTICE == "PT15M"
    for s in any_plan.of_type(VMSS):
        events = s.inputs["virtualMachineProfile"]["scheduledEventsProfile"]
        assert events["terminateNotificationProfile"] == {
            "enable": True,
            "notBeforeTimeout": f"PT{any_plan.spec.terminate_notice_minutes}M",
        }
        assert events["osImageNotificationProfile"] == {"enable": True, "notBeforeTimeout": "PT15M"}


def test_each_pool_kind_has_a_gallery_image_definition_and_marketplace_pools_keep_their_image(
    any_plan: Plan,
) -> None:
    (gallery,) = any_plan.of_type("azure-native:compute:Gallery")
    definitions = {
        d.inputs["identifier"]["sku"]: d for d in any_plan.of_type("azure-native:compute:GalleryImage")
    }
    assert set(definitions) == {p.role for p in any_plan.spec.node_pools}
    for kind, d in definitions.items():
        assert d.inputs["galleryName"] == gallery.inputs["galleryName"]
        assert (d.inputs["osState"], d.inputs["hyperVGeneration"], d.inputs["osType"]) == (
            "Generalized",
            "V2",
            "Linux",
        )
        assert d.inputs["identifier"] == {
            "publisher": "superkube",
            "offer": any_plan.addresses.cluster,
            "sku": kind,
        }
    for s in any_plan.of_type(VMSS):
        reference = s.inputs["virtualMachineProfile"]["storageProfile"]["imageReference"]
        assert "id" not in reference and reference["publisher"]  # the stacks' pools use marketplace images


def test_a_pool_on_a_gallery_version_boots_that_version_of_its_kinds_image(
    write_stack: Callable[..., Path],
) -> None:
    config = dev_config()
    pools = yaml.safe_load(config["superkube:node_pools"])
    pools[0]["image"] = "gallery:1.4.0"
    config["superkube:node_pools"] = yaml.safe_dump(pools)
    stack = write_stack(config)
    plan = planning.run(ROOT, str(stack))
    definitions = {
        d.inputs["identifier"]["sku"]: d for d in plan.of_type("azure-native:compute:GalleryImage")
    }
    for s in plan.of_type(VMSS):
        reference = s.inputs["virtualMachineProfile"]["storageProfile"]["imageReference"]
        if s.inputs["tags"]["superkube-pool"] == pools[0]["name"]:
            assert reference == {"id": f"{definitions[pools[0]['role']].id}/versions/1.4.0"}
        else:
            assert "id" not in reference
