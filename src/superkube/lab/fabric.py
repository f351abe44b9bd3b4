"""The lab's network, as Azure's fabric is to a VNet: where each host sits in the flagship's address
plan, the switch namespace that routes between the plan's subnets (and applies the hub's route
table), each host's own namespace, its NIC's secondary (pod) IPs, and the instance metadata the
switch answers.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterable
from ipaddress import IPv4Address, IPv4Network
from pathlib import Path
from typing import Any

from superkube.cluster import cloudinit
from superkube.cluster.inventory import cluster_facts
from superkube.cluster.kube import (
    APISERVERS,
    CPU_NODES,
    ETCD_EVENTS,
    ETCD_MAIN,
    GPU_NODES,
    GROUPS,
    MONITORING,
    NAT_HOST,
)
from superkube.lab.errors import LabError
from superkube.lab.state import LAB_STACK, SWITCH, Host, Lab, run
from superkube.model.ipam import FIRST_HOST_OFFSET

INTERNET = IPv4Network("198.18.0.0/24")  # benchmarking range: outside every cluster CIDR


MAX_HOSTS = 40


HOST_GROUPS = (*GROUPS, MONITORING)  # groups --hosts may ask for: the cluster's and the monitoring hosts


def parse_hosts(text: str | int) -> int | dict[str, int]:
    """`--hosts`: a count ("8") or counts per group ("etcd_main=5,etcd_events=3")."""
    text = str(text).strip()
    if text.isdigit():
        if not 1 <= int(text) <= MAX_HOSTS:
            raise LabError(f"--hosts {text}: give 1 to {MAX_HOSTS} hosts")
        return int(text)
    counts: dict[str, int] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        group, _, count = part.partition("=")
        if group not in HOST_GROUPS or not count.isdigit():
            raise LabError(
                f"--hosts {text!r}: {part!r} is not GROUP=COUNT; groups are {', '.join(HOST_GROUPS)}, "
                "e.g. --hosts etcd_main=5,etcd_events=3"
            )
        counts[group] = int(count)
    if not 1 <= sum(counts.values()) <= MAX_HOSTS:
        raise LabError(f"--hosts {text!r}: give 1 to {MAX_HOSTS} hosts in all")
    return counts


def groups_of(nodes: int | dict[str, int]) -> list[str]:
    """The group of each cluster host, in boot order."""
    if isinstance(nodes, dict):
        return [g for g in HOST_GROUPS for _ in range(nodes.get(g, 0))]
    return [GROUPS[i] if i < len(GROUPS) else (GPU_NODES, CPU_NODES)[i % 2] for i in range(nodes)]


def layout(nodes: int | dict[str, int]) -> tuple[list[Host], list[str], dict[str, Any]]:
    """Hosts placed by the flagship stack's address plan: (hosts, routed subnets, network facts)."""
    from superkube.plan import engine as planning

    nodes = parse_hosts(nodes) if not isinstance(nodes, dict) else nodes
    root = planning.find_project()
    _, spec, addresses = planning.load(root, LAB_STACK)
    by_group = {
        ETCD_MAIN: addresses.subnet("etcd-main"),
        ETCD_EVENTS: addresses.subnet("etcd-events"),
        APISERVERS: addresses.subnet(APISERVERS),
    }
    # control-plane hosts take the plan's own member IPs (not the load balancer's frontend)
    members = {
        ETCD_MAIN: list(addresses.etcd_main_ips),
        ETCD_EVENTS: list(addresses.etcd_events_ips),
        APISERVERS: list(addresses.apiserver_ips),
    }
    used: dict[str, int] = {}
    hosts: list[Host] = []

    def place(name: str, group: str, net: IPv4Network, address: IPv4Address | None = None) -> None:
        if address is None:
            index = used.get(str(net), 0)
            used[str(net)] = index + 1
            address = net.network_address + FIRST_HOST_OFFSET + index
            if address >= net.broadcast_address:
                raise LabError(f"subnet {net} holds no more lab hosts; use fewer --hosts")
        hosts.append(Host(name, group, str(address), net.prefixlen, str(net.network_address + 1)))

    pools = {
        role: next(p.name for p in spec.node_pools if p.role == role)
        for role in ("gpu", "cpu")
        if any(p.role == role for p in spec.node_pools)
    }
    counts: dict[str, int] = {}
    for group in groups_of(nodes):
        counts[group] = counts.get(group, 0) + 1
        name = f"{group.removesuffix('_nodes').replace('_', '-')}-{counts[group]}"
        if group == MONITORING:
            # beside the hub client: reaches every cluster subnet as the hub does
            place(name, group, addresses.subnet("shared").cidr)
        elif group == NAT_HOST:
            if counts[group] > 1:
                raise LabError(f"--hosts: the {LAB_STACK} plan has one NAT host; ask for nat_host=1")
            place("nat", group, addresses.subnet("nat").cidr, addresses.nat_host_ip)
        elif group in members:
            if not members[group]:
                raise LabError(
                    f"--hosts: the {LAB_STACK} plan has {counts[group] - 1} {group} members; ask for no more"
                )
            place(name, group, by_group[group].cidr, members[group].pop(0))
        else:
            place(name, group, addresses.subnet(f"{pools[group.removesuffix('_nodes')]}-0").cidr)
            hosts[-1].pool = pools[group.removesuffix("_nodes")]
    place("hub-client", "hub", addresses.subnet("shared").cidr)
    place("internet", "internet", INTERNET)
    subnets = sorted({f"{IPv4Network((h.address, h.prefixlen), strict=False)}" for h in hosts})
    facts: dict[str, Any] = {
        "facts": cluster_facts(spec, addresses),
        # The hub's route table in Azure: from the shared subnet, the service CIDR goes to the NAT host.
        "route_tables": [
            [str(addresses.subnet("shared").cidr), spec.service_cidr, str(addresses.nat_host_ip)]
        ]
        if any(h.group == NAT_HOST for h in hosts)
        else [],
    }
    return hosts, subnets, facts


