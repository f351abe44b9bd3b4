"""Scale-out without Ansible, in the lab: a baked node image, join tokens in the scale sets' custom
data, and new instances that boot from the one with the other and join the real control plane.

- `bake(lab, pool)`: a builder host of the pool boots from the lab's base image with no custom
  data, converge runs the site playbook on it alone (the node roles, the same variables; only the
  bootstrap kubeconfig is left out), and its root, generalized (no host keys, machine ID, node
  credentials, logs), becomes the pool's image. Its containerd store (the VM's disk in the lab) goes
  with it, so the images converge imported are there at first boot. The builder is then deleted.
- `publish(lab)`: one round of the join-token publisher (`superkube.agents.join_tokens`) as the
  lab's admin: a token in the real API server, and each pool's scale-set model (the plan's custom
  data plus the bootstrap kubeconfig) in the lab's model folder, where Azure would keep it.
- `scale(lab, pool, n)`: n new instances, as Azure makes them: an address and pod IPs free in the
  pool's subnet, instance metadata, a root over the image with the model's custom data written as
  cloud-init writes it (its runcmd enables the join path unit), and a boot. Nothing reaches them over
  SSH; each is timed from its boot to its Node Ready and to schedulable (Ready, uncordoned, past
  preflight). `scale(lab, pool, -n)` drains and deletes the newest n of the pool's instances.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from superkube.agents import join_tokens
from superkube.cluster import bake as baking
from superkube.cluster import cloudinit, join, roll
from superkube.cluster.join import DEFAULT_ROTATE_S, DEFAULT_TTL_S
from superkube.cluster.kube import APISERVERS
from superkube.cluster.roll import is_ready, schedulable
from superkube.lab import agent_pods, hosts, inventory, layer, machines, processes
from superkube.lab.errors import LabError
from superkube.lab.state import LAB_STACK, SWITCH, Host, Lab
from superkube.lab.state import run as lab_run
from superkube.model import vmsizes

IMAGES = "images"  # under the lab's state folder: <pool>/root and <pool>/containerd
MODELS = "models"  # the scale sets' models as the publisher writes them (DirectoryModels)
PUBLISHER_CONFIG = "join-tokens.json"
PUBLISHER_KUBECONFIG = "join-tokens.kubeconfig"
RUNCMD = [
    ["systemctl", "daemon-reload"],
    ["systemctl", "enable", "--now", Path(cloudinit.JOIN_PATH_UNIT).name],
]


def image_versions(lab: Lab, pool: str) -> list[Path]:
    """The pool's baked images, oldest first: `images/<pool>/<n>`, one per bake."""
    folder = Path(lab.state_dir) / IMAGES / pool
    found = [p for p in folder.glob("*") if p.name.isdigit() and (p / "image.json").is_file()]
    return sorted(found, key=lambda p: int(p.name))


def image_dir(lab: Lab, pool: str) -> Path | None:
    """The pool's newest baked image (None: never baked)."""
    versions = image_versions(lab, pool)
    return versions[-1] if versions else None


def _prune(lab: Lab, pool: str, keep: Path) -> None:
    """Remove the pool's older images no instance boots from (an overlay's lower layer must stay)."""
    used = {Path(h.image).parent for h in lab.hosts if h.image}
    for old in image_versions(lab, pool):
        if old != keep and old not in used:
            shutil.rmtree(old)


def models_dir(lab: Lab) -> Path:
    return Path(lab.state_dir) / MODELS


def model_path(lab: Lab, scale_set: str) -> Path | None:
    """The scale set's model as the lab's fabric reads it: the newest written, by the publisher on an
    API-server host (the join_tokens role) or by `superkube lab publish` (None: neither wrote one)."""
    folders = [models_dir(lab)] + [
        machines.host_dir(lab, h) / "root" / inventory.PUBLISHED_MODELS.lstrip("/")
        for h in lab.hosts
        if h.group == APISERVERS
    ]
    found = [p for p in (join_tokens.DirectoryModels(f).path(scale_set) for f in folders) if p.is_file()]
    return max(found, key=lambda p: p.stat().st_mtime) if found else None


