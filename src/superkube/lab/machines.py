"""One host as a machine: its root (an overlay over the base image, with cloud-init's files), its
boot under systemd-nspawn, and SSH into it through the switch namespace.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

from superkube.cluster import cloudinit
from superkube.cluster.kube import (
    GPU_NODES,
)
from superkube.lab import agent_pods
from superkube.lab.errors import LabError
from superkube.lab.state import PREFIX, SWITCH, Host, Lab, run
from superkube.model import vmsizes


def host_dir(lab: Lab, host: Host) -> Path:
    return Path(lab.state_dir) / "hosts" / host.name


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


def write_kubelet_host_unit(root: Path) -> None:
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


def prepare_root(
    lab: Lab, host: Host, image: str | None = None, files: dict[str, list[str]] | None = None
) -> Path:
    """The host's root: its own upper dir over `image` (default: the lab's base image), with
    cloud-init's `files` (default: its pool's, from the plan) written as cloud-init writes them."""
    base = host_dir(lab, host)
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
        write_kubelet_host_unit(merged)
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


def node_host_options(lab: Lab, host: Host) -> list[str]:
    """What a VM gives a node's runtime and a container does not: /var/lib/containerd on this
    machine's own filesystem, as a VM has it on its disk (containerd's overlayfs snapshotter cannot
    put an overlay's upper layer on the host's overlay root). Not CAP_SYS_RESOURCE, which runc
    needs to lower a pod's OOM score: this machine's own bounding set lacks it, so the lab's
    inventory sets node_software_restrict_oom_score_adj instead."""
    if not host.is_node:
        return []
    disk = host_dir(lab, host) / "containerd"
    disk.mkdir(parents=True, exist_ok=True)
    return [f"--bind={disk}:/var/lib/containerd"]


def boot(lab: Lab, host: Host, root: Path | None = None) -> None:
    """Boot (or boot again) one host; its overlay keeps whatever it had (`root`: already prepared)."""
    merged = root or prepare_root(lab, host)
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
        *node_host_options(lab, host),
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
        env={**os.environ, "SUPERKUBE_LAB_LOG": str(host_dir(lab, host) / "console.log")},
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
    raise LabError(f"host {host.name} did not finish booting; see {host_dir(lab, host) / 'console.log'}")


def write_known_hosts(lab: Lab) -> None:
    lines = []
    for h in lab.hosts:
        pub = (host_dir(lab, h) / "root" / "etc" / "ssh" / "ssh_host_ed25519_key.pub").read_text().split()
        lines.append(f"{h.address} {pub[0]} {pub[1]}\n")
    lab.known_hosts.write_text("".join(lines))
