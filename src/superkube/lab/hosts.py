"""A real node fleet on this machine: booted Debian 12 systemd machines in their own network namespaces.

This module is the lab's life: `up` brings a lab up (or leaves nothing), `add_host` and
`remove_host` add and take away hosts as a scale set's instances come and go, `stop_host` and
`start_host`, and `down`, which leaves no namespace, mount, link, process or state behind. Its parts:
`state` (Host, Lab), `rootfs` (the base image), `fabric` (the network and instance metadata),
`machines` (a host's root, its boot, SSH), `kernel`, `inventory` and `processes`.

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

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from superkube.cluster.kube import APISERVERS
from superkube.fleet.converge import CURRENT_INVENTORY, clear_current_inventory
from superkube.harness import build
from superkube.lab import loadbalancer, trainer_image
from superkube.lab.errors import LabError
from superkube.lab.fabric import (
    assign_secondary_ips,
    ensure_host_network,
    ensure_route_tables,
    ensure_switch,
    free_address,
    layout,
    network_index,
    parse_hosts,
    pool_facts,
    start_imds,
    write_imds,
)
from superkube.lab.inventory import write_inventory
from superkube.lab.kernel import ensure_inotify_instances, restore_kernel, set_kernel_for_kubelets
from superkube.lab.machines import boot, host_dir, prepare_root, ssh, wait_ready, write_known_hosts
from superkube.lab.processes import (
    alive,
    children,
    end,
    gone_already,
    lab_clients,
    lab_namespaces,
    lab_processes,
    leftovers,
    namespace_pids,
    terminate,
    terminate_all,
)
from superkube.lab.rootfs import CACHE_DIR, build_base_image, built_binaries, lab_images
from superkube.lab.state import STATE_DIR, SWITCH, Host, Lab, Progress, require_tools, run


def up(
    nodes: int | str | dict[str, int],
    progress: Progress,
    state_dir: Path = STATE_DIR,
    cache_dir: Path = CACHE_DIR,
) -> Lab:
    """Start a lab of `nodes` cluster hosts (+ hub client + internet), or fail leaving nothing behind."""
    require_tools()
    if Lab.load(state_dir) is not None or leftovers():
        raise LabError("a lab is already up (or left over); run `superkube lab down` first")
    hosts, subnets, facts = layout(nodes if isinstance(nodes, dict) else parse_hosts(nodes))
    base = build_base_image(lambda what, f: progress(what, 0.5 * f), cache_dir)
    builds = built_binaries(lambda what: progress(what, 0.5))
    if not any(h.group == APISERVERS for h in hosts):
        # kube-proxy only follows an API server's Services: without one it would retry forever, so the
        # hosts get none (converge leaves a component the lab has no build of stopped)
        builds.pop("kube-proxy", None)
    progress("the node images (OCI archives)", 0.55)
    images = lab_images(base, lambda what: progress(what, 0.55))
    try:
        trainer = trainer_image.trainer(lambda what, f: progress(what, 0.55))
    except build.BuildError as exc:
        raise LabError(f"lab up needs its node images: {exc}") from None
    images[trainer.name] = trainer.as_fact()
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
        ensure_inotify_instances(len(hosts))
        if any(h.is_node for h in hosts):
            set_kernel_for_kubelets(state_dir)
        run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "superkube-lab", "-f", str(lab.key)])
        ensure_switch(subnets)
        for i, h in enumerate(hosts):
            progress(f"network for {h.name}", 0.6 + 0.1 * i / len(hosts))
            ensure_host_network(h, i)
        ensure_route_tables(lab.route_tables)
        start_imds(lab)
        loadbalancer.start(
            state_dir,
            SWITCH,
            str(lab.facts["apiserver_address"]),
            int(lab.facts["apiserver_port"]),
            [(h.name, h.address) for h in hosts if h.group == APISERVERS],
        )
        for h in hosts:
            prepare_root(lab, h)
        write_known_hosts(lab)
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


def add_host(lab: Lab, name: str, group: str, pool: str, image: str = "") -> Host:
    """A new host of a node pool in the running lab: its network, pod IPs and instance metadata,
    not yet booted. `lab.save()` is the caller's, once the host is booted."""
    if any(h.name == name for h in lab.hosts):
        raise LabError(f"the lab already has a host {name!r}")
    net, address, block = free_address(lab, pool)
    host = Host(name, group, str(address), net.prefixlen, str(net.network_address + 1), pool=pool,
                secondary=block, image=image)  # fmt: skip
    ensure_inotify_instances(len(lab.hosts) + 1)
    lab.hosts.append(host)
    try:
        ensure_host_network(host, network_index(lab))
        write_imds(lab)
    except BaseException:
        remove_host(lab, name)
        raise
    return host


