"""The lab as data: its hosts (Host), the lab itself (Lab, saved in its state folder), and the
names and commands every part of the lab shares.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from superkube.cluster.kube import (
    CPU_NODES,
    GPU_NODES,
)
from superkube.lab.errors import LabError

PREFIX = "sklab"


SWITCH = f"{PREFIX}-switch"


STATE_DIR = Path(os.environ.get("SUPERKUBE_LAB_STATE", "/var/lib/superkube/lab"))


LAB_STACK = "flagship"  # hosts sit where this stack's address plan puts them


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