def ensure_route_tables(route_tables: Iterable[list[str]]) -> None:
    """Azure applies a route table per subnet; the switch does the same with source rules."""
    for table, (source, prefix, via) in enumerate(route_tables, start=100):
        run(["ip", "-n", SWITCH, "route", "add", prefix, "via", via, "table", str(table)])
        run(["ip", "-n", SWITCH, "rule", "add", "from", source, "to", prefix, "lookup", str(table)])


def ensure_switch(subnets: Iterable[str]) -> None:
    run(["ip", "netns", "add", SWITCH])
    run(["ip", "-n", SWITCH, "link", "add", "br0", "type", "bridge"])
    run(["ip", "-n", SWITCH, "link", "set", "lo", "up"])
    run(["ip", "-n", SWITCH, "link", "set", "br0", "up"])
    for cidr in subnets:
        net = IPv4Network(cidr)
        run(["ip", "-n", SWITCH, "addr", "add", f"{net.network_address + 1}/{net.prefixlen}", "dev", "br0"])
    # Azure's instance metadata address, answered from here as Azure answers it from the VM's host
    run(["ip", "-n", SWITCH, "addr", "add", "169.254.169.254/32", "dev", "lo"])
    run(["ip", "netns", "exec", SWITCH, "sysctl", "-qw", "net.ipv4.ip_forward=1"])
    # the fabric routes; it does not tell hosts to go around it
    for conf in ("all", "default", "br0"):
        run(["ip", "netns", "exec", SWITCH, "sysctl", "-qw", f"net.ipv4.conf.{conf}.send_redirects=0"])