def remove_host(lab: Lab, name: str) -> None:
    """Take a host out of the lab as Azure deletes an instance: stopped, its disk gone, its address
    and pod IPs free for the next one, and its metadata gone."""
    host = lab.host(name)
    pids = [host.pid] + (children(host.pid) if host.pid and alive(host.pid) else [])
    terminate_all([p for p in pids if p])
    merged = host_dir(lab, host) / "root"
    if os.path.ismount(merged):
        run(["umount", str(merged)], check=False)
        if os.path.ismount(merged):
            run(["umount", "-l", str(merged)], check=False)
    for ip in host.secondary:
        run(["ip", "-n", SWITCH, "route", "del", f"{ip}/32"], check=False)
    if host.netns in lab_namespaces():
        end(namespace_pids(host.netns), signal.SIGKILL, f"in {host.netns}", [])
        run(["ip", "netns", "del", host.netns], check=False)
    if host.mac:  # a veth an add that failed halfway left behind, which the next add would trip on
        index = int(host.mac.replace(":", "")[-4:], 16)
        run(["ip", "link", "del", f"skl{index}h"], check=False)
        run(["ip", "-n", SWITCH, "link", "del", f"skl{index}s"], check=False)
    lab.hosts.remove(host)
    console = host_dir(lab, host) / "console.log"
    if console.exists():  # what it printed stays with the lab, for whoever asks why it went
        kept = Path(lab.state_dir) / "removed" / f"{host.name}.console.log"
        kept.parent.mkdir(exist_ok=True)
        n = 1
        while kept.exists():  # an instance replaced in place: each of its lives keeps its own log
            n += 1
            kept = kept.with_name(f"{host.name}.{n}.console.log")
        shutil.move(str(console), kept)
    shutil.rmtree(host_dir(lab, host), ignore_errors=True)
    write_imds(lab)
    lab.save()


def status(state_dir: Path = STATE_DIR) -> dict[str, Any]:
    lab = Lab.load(state_dir)
    if lab is None:
        return {"up": False, "hosts": [], "leftovers": leftovers()}
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
    terminate(host.pid)
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


def down(state_dir: Path = STATE_DIR) -> list[str]:
    """Stop every host and remove every namespace, link, mount and state file; returns what it removed."""
    removed: list[str] = []
    lab = Lab.load(state_dir)
    pids = [h.pid for h in lab.hosts] if lab else []
    pids += lab_processes()
    running = [pid for pid in set(p for p in pids if p) if alive(pid)]
    terminate_all(running)
    removed += [f"process {pid}" for pid in running]
    for line in reversed(Path("/proc/mounts").read_text().splitlines()):
        target = line.split()[1]
        if target.startswith(str(state_dir)):
            run(["umount", target], check=False)
            if os.path.ismount(target):
                run(["umount", "-l", target], check=False)
            removed.append(f"mount {target}")
    for name in lab_namespaces():
        # Whatever still runs in a lab namespace (SSH ProxyCommands above all) would keep it, and
        # its dead connections, alive after `ip netns del`: end it first.
        end(namespace_pids(name), signal.SIGKILL, f"in {name}", removed)
        run(["ip", "netns", "del", name], check=False)  # deleting a netns removes its veth ends
        removed.append(f"netns {name}")
    end(lab_clients(state_dir), signal.SIGTERM, "(client)", removed)
    restore_kernel(state_dir, removed)
    if clear_current_inventory(state_dir / "inventory.yml"):
        removed.append(f"current inventory {CURRENT_INVENTORY}")
    if state_dir.exists():
        if sys.version_info >= (3, 12):
            shutil.rmtree(state_dir, onexc=lambda f, p, e: gone_already(f, p, (type(e), e, None)))
        else:
            shutil.rmtree(state_dir, onerror=gone_already)
        removed.append(f"state {state_dir}")
    return removed
