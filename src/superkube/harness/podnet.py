"""A node's pod network in network namespaces on this machine: the node's real CNI chain, no host booted.

`PodNode` makes a namespace holding the node's NIC (10.64.0.4 in the flagship's spoke) and one
beyond it for the rest of the world: the VNet's gateway, which routes the pod IPs to the node as the
VNet does, a hub host at 10.0.0.10 and an internet host at 203.0.113.10. Pods are namespaces of
their own, wired by the conflist `superkube-cni-config` writes (superkube.agents.cni_config), each
plugin run inside the node's namespace as a container runtime runs it: Debian's ptp, host-local and
portmap, our superkube-bandwidth and superkube-pod-accounting. The node-level accounting, its hooks,
the apply script and the per-pod settings are the roles' own, rendered by the caller (`RoleFiles`).

The per-pod accounting's tests and its benchmark use it; it needs root, iptables and Debian's
containernetworking-plugins.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from superkube.agents import cni_accounting, cni_bandwidth, cni_config
from superkube.agents import iptables_exporter as exporter
from superkube.harness.errors import HarnessError

DEBIAN_PLUGINS = Path("/usr/lib/cni")  # Debian's containernetworking-plugins
NODE_IP, SUBNET, VNET_GATEWAY = "10.64.0.4", "10.64.0.0/20", "10.64.0.1"
POD_IPS = tuple(f"10.64.1.{i}" for i in range(10, 42))  # 32: a CPU node's 30 and room
INTERNET, HUB = "203.0.113.10", "10.0.0.10"
PORT = 9999  # datagrams to it are dropped where they arrive, so nothing answers them
PATH = "/usr/sbin:/usr/bin:/sbin:/bin"


def run(*args: str, stdin: str | None = None, env: dict[str, str] | None = None) -> str:
    proc = subprocess.run(list(args), input=stdin, capture_output=True, text=True, env=env, timeout=120)
    if proc.returncode != 0:
        raise HarnessError(f"{' '.join(args)}: {(proc.stderr or proc.stdout).strip()}")
    return proc.stdout


@dataclass(frozen=True)
class RoleFiles:
    """What the iptables_accounting and iptables_base roles write on a node, as rendered."""

    settings: dict[str, Any]  # iptables_accounting_pod_settings
    rules: str  # accounting.rules
    hooks: str  # accounting.hooks
    apply_script: str  # superkube-iptables-apply, its rule-set directory left as {dir}


@dataclass
class Pod:
    container_id: str
    netns: str
    namespace: str
    name: str
    result: dict[str, Any] = field(default_factory=dict)

    @property
    def ip(self) -> str:
        return str(self.result["ips"][0]["address"].split("/")[0])


class PodNode:
    """A node's network namespace, the world beyond its NIC, its CNI chain and its pods."""

    def __init__(self, tmp: Path, role: RoleFiles) -> None:
        if not (DEBIAN_PLUGINS / "ptp").exists():
            raise HarnessError(f"no CNI plugins in {DEBIAN_PLUGINS}: `make debian-deps` installs them")
        tag = uuid.uuid4().hex[:8]
        self.name, self.world = f"skpa-n-{tag}", f"skpa-w-{tag}"
        self.tmp, self.role = tmp, role
        self.namespaces: list[str] = []
        self.settings = tmp / "pod-accounting.json"
        self.settings.write_text(json.dumps(role.settings, indent=2) + "\n")
        node = cni_config.NodeAddresses(NODE_IP, SUBNET, POD_IPS)
        self.network = cni_config.conflist(
            node, data_dir=str(tmp / "ipam"), accounting_settings=str(self.settings)
        )
        # the runtime's plugin directory: Debian's plugins and ours, installed as node_software does
        self.bin = tmp / "cni-bin"
        self.bin.mkdir()
        for plugin in ("ptp", "host-local", "portmap", "bandwidth"):
            (self.bin / plugin).symlink_to(DEBIAN_PLUGINS / plugin)
        for plugin, module in (
            ("superkube-bandwidth", cni_bandwidth),
            ("superkube-pod-accounting", cni_accounting),
        ):
            shutil.copy(str(module.__file__), self.bin / plugin)
            (self.bin / plugin).chmod(0o755)

    def up(self) -> PodNode:
        for ns in (self.name, self.world):
            run("ip", "netns", "add", ns)
            self.namespaces.append(ns)
            run("ip", "-n", ns, "link", "set", "lo", "up")
        run("ip", "link", "add", "eth0", "netns", self.name, "type", "veth", "peer", "name", "eth0", "netns", self.world)  # fmt: skip
        self.ns("ip", "addr", "add", f"{NODE_IP}/20", "dev", "eth0")
        self.ns("ip", "link", "set", "eth0", "up")
        self.ns("ip", "route", "add", "default", "via", VNET_GATEWAY)
        self.ns("sysctl", "-qw", "net.ipv4.ip_forward=1")
        self.at(self.world, "ip", "addr", "add", f"{VNET_GATEWAY}/20", "dev", "eth0")
        self.at(self.world, "ip", "link", "set", "eth0", "up")
        for address in (INTERNET, HUB):
            self.at(self.world, "ip", "addr", "add", f"{address}/32", "dev", "lo")
        # the VNet routes each pod IP to its node's NIC
        self.at(self.world, "ip", "route", "add", "10.64.1.0/24", "via", NODE_IP)
        for ns in (self.name, self.world):
            self.drop_test_port(ns)
        return self

    def down(self) -> None:
        for ns in reversed(self.namespaces):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)

    def at(self, ns: str, *args: str, stdin: str | None = None) -> str:
        return run("ip", "netns", "exec", ns, *args, stdin=stdin)

    def ns(self, *args: str, stdin: str | None = None) -> str:
        return self.at(self.name, *args, stdin=stdin)

    def drop_test_port(self, ns: str) -> None:
        """Datagrams to PORT end where they arrive, unanswered (no ICMP back to count)."""
        self.at(ns, "iptables", "-w", "-A", "INPUT", "-p", "udp", "--dport", str(PORT), "-j", "DROP")

    # --- the runtime's half of CNI ------------------------------------------------------------

    def plugin(
        self, command: str, plugin: dict[str, Any], pod: Pod, prev: Any, args: str
    ) -> subprocess.CompletedProcess[str]:
        """One plugin of the chain, in the node's namespace, as the runtime runs it."""
        conf = {**plugin, "name": self.network["name"], "cniVersion": self.network["cniVersion"]}
        if prev is not None:
            conf["prevResult"] = prev
        env = {
            "PATH": PATH,
            "CNI_COMMAND": command,
            "CNI_CONTAINERID": pod.container_id,
            "CNI_NETNS": f"/run/netns/{pod.netns}",
            "CNI_IFNAME": "eth0",
            "CNI_PATH": str(self.bin),
            "CNI_ARGS": args,
        }
        return subprocess.run(
            ["ip", "netns", "exec", self.name, str(self.bin / plugin["type"])],
            input=json.dumps(conf), capture_output=True, text=True, env=env, timeout=120,
        )  # fmt: skip

    def add(self, namespace: str, name: str, args: str | None = None) -> tuple[Pod, str]:
        """ADD through the whole conflist in order; the pod, and what the accounting step logged."""
        pod = Pod(uuid.uuid4().hex + uuid.uuid4().hex, f"skpa-p-{uuid.uuid4().hex[:8]}", namespace, name)
        run("ip", "netns", "add", pod.netns)
        self.namespaces.append(pod.netns)
        run("ip", "-n", pod.netns, "link", "set", "lo", "up")
        self.drop_test_port(pod.netns)
        if args is None:
            args = (
                f"IgnoreUnknown=1;K8S_POD_NAMESPACE={namespace};K8S_POD_NAME={name};"
                f"K8S_POD_INFRA_CONTAINER_ID={pod.container_id}"
            )
        prev: Any = None
        logged = ""
        for plugin in self.network["plugins"]:
            proc = self.plugin("ADD", plugin, pod, prev, args)
            if proc.returncode != 0:
                raise HarnessError(f"ADD {plugin['type']}: {proc.stdout.strip()} {proc.stderr.strip()}")
            prev = json.loads(proc.stdout)
            if plugin["type"] == "superkube-pod-accounting":
                logged = proc.stderr
        pod.result = prev
        return pod, logged

    def delete(self, pod: Pod) -> None:
        """DEL through the conflist in reverse, with the cached result."""
        for plugin in reversed(self.network["plugins"]):
            proc = self.plugin("DEL", plugin, pod, pod.result or None, "")
            if proc.returncode != 0:
                raise HarnessError(f"DEL {plugin['type']}: {proc.stdout.strip()} {proc.stderr.strip()}")

    def accounting(
        self,
        command: str,
        container_id: str,
        prev: Any = None,
        args: str = "K8S_POD_NAMESPACE=ns;K8S_POD_NAME=pod",
        **conf: Any,
    ) -> subprocess.CompletedProcess[str]:
        """The accounting step alone, with a previous result of the caller's (no pod namespace)."""
        plugin = {"type": "superkube-pod-accounting", "settings": str(self.settings), **conf}
        return self.plugin(command, plugin, Pod(container_id, "none", "", ""), prev, args)

    # --- traffic and counters -------------------------------------------------------------------

    def send(self, ns: str, dst: str, count: int, size: int, src: str = "") -> None:
        """`count` UDP datagrams of `size` payload bytes from namespace `ns` to `dst`."""
        bind = f"s.bind(({src!r}, 0)); " if src else ""
        code = (
            "import socket; s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); " + bind
            + f"[s.sendto(b'x' * {size}, ({dst!r}, {PORT})) for _ in range({count})]"
        )  # fmt: skip
        self.at(ns, sys.executable, "-c", code)

    def saved(self) -> str:
        return self.ns("iptables-save", "-c", "-t", "mangle")

    def series(self) -> dict[tuple[str, ...], list[int]]:
        """The exporter's series, by their labels (sorted key=value pairs): [packets, bytes]."""
        out = {}
        for text, counters in exporter.parse("mangle", self.saved().encode()).items():
            labels = tuple(sorted(f"{k}={v}" for k, v in re.findall(r'(\w+)="([^"]*)"', text)))
            out[labels] = counters
        return out

    def per_pod(self) -> dict[tuple[str, str, str], tuple[int, int]]:
        """(namespace, pod, traffic) -> (packets, bytes), from the series that carry a pod label."""
        out = {}
        for labels, (packets, nbytes) in self.series().items():
            d = dict(label.split("=", 1) for label in labels)
            if "pod" in d:
                out[(d["namespace"], d["pod"], d["traffic"])] = (packets, nbytes)
        return out

    def node_level(self) -> dict[str, int]:
        """Bytes of the node's own accounting rules (no pod label), by traffic."""
        out: dict[str, int] = {}
        for labels, (_packets, nbytes) in self.series().items():
            d = dict(label.split("=", 1) for label in labels)
            if "pod" not in d:
                out[d["traffic"]] = out.get(d["traffic"], 0) + nbytes
        return out

    def apply_role(self) -> None:
        """The node's rule restore: the role's files and iptables_base's apply script, as the
        superkube-iptables@accounting unit runs it at boot and on every converge that changes them."""
        conf = self.tmp / "iptables"
        conf.mkdir(exist_ok=True)
        (conf / "accounting.rules").write_text(self.role.rules)
        (conf / "accounting.hooks").write_text(self.role.hooks)
        script = conf / "apply.sh"
        script.write_text(self.role.apply_script.replace("{dir}", str(conf)))
        self.ns("sh", str(script), "accounting")

    def chains(self) -> list[str]:
        """The per-pod chains the node holds."""
        return sorted(line[1:].split()[0] for line in self.saved().splitlines() if line.startswith(":SKPOD-"))