def ensure_host_network(host: Host, index: int) -> None:
    outside, inside = f"skl{index}s", f"skl{index}h"
    host.mac = f"00:0d:3a:5b:{index // 256:02x}:{index % 256:02x}"
    run(["ip", "netns", "add", host.netns])
    run(["ip", "link", "add", inside, "address", host.mac, "type", "veth", "peer", "name", outside])
    run(["ip", "link", "set", inside, "netns", host.netns])
    run(["ip", "link", "set", outside, "netns", SWITCH])
    run(["ip", "-n", SWITCH, "link", "set", outside, "master", "br0", "up"])
    run(["ip", "-n", host.netns, "link", "set", inside, "name", "eth0"])
    address = ["ip", "-n", host.netns, "addr", "add", f"{host.address}/{host.prefixlen}", "dev", "eth0"]
    # A node reaches everything through the gateway, as an Azure VM's packets all pass the fabric
    # (which answers for the whole subnet): only so can a pod IP on another node, which no host
    # answers ARP for, be reached. Other hosts keep the plain on-link subnet.
    run([*address, "noprefixroute"] if host.is_node else address)
    run(["ip", "-n", host.netns, "link", "set", "lo", "up"])
    run(["ip", "-n", host.netns, "link", "set", "eth0", "up"])
    if host.is_node:
        run(["ip", "-n", host.netns, "route", "add", host.gateway, "dev", "eth0", "scope", "link"])
    run(["ip", "-n", host.netns, "route", "add", "default", "via", host.gateway])
    for ip in host.secondary:  # the fabric delivers a NIC's secondary IPs to that NIC
        run(["ip", "-n", SWITCH, "route", "add", f"{ip}/32", "via", host.address])


def write_imds(lab: Lab) -> Path:
    """The metadata service's documents, one per node host (it reads the file again on a change)."""
    docs = Path(lab.state_dir) / "imds.json"
    part = docs.with_name("imds.json.part")
    part.write_text(json.dumps(imds_documents(lab), indent=2))
    part.replace(docs)
    return docs


def start_imds(lab: Lab) -> None:
    """The metadata service in the switch namespace (ended with the namespace by `down`)."""
    docs = write_imds(lab)
    launcher = 'exec "$@" >>"$SUPERKUBE_LAB_LOG" 2>&1 </dev/null &\necho $!'
    command = ["ip", "netns", "exec", SWITCH, sys.executable, "-m", "superkube.lab.imds", str(docs)]
    subprocess.run(
        ["setsid", "sh", "-c", launcher, "sh", *command],
        capture_output=True,
        text=True,
        env={**os.environ, "SUPERKUBE_LAB_LOG": str(Path(lab.state_dir) / "imds.log")},
        check=True,
        timeout=30,
    )
    deadline = time.monotonic() + 10
    probe = ["ip", "netns", "exec", SWITCH, "nc", "-z", "169.254.169.254", "80"]
    while run(probe, check=False).returncode != 0:
        if time.monotonic() > deadline:
            raise LabError(
                f"the lab's metadata service did not start; see {Path(lab.state_dir) / 'imds.log'}"
            )
        time.sleep(0.1)


def pool_facts(
    project: Path | None = None,
) -> tuple[dict[str, dict[str, list[str]]], dict[str, dict[str, Any]]]:
    """From the plan of the lab's stack, per pool (its first scale set): what cloud-init writes on a
    node (the custom data, decoded, so lab nodes register exactly as the plan's do), and what Azure
    would tell the node about itself: the scale set, its tags and how many secondary IPs its NIC
    configuration holds."""
    from superkube.plan import engine as planning

    recorded = planning.run(project or planning.find_project(), LAB_STACK)
    files_of: dict[str, dict[str, list[str]]] = {}
    pools: dict[str, dict[str, Any]] = {}
    for vmss in recorded.of_type("azure-native:compute:VirtualMachineScaleSet"):
        pool = vmss.inputs["tags"]["superkube-pool"]
        if pool in files_of:
            continue
        profile = vmss.inputs["virtualMachineProfile"]
        doc = cloudinit.decode(profile["osProfile"]["customData"])
        files = doc.get("write_files") or []
        assert isinstance(files, list)
        files_of[pool] = {f["path"]: [f["content"], f.get("permissions", "0644")] for f in files}
        nic = profile["networkProfile"]["networkInterfaceConfigurations"][0]
        pools[pool] = {
            "scale_set": vmss.inputs["vmScaleSetName"],
            "location": vmss.inputs["location"],
            "vm_size": vmss.inputs["sku"]["name"],
            "tags": dict(vmss.inputs["tags"]),
            "secondary_ips": sum(1 for c in nic["ipConfigurations"] if not c.get("primary")),
            # the plan's whole document (base64), without join credentials: the join-token publisher
            # adds them (superkube.agents.join_tokens) before instances boot from it
            "custom_data": profile["osProfile"]["customData"],
        }
    return files_of, pools