def _pool_group(lab: Lab, pool: str) -> str:
    groups = {h.group for h in lab.hosts if h.pool == pool}
    if not groups:
        known = sorted({h.pool for h in lab.hosts if h.pool})
        raise LabError(f"pool {pool!r}: the lab has no host of it (pools here: {', '.join(known) or 'none'})")
    return groups.pop()


def _copy(source: Path, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    lab_run(["cp", "-a", "--one-file-system", f"{source}/.", str(target)], timeout=900)


def generalize(root: Path, pool_files: Iterable[str]) -> list[str]:
    """Remove what is still the builder's own from a captured root (generalize.yml ran on the host;
    its shutdown can still write, a journal file say); returns what it removed."""
    removed = []
    for pattern in (p.lstrip("/") for p in baking.generalized(pool_files) if p != "/etc/machine-id"):
        for path in root.glob(pattern):
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            else:
                path.unlink()
            removed.append("/" + str(path.relative_to(root)))
    (root / "etc" / "machine-id").write_text("")  # systemd makes a new one at first boot
    return removed


def _check(result: Any, what: str) -> None:
    if not result.ok:
        why = "; ".join(f"{h}: {r.task}: {r.message}" for h, r in result.hosts.items() if not r.healthy)
        raise LabError(f"{what} failed ({why or 'see the runner output'})")


def bake(lab: Lab, pool: str, progress: Callable[[str], None] = lambda what: None) -> Path:
    """Bake the pool's node image by converging a builder host; returns the image's folder."""
    from superkube.fleet import converge as runner

    group = _pool_group(lab, pool)
    name = f"builder-{pool}"
    newest = image_dir(lab, pool)
    target = Path(lab.state_dir) / IMAGES / pool / str(int(newest.name) + 1 if newest else 1)
    progress(f"{name}: a builder host from the base image")
    builder = hosts.add_host(lab, name, group, pool)
    try:
        root = machines.prepare_root(lab, builder, files={})  # an image build has no custom data
        machines.write_known_hosts(lab)
        inventory.write_inventory(lab)
        machines.boot(lab, builder, root)
        lab.save()
        machines.wait_ready(lab, builder, time.monotonic() + 120)
        progress(f"{name}: converging the node roles (site.yml, this host alone)")
        result = runner.converge(lab.inventory, limit=name, extra_vars=dict(baking.BAKE_VARS))
        _check(result, f"baking {pool}: converge of {name}")
        progress(f"{name}: generalizing it ({baking.GENERALIZE_PLAYBOOK})")
        files = lab.cloud_init.get(pool, {})
        result = runner.converge(
            lab.inventory,
            playbook=baking.GENERALIZE_PLAYBOOK,
            limit=name,
            extra_vars=baking.generalize_vars(name, files),
        )
        _check(result, f"baking {pool}: generalizing {name}")
        processes.terminate(builder.pid)
        builder.pid = None
        progress(f"{name}: capturing its root and containerd store")
        shutil.rmtree(target, ignore_errors=True)  # a bake that stopped halfway left it unfinished
        _copy(root, target / "root")
        _copy(machines.host_dir(lab, builder) / "containerd", target / "containerd")
        swept = generalize(target / "root", files)
        (target / "image.json").write_text(
            json.dumps({"pool": pool, "baked_at": time.time(), "swept_after_capture": swept}, indent=2)
        )
    except BaseException:
        shutil.rmtree(target, ignore_errors=True)  # this bake's own folder, never an earlier image
        raise
    finally:
        if any(h.name == name for h in lab.hosts):
            hosts.remove_host(lab, name)
        machines.write_known_hosts(lab)
        inventory.write_inventory(lab)
    _prune(lab, pool, target)
    progress(f"{pool}: image baked in {target}")
    return target


def publisher_config(lab: Lab) -> Path:
    """The publisher's settings for the lab: each pool's scale set with the plan's document, the
    model folder, and a kubeconfig of the lab's admin with its files (as a host's service has them)."""
    pki = Path(lab.state_dir) / "pki"
    kubernetes = pki / "kubernetes"
    for needed in ("ca.crt", "admin.crt", "admin.key"):
        if not (kubernetes / needed).is_file():
            raise LabError(f"{kubernetes / needed} is missing: converge the lab first")
    server = str(lab.facts["apiserver_url"])
    kubeconfig = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "lab", "cluster": {"server": server, "certificate-authority": str(kubernetes / "ca.crt")}}],
        "users": [{"name": "admin", "user": {"client-certificate": str(kubernetes / "admin.crt"),
                                             "client-key": str(kubernetes / "admin.key")}}],
        "contexts": [{"name": "admin@lab", "context": {"cluster": "lab", "user": "admin"}}],
        "current-context": "admin@lab",
    }  # fmt: skip
    (pki / PUBLISHER_KUBECONFIG).write_text(yaml.safe_dump(kubeconfig, sort_keys=False))
    if not all("custom_data" in p for p in lab.pools.values()):
        raise LabError(
            "this lab was started by an older superkube: run `superkube lab down` and `lab up` again"
        )
    documents = join_tokens.documents_of({p["scale_set"]: p["custom_data"] for p in lab.pools.values()})
    settings = lab.facts.get("join_tokens") or {}  # the inventory's superkube_join_tokens
    config = {
        "cluster": LAB_STACK,
        "server": server,
        "ca_file": str(kubernetes / "ca.crt"),
        "documents": documents,
        "ttl_s": settings.get("ttl_s", DEFAULT_TTL_S),
        "rotate_s": settings.get("rotate_s", DEFAULT_ROTATE_S),
        "directory": str(models_dir(lab)),
    }
    path = Path(lab.state_dir) / PUBLISHER_CONFIG
    path.write_text(json.dumps(config, indent=2))
    return path


