"""A real node fleet on this machine: booted Debian 12 systemd machines in their own network namespaces.

Layout (nothing is added to the machine's own network namespace):

    netns sklab-switch: bridge `br0`, routing between the lab's subnets, one address per subnet
      (the .1 gateway, as in Azure) -- this is also where SSH to the hosts starts from; like the
      VNet fabric it routes each node's secondary (pod) IPs to that node and answers instance
      metadata on 169.254.169.254 (superkube.lab.imds, documents built from the plan's NICs and tags)
      and, like Azure's internal load balancer, the API servers' frontend address with its health
      probe (superkube.lab.loadbalancer)
    netns sklab-<host>: `eth0` (a veth into the bridge) with the host's address, default route
      via the gateway; systemd-nspawn boots the host inside it (--register=no --keep-unit)
    root: an overlay per host (its own upper dir over one cached, debootstrapped base image)

Hosts sit where the flagship stack's address plan puts them (GPU and CPU nodes in their pool subnets,
etcd and API servers in theirs, the NAT host and a hub client in the hub), plus one host outside
every cluster range that plays the internet. SSH keys, host keys and known_hosts are generated per
lab; Ansible reaches hosts through a ProxyCommand that enters the switch namespace.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, field
from ipaddress import IPv4Address, IPv4Network
from pathlib import Path
from typing import Any

import yaml

from superkube.cluster import cloudinit
from superkube.cluster.inventory import cluster_facts
from superkube.cluster.kube import (
    APISERVERS,
    CPU_NODES,
    ETCD_EVENTS,
    ETCD_MAIN,
    GPU_NODES,
    GROUPS,
    LAB_ONLY_KUBE_PROXY_CONFIG,
    LAB_ONLY_KUBELET_CONFIG,
    LAB_ONLY_NODE_SOFTWARE,
    MONITORING,
    NAT_HOST,
)
from superkube.lab import agent_pods, build, loadbalancer
from superkube.lab.errors import LabError
from superkube.model import vmsizes
from superkube.model.ipam import FIRST_HOST_OFFSET

PUBLISHED_MODELS = "/var/lib/superkube/join-tokens/models"
"""Where the join-token publisher on the lab's API-server hosts writes the scale sets' models (the
join_tokens role's `join_tokens_directory`): the lab's stand-in for Resource Manager's copy of them."""
PREFIX = "sklab"
SWITCH = f"{PREFIX}-switch"
STATE_DIR = Path(os.environ.get("SUPERKUBE_LAB_STATE", "/var/lib/superkube/lab"))
CACHE_DIR = Path(os.environ.get("SUPERKUBE_LAB_CACHE", "/var/cache/superkube/lab"))
SUITE = "bookworm"
# Baked into the image as production bakes them into the VM image: the lab's hosts have no route
# to a package mirror, so roles find these installed and their install tasks report ok.
BASE_PACKAGES = (
    "systemd",
    "systemd-sysv",
    "dbus",
    "openssh-server",
    "python3",
    "python3-apt",
    "python3-prometheus-client",
    "python3-yaml",  # the join-token publisher's (production's join_tokens role installs it)
    "iproute2",
    "iptables",
    "procps",
    "sudo",
    "ca-certificates",
    "curl",
    "chrony",
    "prometheus-node-exporter",
    "netcat-openbsd",
    # the standard CNI plugins (production installs the same release, pinned by checksum) and
    # iperf3 for the pod network's throughput tests
    "containernetworking-plugins",
    "iperf3",
    # the monitoring role's Prometheus and VictoriaMetrics (their own services stay off)
    "prometheus",
    "victoria-metrics",
)
IMAGE_RECIPE = 6  # bump when the image steps below change
INTERNET = IPv4Network("198.18.0.0/24")  # benchmarking range: outside every cluster CIDR
LAB_STACK = "flagship"  # hosts sit where this stack's address plan puts them
MAX_HOSTS = 40
HOST_GROUPS = (*GROUPS, MONITORING)  # groups --hosts may ask for: the cluster's and the monitoring hosts

Progress = Callable[[str, float], None]  # (what is happening, fraction done)


@dataclass
class Host:
    name: str
    group: str  # one of GROUPS, monitoring, or hub / internet
    address: str
    prefixlen: int
    gateway: str
    pid: int | None = None
    pool: str = ""  # the stack's node pool of a gpu_nodes / cpu_nodes host
    # the NIC's secondary IPs (a node's pod IPs), as Azure assigns them to the plan's pod-NNN
    # IP configurations; the switch routes each to this host
    secondary: list[str] = field(default_factory=list)
    mac: str = ""
    image: str = ""  # the root it boots from: a baked node image (superkube.lab.scaleout); "" the base image

    @property
    def is_node(self) -> bool:
        return self.group in (GPU_NODES, CPU_NODES)

    @property
    def netns(self) -> str:
        return f"{PREFIX}-{self.name}"


@dataclass
class Lab:
    hosts: list[Host]
    subnets: list[str]  # CIDRs the switch routes between (its address in each is .1)
    state_dir: str
    base_image: str
    facts: dict[str, Any] = field(default_factory=dict)  # inventory.cluster_facts of the lab's stack
    route_tables: list[list[str]] = field(default_factory=list)  # [source subnet, prefix, next hop]
    # what cloud-init writes on a node of each pool (path -> [content, mode]), from the plan
    cloud_init: dict[str, dict[str, list[str]]] = field(default_factory=dict)
    # each pool's first scale set in the plan: name, location, vm_size, tags, secondary IP count
    pools: dict[str, dict[str, Any]] = field(default_factory=dict)
    # the pinned components from the lab's build, which the roles install where production installs
    # the release artefacts: binary name -> {path (on this machine), sha256, version}
    builds: dict[str, dict[str, str]] = field(default_factory=dict)
    # the images converge imports into each node's containerd (superkube.lab.images): name -> {ref,
    # path (on this machine), sha256}
    images: dict[str, dict[str, str]] = field(default_factory=dict)

    @property
    def service_cidr(self) -> str:
        return str(self.facts.get("service_cidr", ""))

    def host(self, name: str) -> Host:
        for h in self.hosts:
            if h.name == name:
                return h
        raise LabError(f"no lab host {name!r}; lab status lists them")

    @property
    def key(self) -> Path:
        return Path(self.state_dir) / "id_ed25519"

    @property
    def known_hosts(self) -> Path:
        return Path(self.state_dir) / "known_hosts"

    @property
    def inventory(self) -> Path:
        return Path(self.state_dir) / "inventory.yml"

    def save(self) -> None:
        path = Path(self.state_dir) / "lab.json"
        path.write_text(json.dumps(asdict(self), indent=2))

    @classmethod
    def load(cls, state_dir: Path = STATE_DIR) -> Lab | None:
        path = state_dir / "lab.json"
        if not path.is_file():
            return None
        data = json.loads(path.read_text())
        data["hosts"] = [Host(**h) for h in data["hosts"]]
        return cls(**data)


# --- commands ------------------------------------------------------------------------------------


def run(
    args: list[str], *, check: bool = True, input: str | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(args, capture_output=True, text=True, input=input, timeout=timeout)
    if check and proc.returncode != 0:
        raise LabError(
            f"{' '.join(args[:4])} ... failed: {(proc.stderr or proc.stdout).strip().splitlines()[-1:] or ['no output']}"
        )
    return proc


def require_tools() -> None:
    if os.geteuid() != 0:
        raise LabError("the lab needs root (network namespaces, overlays, systemd-nspawn); run it as root")
    missing = [
        t for t in ("debootstrap", "systemd-nspawn", "ip", "ssh", "ssh-keygen") if shutil.which(t) is None
    ]
    if missing:
        raise LabError(
            f"missing {', '.join(missing)}; install them: apt-get install debootstrap systemd-container iproute2 openssh-client"
        )


def debian_mirror() -> str:
    """The Debian mirror this machine's apt uses (SUPERKUBE_LAB_MIRROR overrides it)."""
    if os.environ.get("SUPERKUBE_LAB_MIRROR"):
        return os.environ["SUPERKUBE_LAB_MIRROR"]
    candidates: list[str] = []
    for path in sorted(Path("/etc/apt/sources.list.d").glob("*.sources")):
        block: dict[str, str] = {}
        for line in [*path.read_text().splitlines(), ""]:
            if not line.strip():
                if "debian" in block.get("Suites", "") or SUITE in block.get("Suites", "").split():
                    candidates += block.get("URIs", "").split()
                block = {}
            elif ":" in line and not line.startswith("#"):
                k, _, v = line.partition(":")
                block[k.strip()] = v.strip()
    sources = Path("/etc/apt/sources.list")
    if sources.is_file():
        for line in sources.read_text().splitlines():
            parts = line.split()
            if len(parts) >= 3 and parts[0] == "deb" and parts[2] == SUITE:
                candidates.append(parts[1])
    for uri in candidates:
        if "security" not in uri:
            return uri
    raise LabError("no Debian mirror found in /etc/apt; set SUPERKUBE_LAB_MIRROR to one")


# --- the base image ------------------------------------------------------------------------------


def image_key() -> str:
    digest = hashlib.sha256(json.dumps([SUITE, sorted(BASE_PACKAGES), IMAGE_RECIPE]).encode()).hexdigest()
    return f"{SUITE}-{digest[:12]}"


def build_base_image(progress: Progress, cache_dir: Path = CACHE_DIR) -> Path:
    """debootstrap the base image once; later labs reuse it from the cache."""
    final = cache_dir / image_key()
    if (final / ".superkube-complete").is_file():
        progress("base image cached", 1.0)
        return final / "rootfs"
    cache_dir.mkdir(parents=True, exist_ok=True)
    tmp = cache_dir / f".{image_key()}.building"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    progress("debootstrap: fetching Debian packages", 0.05)
    cmd = [
        "debootstrap",
        "--variant=minbase",
        f"--include={','.join(BASE_PACKAGES)}",
        SUITE,
        str(tmp / "rootfs"),
        debian_mirror(),
    ]
    # `with` closes the pipe: an open one left to the garbage collector is a ResourceWarning, which
    # the tests treat as an error (seen only when the image is built, i.e. on a fresh machine)
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as proc:
        assert proc.stdout is not None
        for seen, line in enumerate(proc.stdout, 1):
            if line.startswith("I: "):
                progress(f"debootstrap: {line[3:].strip()[:60]}", min(0.9, 0.05 + seen / 1500))
    if proc.returncode != 0:
        shutil.rmtree(tmp, ignore_errors=True)
        raise LabError("debootstrap failed; check the mirror (SUPERKUBE_LAB_MIRROR) and free disk space")
    root = tmp / "rootfs"
    for key in (root / "etc" / "ssh").glob("ssh_host_*"):
        key.unlink()  # every host gets its own host keys
    (root / "etc" / "machine-id").write_text("")
    (root / "etc" / "ssh" / "sshd_config.d").mkdir(parents=True, exist_ok=True)
    (root / "etc" / "ssh" / "sshd_config.d" / "superkube-lab.conf").write_text(
        "PermitRootLogin prohibit-password\nPasswordAuthentication no\nUseDNS no\n"
    )
    # The hosts have no route to a mirror; keep apt from trying at boot.
    for unit in ("apt-daily.timer", "apt-daily-upgrade.timer"):
        link = root / "etc" / "systemd" / "system" / "timers.target.wants" / unit
        link.unlink(missing_ok=True)
    # Baked in, not running: the packaged Prometheus and VictoriaMetrics; the monitoring role runs
    # its own units.
    for unit in ("prometheus.service", "victoria-metrics.service"):
        (root / "etc" / "systemd" / "system" / "multi-user.target.wants" / unit).unlink(missing_ok=True)
    (tmp / ".superkube-complete").write_text(
        json.dumps({"packages": sorted(BASE_PACKAGES), "recipe": IMAGE_RECIPE})
    )
    os.replace(tmp, final)
    progress("base image built", 1.0)
    return final / "rootfs"


# --- layout --------------------------------------------------------------------------------------


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


def _groups_of(nodes: int | dict[str, int]) -> list[str]:
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
    for group in _groups_of(nodes):
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


# --- bring-up ------------------------------------------------------------------------------------


def _ensure_route_tables(route_tables: Iterable[list[str]]) -> None:
    """Azure applies a route table per subnet; the switch does the same with source rules."""
    for table, (source, prefix, via) in enumerate(route_tables, start=100):
        run(["ip", "-n", SWITCH, "route", "add", prefix, "via", via, "table", str(table)])
        run(["ip", "-n", SWITCH, "rule", "add", "from", source, "to", prefix, "lookup", str(table)])


# Every booted host's systemd, journald, logind and friends hold inotify instances, all counted
# against root on this machine: at the kernel's default of 128, a lab of 16 hosts runs out, and a
# host booted again after a stop comes up degraded (a path unit fails to watch its directory).
INOTIFY_INSTANCES_PER_HOST = 32
INOTIFY_PROC = Path("/proc/sys/fs/inotify/max_user_instances")


def _ensure_inotify_instances(hosts: int, proc: Path = INOTIFY_PROC) -> None:
    """Raise the machine's inotify instance limit to what `hosts` booted hosts need (never lower it)."""
    want = 256 + INOTIFY_INSTANCES_PER_HOST * hosts
    if int(proc.read_text()) < want:
        proc.write_text(f"{want}\n")


# What the kubelet requires of the kernel and sets when it differs (its ContainerManager's kernel
# tunables, v1.35). A lab node is a container on this machine's kernel, whose /proc/sys it may not
# write: `lab up` sets them for its kubelets and `lab down` puts back what this machine had.
KUBELET_KERNEL_TUNABLES = {
    "vm/overcommit_memory": 1,
    "vm/panic_on_oom": 0,
    "kernel/panic": 10,
    "kernel/panic_on_oops": 1,
    "kernel/keys/root_maxkeys": 1_000_000,
    "kernel/keys/root_maxbytes": 25_000_000,
}
KERNEL_SAVED = "kernel-tunables.json"  # in the lab's state directory: what lab down restores


def _set_kernel_for_kubelets(state_dir: Path, sysctl: Path = Path("/proc/sys")) -> None:
    """Give the machine's kernel the kubelet's tunables, first saving the values they replace."""
    saved = state_dir / KERNEL_SAVED
    before = json.loads(saved.read_text()) if saved.exists() else {}
    for key, value in KUBELET_KERNEL_TUNABLES.items():
        current = int((sysctl / key).read_text())
        if current != value:
            before.setdefault(key, current)
            saved.write_text(json.dumps(before))  # saved before the change: down restores even a half-done up
            (sysctl / key).write_text(f"{value}\n")


def _restore_kernel(state_dir: Path, removed: list[str], sysctl: Path = Path("/proc/sys")) -> None:
    saved = state_dir / KERNEL_SAVED
    if not saved.exists():
        return
    for key, value in json.loads(saved.read_text()).items():
        with contextlib.suppress(OSError):
            (sysctl / key).write_text(f"{value}\n")
            removed.append(f"kernel {key.replace('/', '.')}={value} restored")
    saved.unlink()


def _ensure_switch(subnets: Iterable[str]) -> None:
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


def _ensure_host_network(host: Host, index: int) -> None:
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


def _start_imds(lab: Lab) -> None:
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


def _host_dir(lab: Lab, host: Host) -> Path:
    return Path(lab.state_dir) / "hosts" / host.name


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


LAB_JOIN_JITTER_S = 3
"""The lab's nodes join within 3 s of their join unit starting, not the stack's window (flagship:
600 s): a test waits for one node, not for a fleet's registrations to spread out."""


def lab_join_script(planned: str) -> str:
    """cloud-init's join script with its jitter window cut to the lab's (and nothing else changed)."""
    window = cloudinit.join_jitter_seconds(planned)
    if window is None:
        raise LabError("the stack's join script has no jitter the lab can shorten: plan it again")
    return planned.replace(
        cloudinit.JITTER_COMMAND.format(seconds=window),
        cloudinit.JITTER_COMMAND.format(seconds=LAB_JOIN_JITTER_S),
    )


# What a VM gives a kubelet and a container does not. systemd-nspawn mounts the cgroup v1 hierarchies
# read-only (the kubelet makes its QoS cgroups in them) and there is no /dev/kmsg, without which the
# kubelet will not start (its OOM watcher opens it). The lab links it to the console: the kubelet
# starts, but sees no kernel OOM events. Lab only: written by `lab up` into node hosts, never by a role.
KUBELET_HOST_SCRIPT = """#!/bin/sh
set -eu
mount -o remount,rw /sys/fs/cgroup
for d in /sys/fs/cgroup/*; do
    if [ ! -L "$d" ] && mountpoint -q "$d"; then
        mount -o remount,rw,bind "$d"
    fi
done
[ -e /dev/kmsg ] || ln -s /dev/console /dev/kmsg
"""
KUBELET_HOST_UNIT = """[Unit]
Description=Lab only: writable cgroup hierarchies and /dev/kmsg for the kubelet
DefaultDependencies=no
After=local-fs.target
Before=containerd.service kubelet.service

[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=/usr/local/sbin/superkube-lab-kubelet-host

[Install]
WantedBy=multi-user.target
"""


def _write_kubelet_host_unit(root: Path) -> None:
    script = root / "usr/local/sbin/superkube-lab-kubelet-host"
    script.parent.mkdir(parents=True, exist_ok=True)
    script.write_text(KUBELET_HOST_SCRIPT)
    script.chmod(0o755)
    unit = root / "etc/systemd/system/superkube-lab-kubelet-host.service"
    unit.write_text(KUBELET_HOST_UNIT)
    wants = root / "etc/systemd/system/multi-user.target.wants"
    wants.mkdir(parents=True, exist_ok=True)
    link = wants / unit.name
    if not link.is_symlink():
        link.symlink_to(f"/etc/systemd/system/{unit.name}")


def _prepare_root(
    lab: Lab, host: Host, image: str | None = None, files: dict[str, list[str]] | None = None
) -> Path:
    """The host's root: its own upper dir over `image` (default: the lab's base image), with
    cloud-init's `files` (default: its pool's, from the plan) written as cloud-init writes them."""
    base = _host_dir(lab, host)
    for sub in ("upper", "work", "root"):
        (base / sub).mkdir(parents=True, exist_ok=True)
    merged = base / "root"
    if not os.path.ismount(merged):
        run(
            [
                "mount",
                "-t",
                "overlay",
                "overlay",
                "-o",
                f"lowerdir={image or host.image or lab.base_image},upperdir={base / 'upper'},workdir={base / 'work'}",
                str(merged),
            ]
        )
    (merged / "etc" / "hostname").write_text(host.name + "\n")
    (merged / "etc" / "hosts").write_text(
        "127.0.0.1 localhost\n" + "".join(f"{h.address} {h.name}\n" for h in lab.hosts)
    )
    # cloud-init's files, as Azure's cloud-init writes them on the pool's VMs. Its runcmd (enabling
    # the join path unit) is left to whoever wants the node to join (superkube.lab.nodes.join): most labs have no
    # API server for a kubelet to join.
    # an instance of a baked image ran cloud-init at its first boot, from its own custom data
    planned = ({} if host.image else lab.cloud_init.get(host.pool, {})) if files is None else files
    for path, (content, mode) in planned.items():
        if path == cloudinit.JOIN_SCRIPT:
            content = lab_join_script(content)
        target = merged / path.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(content)
        os.chmod(target, int(mode, 8))
    if host.is_node:
        _write_kubelet_host_unit(merged)
    if host.group == GPU_NODES:  # its GPUs: what NVML would read there (superkube.lab.agent_pods)
        vm = vmsizes.size(lab.pools[host.pool]["vm_size"], f"pool {host.pool}")
        agent_pods.write_reading(merged, host.name, vm.name, vm.gpus)
    ssh = merged / "root" / ".ssh"
    ssh.mkdir(mode=0o700, parents=True, exist_ok=True)
    (ssh / "authorized_keys").write_text(Path(str(lab.key) + ".pub").read_text())
    os.chmod(ssh / "authorized_keys", 0o600)
    host_key = merged / "etc" / "ssh" / "ssh_host_ed25519_key"
    if not host_key.exists():
        run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", host.name, "-f", str(host_key)])
    # A VM image's apt lists are as old as the image. Age them so that a role which would refresh
    # a stale cache (and fail with no mirror in reach) fails here on every run, not only once the
    # cached base image passes some age.
    apt_state = merged / "var" / "lib" / "apt"
    for stale in (apt_state / "lists", apt_state / "periodic" / "update-success-stamp"):
        if stale.exists():
            os.utime(stale, (0, 0))
    return merged


def _node_host_options(lab: Lab, host: Host) -> list[str]:
    """What a VM gives a node's runtime and a container does not: /var/lib/containerd on this
    machine's own filesystem, as a VM has it on its disk (containerd's overlayfs snapshotter cannot
    put an overlay's upper layer on the host's overlay root). Not CAP_SYS_RESOURCE, which runc
    needs to lower a pod's OOM score: this machine's own bounding set lacks it, so the lab's
    inventory sets node_software_restrict_oom_score_adj instead."""
    if not host.is_node:
        return []
    disk = _host_dir(lab, host) / "containerd"
    disk.mkdir(parents=True, exist_ok=True)
    return [f"--bind={disk}:/var/lib/containerd"]


def boot(lab: Lab, host: Host, root: Path | None = None) -> None:
    """Boot (or boot again) one host; its overlay keeps whatever it had (`root`: already prepared)."""
    merged = root or _prepare_root(lab, host)
    command = [
        "systemd-nspawn",
        "--boot",
        "--register=no",
        "--keep-unit",
        "--quiet",
        "--console=passive",
        # --private-network keeps /proc/sys/net writable and grants CAP_NET_ADMIN inside; the
        # namespace itself is ours, so the host's veth and address are already there.
        "--private-network",
        f"--network-namespace-path=/run/netns/{host.netns}",
        "--capability=CAP_NET_RAW",
        f"--machine={PREFIX}-{host.name}",
        *_node_host_options(lab, host),
        "-D",
        str(merged),
    ]
    # A short-lived sh starts nspawn in the background of a new session and prints its PID, so
    # the host outlives this process without being its child.
    launcher = 'exec "$@" >>"$SUPERKUBE_LAB_LOG" 2>&1 </dev/null &\necho $!'
    proc = subprocess.run(
        ["setsid", "sh", "-c", launcher, "sh", *command],
        capture_output=True,
        text=True,
        env={**os.environ, "SUPERKUBE_LAB_LOG": str(_host_dir(lab, host) / "console.log")},
        check=True,
        timeout=30,
    )
    host.pid = int(proc.stdout.strip())


def ssh_command(lab: Lab, host: Host, command: str) -> list[str]:
    return [*ssh_base(lab), f"root@{host.address}", command]


def ssh_base(lab: Lab) -> list[str]:
    return [
        "ssh",
        "-i",
        str(lab.key),
        "-o",
        f"UserKnownHostsFile={lab.known_hosts}",
        "-o",
        "StrictHostKeyChecking=yes",
        "-o",
        "BatchMode=yes",
        "-o",
        "ConnectTimeout=5",
        "-o",
        f"ProxyCommand={proxy_command()}",
    ]


def proxy_command() -> str:
    # no nc -w: it also closes idle connections, which kills SSH masters between tasks;
    # ssh's ConnectTimeout bounds the connect
    return f"ip netns exec {SWITCH} nc %h %p"


def ssh(lab: Lab, host: Host, command: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(ssh_command(lab, host, command), capture_output=True, text=True, timeout=timeout)


def run_on(lab: Lab, name: str, command: str, timeout: float = 60) -> str:
    """Run `command` on host `name` and return its output; a non-zero exit raises LabError with
    the host, the command and what it printed on stderr."""
    try:
        proc = ssh(lab, lab.host(name), command, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise LabError(
            f"{name}: {command[:160]}: no answer in {timeout:.0f} s (lab status shows the host)"
        ) from None
    if proc.returncode != 0:
        raise LabError(f"{name}: {command[:160]}: exit {proc.returncode}: {proc.stderr.strip()}")
    return proc.stdout


def put(lab: Lab, name: str, path: str, text: str, timeout: float = 60) -> None:
    """Write `text` to `path` on host `name`, making its folder."""
    command = f"mkdir -p {Path(path).parent} && cat > {path}"
    proc = subprocess.run(
        ssh_command(lab, lab.host(name), command), input=text, capture_output=True, text=True, timeout=timeout
    )
    if proc.returncode != 0:
        raise LabError(f"{name}: writing {path}: exit {proc.returncode}: {proc.stderr.strip()}")


RESTART_FAILED_UNITS = (
    "failed=$(systemctl list-units --state=failed --plain --no-legend | awk '{print $1}'); "
    'systemctl reset-failed; [ -z "$failed" ] || systemctl restart $failed'
)


def wait_ready(lab: Lab, host: Host, deadline: float) -> None:
    """Wait until the host has booted; units that failed to start (on cgroup-v1 machines a unit
    now and then fails with 219/CGROUP while another host boots) are restarted once."""
    restarted = False
    while time.monotonic() < deadline:
        try:
            proc = ssh(lab, host, "systemctl is-system-running --wait", timeout=30)
        except subprocess.TimeoutExpired:
            continue
        state = proc.stdout.strip()
        if state == "running":
            return
        if state == "degraded" and not restarted:
            ssh(lab, host, RESTART_FAILED_UNITS, timeout=60)
            restarted = True
            continue
        if state == "degraded":
            failed = ssh(lab, host, "systemctl --failed --plain --no-legend", timeout=30).stdout.strip()
            raise LabError(
                f"host {host.name} booted degraded ({failed or 'no failed unit listed'}); see its console.log"
            )
        time.sleep(0.5)
    raise LabError(f"host {host.name} did not finish booting; see {_host_dir(lab, host) / 'console.log'}")


def _write_known_hosts(lab: Lab) -> None:
    lines = []
    for h in lab.hosts:
        pub = (_host_dir(lab, h) / "root" / "etc" / "ssh" / "ssh_host_ed25519_key.pub").read_text().split()
        lines.append(f"{h.address} {pub[0]} {pub[1]}\n")
    lab.known_hosts.write_text("".join(lines))


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
    return lab.inventory


def lab_images(base_root: Path) -> dict[str, dict[str, str]]:
    """The images the lab's nodes import, built from the project's own sources and cached beside the
    components' builds: the sandbox, netload, and the agents' image (on the lab's base image
    `base_root`), imported under the name the layer pins, so the layer's agents start on the lab's
    nodes as they would from a registry."""
    from superkube.lab import agents_image, images

    try:
        built = [images.pause(), images.netload(), agents_image.agents(base_root)]
        return {image.name: image.as_fact() for image in built}
    except build.BuildError as exc:
        raise LabError(f"lab up needs its node images: {exc}") from None


def built_binaries(progress: Callable[[str], None]) -> dict[str, dict[str, str]]:
    """The pinned components from the build cache (built first where missing: minutes, once)."""
    try:
        results = build.build_all(
            [c for c in build.components() if c.name in build.HOST_COMPONENTS],
            lambda component, what: progress(f"{component}: {what}"),
        )
    except build.BuildError as exc:
        raise LabError(f"lab up needs the pinned components: {exc}") from None
    return {
        name: {"path": str(b.binary(name)), "sha256": info["sha256"], "version": b.component.version}
        for b in results
        for name, info in sorted(b.manifest["binaries"].items())
    }


def up(
    nodes: int | str | dict[str, int],
    progress: Progress,
    state_dir: Path = STATE_DIR,
    cache_dir: Path = CACHE_DIR,
) -> Lab:
    """Start a lab of `nodes` cluster hosts (+ hub client + internet), or fail leaving nothing behind."""
    require_tools()
    if Lab.load(state_dir) is not None or _leftovers():
        raise LabError("a lab is already up (or left over); run `superkube lab down` first")
    hosts, subnets, facts = layout(nodes if isinstance(nodes, dict) else parse_hosts(nodes))
    base = build_base_image(lambda what, f: progress(what, 0.5 * f), cache_dir)
    builds = built_binaries(lambda what: progress(what, 0.5))
    if not any(h.group == APISERVERS for h in hosts):
        # kube-proxy only follows an API server's Services: without one it would retry forever, so the
        # hosts get none (converge leaves a component the lab has no build of stopped)
        builds.pop("kube-proxy", None)
    progress("the node images (OCI archives)", 0.55)
    images = lab_images(base)
    state_dir.mkdir(parents=True, exist_ok=True)
    progress("planning the stack's cloud-init and NICs", 0.6)
    cloud_init, pools = pool_facts()
    assign_secondary_ips(hosts, pools)
    lab = Lab(
        hosts=hosts,
        subnets=subnets,
        state_dir=str(state_dir),
        base_image=str(base),
        cloud_init=cloud_init,
        pools=pools,
        builds=builds,
        images=images,
        **facts,
    )
    try:
        _ensure_inotify_instances(len(hosts))
        if any(h.is_node for h in hosts):
            _set_kernel_for_kubelets(state_dir)
        run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "superkube-lab", "-f", str(lab.key)])
        _ensure_switch(subnets)
        for i, h in enumerate(hosts):
            progress(f"network for {h.name}", 0.6 + 0.1 * i / len(hosts))
            _ensure_host_network(h, i)
        _ensure_route_tables(lab.route_tables)
        _start_imds(lab)
        loadbalancer.start(
            state_dir,
            SWITCH,
            str(lab.facts["apiserver_address"]),
            int(lab.facts["apiserver_port"]),
            [(h.name, h.address) for h in hosts if h.group == APISERVERS],
        )
        for h in hosts:
            _prepare_root(lab, h)
        _write_known_hosts(lab)
        # One at a time: concurrent boots race for cgroups on cgroup-v1 machines.
        for i, h in enumerate(hosts):
            progress(f"booting {h.name}", 0.65 + 0.35 * i / len(hosts))
            boot(lab, h)
            lab.save()
            wait_ready(lab, h, time.monotonic() + 120)
        write_inventory(lab)
        lab.save()
    except BaseException:
        down(state_dir)
        raise
    progress("lab is up", 1.0)
    return lab


# --- hosts added to a running lab, and taken away -------------------------------------------------


def _network_index(lab: Lab) -> int:
    """A veth and MAC index no host of the lab has (hosts are numbered in boot order, from 0)."""
    used = {int(h.mac.replace(":", "")[-4:], 16) for h in lab.hosts if h.mac}
    return max(used, default=-1) + 1


def _free_address(lab: Lab, pool: str) -> tuple[IPv4Network, IPv4Address, list[str]]:
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


def add_host(lab: Lab, name: str, group: str, pool: str, image: str = "") -> Host:
    """A new host of a node pool in the running lab: its network, pod IPs and instance metadata,
    not yet booted. `lab.save()` is the caller's, once the host is booted."""
    if any(h.name == name for h in lab.hosts):
        raise LabError(f"the lab already has a host {name!r}")
    net, address, block = _free_address(lab, pool)
    host = Host(name, group, str(address), net.prefixlen, str(net.network_address + 1), pool=pool,
                secondary=block, image=image)  # fmt: skip
    _ensure_inotify_instances(len(lab.hosts) + 1)
    lab.hosts.append(host)
    try:
        _ensure_host_network(host, _network_index(lab))
        write_imds(lab)
    except BaseException:
        remove_host(lab, name)
        raise
    return host


def remove_host(lab: Lab, name: str) -> None:
    """Take a host out of the lab as Azure deletes an instance: stopped, its disk gone, its address
    and pod IPs free for the next one, and its metadata gone."""
    host = lab.host(name)
    pids = [host.pid] + (_children(host.pid) if host.pid and alive(host.pid) else [])
    _terminate_all([p for p in pids if p])
    merged = _host_dir(lab, host) / "root"
    if os.path.ismount(merged):
        run(["umount", str(merged)], check=False)
        if os.path.ismount(merged):
            run(["umount", "-l", str(merged)], check=False)
    for ip in host.secondary:
        run(["ip", "-n", SWITCH, "route", "del", f"{ip}/32"], check=False)
    if host.netns in _lab_namespaces():
        _end(_namespace_pids(host.netns), signal.SIGKILL, f"in {host.netns}", [])
        run(["ip", "netns", "del", host.netns], check=False)
    if host.mac:  # a veth an add that failed halfway left behind, which the next add would trip on
        index = int(host.mac.replace(":", "")[-4:], 16)
        run(["ip", "link", "del", f"skl{index}h"], check=False)
        run(["ip", "-n", SWITCH, "link", "del", f"skl{index}s"], check=False)
    lab.hosts.remove(host)
    console = _host_dir(lab, host) / "console.log"
    if console.exists():  # what it printed stays with the lab, for whoever asks why it went
        kept = Path(lab.state_dir) / "removed" / f"{host.name}.console.log"
        kept.parent.mkdir(exist_ok=True)
        n = 1
        while kept.exists():  # an instance replaced in place: each of its lives keeps its own log
            n += 1
            kept = kept.with_name(f"{host.name}.{n}.console.log")
        shutil.move(str(console), kept)
    shutil.rmtree(_host_dir(lab, host), ignore_errors=True)
    write_imds(lab)
    lab.save()


# --- status, stop, start, down ---------------------------------------------------------------------


def alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/cmdline").read_bytes().startswith(b"systemd-nspawn")


def status(state_dir: Path = STATE_DIR) -> dict[str, Any]:
    lab = Lab.load(state_dir)
    if lab is None:
        return {"up": False, "hosts": [], "leftovers": _leftovers()}
    rows = []
    for h in lab.hosts:
        running = alive(h.pid)
        reachable = False
        if running:
            try:
                reachable = ssh(lab, h, "true", timeout=10).returncode == 0
            except subprocess.TimeoutExpired:
                reachable = False
        rows.append(
            {
                "name": h.name,
                "group": h.group,
                "address": h.address,
                "netns": h.netns,
                "running": running,
                "ssh": reachable,
            }
        )
    return {"up": True, "inventory": str(lab.inventory), "hosts": rows, "leftovers": []}


def stop_host(name: str, state_dir: Path = STATE_DIR) -> None:
    lab = _require(state_dir)
    host = lab.host(name)
    _terminate(host.pid)
    host.pid = None
    lab.save()


def start_host(name: str, state_dir: Path = STATE_DIR) -> None:
    lab = _require(state_dir)
    host = lab.host(name)
    if alive(host.pid):
        return
    boot(lab, host)
    lab.save()
    wait_ready(lab, host, time.monotonic() + 120)


def _require(state_dir: Path) -> Lab:
    lab = Lab.load(state_dir)
    if lab is None:
        raise LabError("no lab is up; start one with `superkube lab up`")
    return lab


def _terminate(pid: int | None, grace: float = 30) -> None:
    _terminate_all([pid], grace)


def _terminate_all(pids: Iterable[int | None], grace: float = 30) -> None:
    """Power hosts off together (a node's runtime takes a while to stop its pods): SIGTERM to each,
    which nspawn turns into a power-off of the container's systemd, then SIGKILL to what is left
    after `grace`."""
    left = [pid for pid in pids if pid is not None and alive(pid)]
    for pid in left:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    end = time.monotonic() + grace
    while time.monotonic() < end and any(alive(pid) for pid in left):
        time.sleep(0.2)
    stuck = [pid for pid in left if alive(pid)]
    for pid in stuck:
        # The container's init first: killing it ends every process of its PID namespace (a halt
        # stuck on an unmount included), and nspawn then exits and lets go of the host's root.
        for child in _children(pid):
            with contextlib.suppress(ProcessLookupError):  # it may end between the check and the kill
                os.kill(child, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    end = time.monotonic() + 10
    while time.monotonic() < end and any(alive(pid) for pid in stuck):
        time.sleep(0.2)


def _children(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def _leftovers() -> list[str]:
    found = [f"netns {name}" for name in _lab_namespaces()]
    for line in Path("/proc/mounts").read_text().splitlines():
        target = line.split()[1]
        if target.startswith(str(STATE_DIR)):
            found.append(f"mount {target}")
    found += [f"process {pid}" for pid in _lab_processes() + _lab_clients(STATE_DIR)]
    return found


def _stat(pid: int) -> list[str]:
    """Fields of /proc/<pid>/stat after the command name: [state, ppid, ...]; [] once it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return []


def running(pid: int) -> bool:
    """Whether pid still runs (an exited child nobody has reaped yet does not)."""
    fields = _stat(pid)
    return bool(fields) and fields[0] != "Z"


def _wait_gone(pids: Iterable[int], timeout: float = 10) -> None:
    end = time.monotonic() + timeout
    pending = set(pids)
    while pending and time.monotonic() < end:
        pending = {pid for pid in pending if running(pid)}
        if pending:
            time.sleep(0.05)


def _end(pids: list[int], sig: signal.Signals, label: str, removed: list[str]) -> None:
    """Signal every pid, note it in `removed`, and wait until they have exited."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)
        removed.append(f"process {pid} {label}".rstrip())
    _wait_gone(pids)


def _lab_namespaces() -> list[str]:
    lines = run(["ip", "netns", "list"], check=False).stdout.splitlines()
    return [line.split()[0] for line in lines if line.startswith(f"{PREFIX}-")]


def _namespace_pids(name: str) -> list[int]:
    return [int(p) for p in run(["ip", "netns", "pids", name], check=False).stdout.split() if p.isdigit()]


def _cmdlines() -> Iterator[tuple[int, bytes]]:
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                yield int(entry), Path(f"/proc/{entry}/cmdline").read_bytes()
            except OSError:
                continue


def _lab_processes() -> list[int]:
    """PIDs of every systemd-nspawn running a lab host, whether or not a state file knows them."""
    machine = f"--machine={PREFIX}-".encode()
    return [pid for pid, cmd in _cmdlines() if cmd.startswith(b"systemd-nspawn") and machine in cmd]


def _lab_clients(state_dir: Path) -> list[int]:
    """PIDs of processes that use the lab's files: above all SSH masters whose control sockets
    live in the state dir and would outlive it (ControlPersist). Never this process or its parents."""
    ours = set()
    pid = os.getpid()
    while pid > 1 and pid not in ours:
        ours.add(pid)
        fields = _stat(pid)
        pid = int(fields[1]) if len(fields) > 1 else 0
    needle = str(state_dir).encode() + b"/"
    return [
        pid
        for pid, cmd in _cmdlines()
        if pid not in ours and needle in cmd and not cmd.startswith(b"systemd-nspawn")
    ]


def down(state_dir: Path = STATE_DIR) -> list[str]:
    """Stop every host and remove every namespace, link, mount and state file; returns what it removed."""
    removed: list[str] = []
    lab = Lab.load(state_dir)
    pids = [h.pid for h in lab.hosts] if lab else []
    pids += _lab_processes()
    running = [pid for pid in set(p for p in pids if p) if alive(pid)]
    _terminate_all(running)
    removed += [f"process {pid}" for pid in running]
    for line in reversed(Path("/proc/mounts").read_text().splitlines()):
        target = line.split()[1]
        if target.startswith(str(state_dir)):
            run(["umount", target], check=False)
            if os.path.ismount(target):
                run(["umount", "-l", target], check=False)
            removed.append(f"mount {target}")
    for name in _lab_namespaces():
        # Whatever still runs in a lab namespace (SSH ProxyCommands above all) would keep it, and
        # its dead connections, alive after `ip netns del`: end it first.
        _end(_namespace_pids(name), signal.SIGKILL, f"in {name}", removed)
        run(["ip", "netns", "del", name], check=False)  # deleting a netns removes its veth ends
        removed.append(f"netns {name}")
    _end(_lab_clients(state_dir), signal.SIGTERM, "(client)", removed)
    _restore_kernel(state_dir, removed)
    if state_dir.exists():
        if sys.version_info >= (3, 12):
            shutil.rmtree(state_dir, onexc=lambda f, p, e: _gone_already(f, p, (type(e), e, None)))
        else:
            shutil.rmtree(state_dir, onerror=_gone_already)
        removed.append(f"state {state_dir}")
    return removed


def _gone_already(function: Any, path: str, exc_info: Any) -> None:
    """rmtree's error hook: a file another `lab down` (an interrupted run's cleanup) removed first
    is what this one wanted; anything else is raised."""
    if not isinstance(exc_info[1], FileNotFoundError):
        raise exc_info[1]