POD_IP_OFFSET = FIRST_HOST_OFFSET + MAX_HOSTS  # secondary IPs start past every host's own


def assign_secondary_ips(hosts: list[Host], pools: dict[str, dict[str, Any]]) -> None:
    """Give each node host its pool's count of secondary IPs in its subnet, past the hosts' own
    addresses, one block per host, as Azure's dynamic allocation hands out free addresses."""
    index: dict[str, int] = {}
    for h in hosts:
        if not h.is_node:
            continue
        net = IPv4Network((h.address, h.prefixlen), strict=False)
        count = pools[h.pool]["secondary_ips"]
        k = index.get(str(net), 0)
        index[str(net)] = k + 1
        first = net.network_address + POD_IP_OFFSET + k * count
        if first + count >= net.broadcast_address:
            raise LabError(f"subnet {net} holds no more pod IPs for {h.name}; use fewer --hosts")
        h.secondary = [str(first + i) for i in range(count)]


def imds_documents(lab: Lab) -> dict[str, dict[str, Any]]:
    """Each node host's instance metadata, from its pool's scale set in the plan."""
    from superkube.lab import imds

    docs = {}
    for h in lab.hosts:
        if h.is_node:
            pool = lab.pools[h.pool]
            docs[h.name] = imds.document(
                name=f"{pool['scale_set']}_{h.name}",
                scale_set=pool["scale_set"],
                location=pool["location"],
                vm_size=pool["vm_size"],
                tags=pool["tags"],
                primary=h.address,
                secondary=h.secondary,
                prefixlen=h.prefixlen,
                mac=h.mac,
            )
    return docs


def network_index(lab: Lab) -> int:
    """A veth and MAC index no host of the lab has (hosts are numbered in boot order, from 0)."""
    used = {int(h.mac.replace(":", "")[-4:], 16) for h in lab.hosts if h.mac}
    return max(used, default=-1) + 1


def free_address(lab: Lab, pool: str) -> tuple[IPv4Network, IPv4Address, list[str]]:
    """The pool's subnet (where its first host sits), a free host address in it, and a free block of
    the pool's secondary IPs, as Azure hands a new instance free addresses of its subnet."""
    peers = [h for h in lab.hosts if h.pool == pool]
    if not peers:
        raise LabError(f"the lab has no host of pool {pool!r} to place a new one beside")
    net = IPv4Network((peers[0].address, peers[0].prefixlen), strict=False)
    taken = {IPv4Address(h.address) for h in lab.hosts}
    address = next(
        (a for k in range(MAX_HOSTS) if (a := net.network_address + FIRST_HOST_OFFSET + k) not in taken), None
    )
    if address is None:
        raise LabError(f"subnet {net} holds no more lab hosts; take some away first (lab scale {pool} -N)")
    count = lab.pools[pool]["secondary_ips"]
    held = {ip for h in lab.hosts for ip in h.secondary}
    for k in range(4096):
        first = net.network_address + POD_IP_OFFSET + k * count
        if first + count >= net.broadcast_address:
            break
        block = [str(first + i) for i in range(count)]
        if not held & set(block):
            return net, address, block
    raise LabError(f"subnet {net} holds no more pod IPs for another {pool} instance")