def publish(lab: Lab) -> dict[str, Any]:
    """One round of the join-token publisher, run as a host runs it (its own process, where the API
    servers' address is reached); what it did."""
    config = publisher_config(lab)
    command = [
        "ip", "netns", "exec", SWITCH, sys.executable, "-m", "superkube.agents.join_tokens",
        "--config", str(config), "--kubeconfig", str(Path(lab.state_dir) / "pki" / PUBLISHER_KUBECONFIG),
        "--once", "--json",
    ]  # fmt: skip
    try:
        proc = subprocess.run(command, capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired:
        raise LabError(
            "the join-token publisher did not finish a round in 120 s: is the API server up?"
        ) from None
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise LabError(f"the join-token publisher failed: {last}")
    done: dict[str, Any] = json.loads(proc.stdout)
    return done


def instance_files(custom_data: str) -> dict[str, list[str]]:
    """What cloud-init writes from a model's custom data (path -> [content, mode]); the document's
    runcmd must be the plan's (the lab does it by enabling the join path unit)."""
    doc = cloudinit.decode(custom_data)
    if doc.get("runcmd") != RUNCMD:
        raise LabError(
            f"the model's runcmd is {doc.get('runcmd')!r}, not the plan's {RUNCMD!r}: publish again"
        )
    files = {}
    for f in doc.get("write_files") or []:
        content = str(f["content"])
        if f["path"] == cloudinit.JOIN_SCRIPT:
            content = machines.lab_join_script(content)
        files[str(f["path"])] = [content, str(f.get("permissions", "0644"))]
    if cloudinit.BOOTSTRAP_KUBECONFIG not in files:
        raise LabError(
            "the model's custom data has no join credentials: publish (superkube lab publish) first"
        )
    return files


def _require_valid_token(lab: Lab, kubeconfig: str) -> None:
    """The model's token must still be good: an instance booted with an expired or revoked one
    would only time out."""
    token = join.Token.parse(yaml.safe_load(kubeconfig)["users"][0]["user"]["token"])
    proc = subprocess.run(
        [*layer.kubectl(lab), "get", "secret", "-n", join.TOKEN_NAMESPACE, f"bootstrap-token-{token.id}", "-o", "json"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    expires = join.expiration(json.loads(proc.stdout)) if proc.returncode == 0 else None
    if expires is None or (expires - join.now()).total_seconds() < 60:
        raise LabError(
            f"the model's join token {token.id} has expired or was revoked: run `superkube lab publish` first"
        )


def _enable_join(root: Path) -> None:
    """cloud-init's runcmd on the instance's first boot: `systemctl enable --now` of the join path."""
    unit = Path(cloudinit.JOIN_PATH_UNIT).name
    wants = root / "etc/systemd/system/multi-user.target.wants"
    wants.mkdir(parents=True, exist_ok=True)
    link = wants / unit
    if not link.is_symlink():
        link.symlink_to(cloudinit.JOIN_PATH_UNIT)


@dataclass(frozen=True)
class Instance:
    name: str
    boot_to_ready_s: float
    boot_to_schedulable_s: float


def _next_names(lab: Lab, group: str, count: int) -> list[str]:
    prefix = group.removesuffix("_nodes").replace("_", "-")
    taken = {h.name for h in lab.hosts}
    names: list[str] = []
    k = 1
    while len(names) < count:
        if f"{prefix}-{k}" not in taken:
            names.append(f"{prefix}-{k}")
        k += 1
    return names


def list_nodes(lab: Lab) -> dict[str, dict[str, Any]]:
    """The Nodes by name, as the lab's API server has them; LabError when it cannot be read."""
    try:
        proc = subprocess.run([*layer.kubectl(lab), "get", "nodes", "-o", "json"], capture_output=True,
                              text=True, timeout=30)  # fmt: skip
    except subprocess.TimeoutExpired:
        raise LabError("cannot list the Nodes: no answer in 30 s") from None
    if proc.returncode != 0:
        raise LabError(f"cannot list the Nodes: {(proc.stderr.strip().splitlines() or ['?'])[-1]}")
    try:
        return {n["metadata"]["name"]: n for n in json.loads(proc.stdout)["items"]}
    except (ValueError, KeyError) as exc:
        raise LabError(f"cannot list the Nodes: {exc}") from None


def _nodes(lab: Lab) -> dict[str, dict[str, Any]]:
    """The Nodes, or none for a moment the API server does not answer (a watch waits it out)."""
    try:
        return list_nodes(lab)
    except LabError:
        return {}


def scale_out(
    lab: Lab,
    pool: str,
    count: int,
    timeout_s: float = 300,
    progress: Callable[[str], None] = lambda what: None,
) -> list[Instance]:
    """Boot `count` new instances of the pool from its image and its model's custom data, and wait
    until each is schedulable; each timed from its own boot."""
    image, files = _from_model(lab, pool)
    booted = _boot(
        lab, pool, _next_names(lab, _pool_group(lab, pool), count), image / "root", files, progress
    )
    return _until_schedulable(lab, booted, timeout_s, progress)


def _from_model(lab: Lab, pool: str) -> tuple[Path, dict[str, list[str]]]:
    """What the pool's scale set makes an instance from: its newest image and the files of its
    model's custom data, whose join token must still be good."""
    image = image_dir(lab, pool)
    if image is None:
        raise LabError(f"pool {pool!r} has no baked image: run `superkube lab bake {pool}` first")
    _pool_group(lab, pool)  # a pool the lab has: one clear line, not a KeyError below
    scale_set = lab.pools[pool]["scale_set"]
    model = model_path(lab, scale_set)
    if model is None:
        raise LabError(
            f"scale set {scale_set} has no model with join credentials: converge the API servers (their "
            "join-token publisher writes it once `superkube lab apply` made its ConfigMap), or run `superkube lab publish`"
        )
    files = instance_files(model.read_text())
    _require_valid_token(lab, files[cloudinit.BOOTSTRAP_KUBECONFIG][0])
    return image, files


def _boot(
    lab: Lab,
    pool: str,
    names: Iterable[str],
    image: Path | None,
    files: dict[str, list[str]] | None,
    progress: Callable[[str], None],
    faults: Mapping[str, str] | None = None,
) -> dict[str, float]:
    """Boot new instances of the pool, as Azure creates them: from `image` (None: the base image)
    with cloud-init's `files` (None: the plan's) written and its runcmd done (the join path unit
    enabled); when each booted (this machine's monotonic clock, which the hosts share). `faults`:
    instances whose GPUs read a fault of agent_pods.FAULTS from their first boot (a bad VM)."""
    group = _pool_group(lab, pool)
    booted: dict[str, float] = {}
    for name in names:
        host = hosts.add_host(lab, name, group, pool, image=str(image) if image else "")
        try:
            root = machines.prepare_root(lab, host, files=files)
            _enable_join(root)
            if faults and name in faults:
                vm = vmsizes.size(lab.pools[pool]["vm_size"], f"pool {pool}")
                agent_pods.write_reading(root, name, vm.name, vm.gpus, faults[name])
            if image is not None:  # the image's disk: containerd's store, with its images
                _copy(image.parent / "containerd", machines.host_dir(lab, host) / "containerd")
            booted[name] = time.monotonic()
            machines.boot(lab, host, root)
        except BaseException:
            hosts.remove_host(lab, name)
            raise
        lab.save()
        progress(f"{name}: booted from the {'base' if image is None else pool} image")
    machines.write_known_hosts(lab)
    inventory.write_inventory(lab)
    return booted


def scale_out_by_converge(
    lab: Lab,
    pool: str,
    count: int,
    timeout_s: float = 900,
    progress: Callable[[str], None] = lambda what: None,
) -> list[Instance]:
    """The join before images, for comparison: instances boot from the base image with the plan's
    custom data (no join credentials), converge runs the site playbook over them, and its bootstrap
    kubeconfig starts their join; each timed from its own boot, as `scale_out` times its instances."""
    from superkube.fleet import converge as runner

    # the plan's cloud-init files; its runcmd makes the join wait for converge's bootstrap kubeconfig
    booted = _boot(lab, pool, _next_names(lab, _pool_group(lab, pool), count), None, None, progress)
    for name in booted:
        machines.wait_ready(lab, lab.host(name), time.monotonic() + 120)
    progress(f"converging {', '.join(booted)}")
    # converge runs while the nodes are watched: each joins as soon as converge's kubelet role has
    # written its bootstrap kubeconfig, before the play ends, and is timed then
    done: list[Any] = []
    play = threading.Thread(
        target=lambda: done.append(runner.converge(lab.inventory, limit=",".join(booted))), daemon=True
    )
    play.start()

    def failed() -> str | None:
        if play.is_alive():
            return None
        if not done:
            return "converge of the new instances stopped with an error (printed above)"
        if done[0].ok:
            return None
        why = "; ".join(f"{h}: {r.task}: {r.message}" for h, r in done[0].hosts.items() if not r.healthy)
        return f"converge of the new instances failed ({why or 'see the runner output'})"

    try:
        return _until_schedulable(lab, booted, timeout_s, progress, failed)
    finally:
        play.join()


def _until_schedulable(
    lab: Lab,
    booted: Mapping[str, float],
    timeout_s: float,
    progress: Callable[[str], None],
    failed: Callable[[], str | None] = lambda: None,
) -> list[Instance]:
    ready: dict[str, float] = {}
    usable: dict[str, float] = {}
    deadline = time.monotonic() + timeout_s
    while len(usable) < len(booted):
        seen = _nodes(lab)
        at = time.monotonic()
        for name in booted:
            node = seen.get(name)
            if node is None:
                continue
            if name not in ready and is_ready(node):
                ready[name] = at
                progress(f"{name}: Ready {at - booted[name]:.1f} s after boot")
            if name not in usable and schedulable(node):
                usable[name] = at
                ready.setdefault(name, at)
                progress(f"{name}: schedulable {at - booted[name]:.1f} s after boot")
        if len(usable) == len(booted):
            break
        why = failed()
        if why:
            raise LabError(why)
        if time.monotonic() > deadline:
            late = sorted(set(booted) - set(usable))
            raise LabError(
                f"not schedulable {timeout_s:.0f} s after boot: {', '.join(late)} "
                f"(Ready: {', '.join(sorted(ready)) or 'none'}; their console logs are under {lab.state_dir}/hosts)"
            )
        time.sleep(0.5)
    return [Instance(n, round(ready[n] - booted[n], 2), round(usable[n] - booted[n], 2)) for n in booted]


def scale_in(
    lab: Lab,
    pool: str,
    count: int,
    progress: Callable[[str], None] = lambda what: None,
    names: Sequence[str] = (),
) -> list[str]:
    """Return `count` of the pool's instances, the ones `names` gives (as remediation deletes a
    named VM from its scale set) or else the newest: each drained (PodDisruptionBudgets respected),
    its Node deleted, and the instance deleted, its addresses free for the next."""
    group = _pool_group(lab, pool)
    mine = [h for h in lab.hosts if h.pool == pool and h.group == group]
    if count > len(mine):
        raise LabError(f"pool {pool} has {len(mine)} instances; cannot take {count} away")
    unknown = sorted(set(names) - {h.name for h in mine})
    if unknown or (names and len(names) != count):
        raise LabError(
            f"pool {pool}: give {count} of its instances ({', '.join(h.name for h in mine)}); "
            f"got {', '.join(names)}"
        )
    gone = list(names) or [h.name for h in mine[len(mine) - count :]]
    for name in gone:
        _drain(lab, name)
        progress(f"{name}: drained")
        _delete(lab, name)
        progress(f"{name}: instance and Node deleted")
    machines.write_known_hosts(lab)
    inventory.write_inventory(lab)
    return gone


def _drain(lab: Lab, name: str, timeout_s: int = 120) -> None:
    """Cordon the node and evict its pods (PodDisruptionBudgets respected); LabError when it cannot."""
    try:
        drain = subprocess.run(
            [*layer.kubectl(lab), "drain", name, "--ignore-daemonsets", "--delete-emptydir-data", f"--timeout={timeout_s}s"],
            capture_output=True, text=True, timeout=timeout_s + 60,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        raise LabError(
            f"{name}: drain did not end in {timeout_s + 60} s, nothing deleted: run it again"
        ) from None
    if drain.returncode != 0 and "not found" not in drain.stderr:
        last = (drain.stderr.strip().splitlines() or ["no output"])[-1]
        raise LabError(f"{name}: drain failed, nothing deleted: {last}")


def _delete(lab: Lab, name: str) -> None:
    """Delete the instance, then its Node: a kubelet of the same name must register it anew (behind
    preflight, with no cordon or verdict of the one before)."""
    hosts.remove_host(lab, name)
    try:
        proc = subprocess.run([*layer.kubectl(lab), "delete", "node", name, "--ignore-not-found", "--wait=true"],
                              capture_output=True, text=True, timeout=60)  # fmt: skip
    except subprocess.TimeoutExpired:
        raise LabError(
            f"{name}: instance deleted, but its Node was not deleted in 60 s: delete it by hand"
        ) from None
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise LabError(f"{name}: instance deleted, but not its Node ({last}): delete it by hand")


def image_version(host: Host) -> str:
    """The image version a lab instance booted from (`base`: the base image, joined by converge)."""
    return Path(host.image).parent.name if host.image else "base"


class LabPool:
    """A lab pool as a roll sees it (superkube.cluster.roll): its instances, drained through the real
    API server and replaced in place, as a scale set reimages an instance: the same name, booted
    from the new image with the model's custom data, joining with its token."""

    def __init__(
        self,
        lab: Lab,
        pool: str,
        faults: Mapping[str, str] | None = None,
        progress: Callable[[str], None] = lambda what: None,
    ) -> None:
        self.lab, self.name, self.group = lab, pool, _pool_group(lab, pool)
        self.faults = dict(faults or {})
        self.progress = progress

    def members(self) -> list[roll.Member]:
        return [
            roll.Member(h.name, image_version(h))
            for h in self.lab.hosts
            if h.pool == self.name and h.group == self.group
        ]

    def nodes(self) -> Mapping[str, Mapping[str, Any]]:
        try:
            return list_nodes(self.lab)
        except LabError as exc:
            raise roll.RollError(str(exc)) from None

    def drain(self, name: str) -> None:
        try:
            _drain(self.lab, name)
        except LabError as exc:
            raise roll.RollError(str(exc)) from None

    def cordon(self, name: str) -> None:
        self._kubectl("cordon", name)

    def uncordon(self, name: str) -> None:
        self._kubectl("uncordon", name)

    def _kubectl(self, verb: str, name: str) -> None:
        try:
            proc = subprocess.run(
                [*layer.kubectl(self.lab), verb, name], capture_output=True, text=True, timeout=60
            )
        except subprocess.TimeoutExpired:
            raise roll.RollError(f"{name}: kubectl {verb} did not answer in 60 s") from None
        # an instance whose node never registered has nothing to cordon: it is replaced all the same
        if proc.returncode != 0 and "not found" not in proc.stderr:
            raise roll.RollError(
                f"{name}: kubectl {verb}: {(proc.stderr.strip().splitlines() or ['failed'])[-1]}"
            )

    def replace(self, names: Sequence[str], version: str) -> None:
        """One instance at a time, deleted and made again: a failure costs that one instance, and
        says so."""
        try:
            image, files = _from_model(self.lab, self.name)
        except LabError as exc:
            raise roll.RollError(f"nothing replaced: {exc}") from None
        if image.name != version:
            raise roll.RollError(
                f"nothing replaced: the pool's newest image is version {image.name}, not {version}"
            )
        for name in names:
            fault = self.faults.pop(name, None)  # a bad VM comes up once; its replacement is sound
            try:
                _delete(self.lab, name)
                self.progress(f"{name}: instance and Node deleted")
                _boot(self.lab, self.name, [name], image / "root", files, self.progress,
                      {name: fault} if fault else None)  # fmt: skip
            except (LabError, OSError, subprocess.SubprocessError) as exc:
                gone = all(h.name != name for h in self.lab.hosts)
                raise roll.RollError(
                    f"{name}: {exc}"
                    + (
                        f" (the instance is gone: `superkube lab scale {self.name} +1` makes one)"
                        if gone
                        else ""
                    )
                ) from None
        machines.write_known_hosts(self.lab)
        inventory.write_inventory(self.lab)


def roll_pool(
    lab: Lab,
    pool: str,
    size: int,
    timeout_s: float = 600,
    faults: Mapping[str, str] | None = None,
    progress: Callable[[str], None] = lambda what: None,
) -> roll.RollReport:
    """Roll the pool onto its newest baked image in batches of `size` (superkube.cluster.roll).
    `faults` (the lab's only): instances that come up from the new image with a GPU fault."""
    image = image_dir(lab, pool)
    if image is None:
        raise LabError(f"pool {pool!r} has no baked image: run `superkube lab bake {pool}` first")
    lab_pool = LabPool(lab, pool, faults, progress)
    unknown = sorted(set(faults or {}) - {m.name for m in lab_pool.members()})
    if unknown:
        raise LabError(f"--fault names {', '.join(unknown)}, not instances of pool {pool}")
    bad = sorted(set((faults or {}).values()) - set(agent_pods.FAULTS))
    if bad:
        raise LabError(f"--fault {', '.join(bad)}: one of {', '.join(agent_pods.FAULTS)}")
    _from_model(lab, pool)  # a model with a good token before the first drain, not after it
    try:
        return roll.roll(lab_pool, image.name, size, timeout_s, progress)
    except roll.RollError as exc:
        raise LabError(str(exc)) from None
    finally:
        machines.write_known_hosts(lab)
        inventory.write_inventory(lab)


def logins(lab: Lab, host: Host) -> list[str]:
    """The SSH logins sshd accepted on a running host, read from its own journal (not over SSH)."""
    children = processes.children(host.pid) if host.pid else []
    if not children:
        raise LabError(f"{host.name} is not running")
    proc = subprocess.run(
        ["nsenter", "-t", str(children[0]), "-m", "-p", "journalctl", "--no-pager", "-o", "cat",
         "-t", "sshd", "-g", "Accepted"], capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    if proc.returncode not in (0, 1):
        raise LabError(f"{host.name}: cannot read its journal: {proc.stderr.strip()[:200]}")
    return [line for line in proc.stdout.splitlines() if "Accepted" in line]
