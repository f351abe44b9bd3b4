"""Capture a pool's node image on Azure: a builder VM converged with the node roles, generalized and
captured as a version of the pool kind's image definition in the cluster's gallery.

The steps, each through Resource Manager (`superkube.fleet.arm`) or converge:
1. check: the kind's image definition exists (`pulumi up` made it) and the version does not, before
   anything is made;
2. a builder VM, modelled on the pool's first scale set as Azure holds it (its subnet, its tags, so
   the cluster's azure_rm inventory puts it in the pool's group with the pool's facts), from the
   pool's marketplace base image, with no custom data;
3. `site.yml` on it alone with `BAKE_VARS` (no join credential), then `generalize.yml` (the same
   two playbooks, variables and list as the lab's bake);
4. deallocate, generalize, and the gallery version from the VM (`storageProfile.source.virtualMachineId`);
5. the builder deleted, its NIC and disk with it, also when a step before its deallocation failed
   (`keep_builder` keeps it to look at).

A step that fails once the builder is deallocated keeps it (its disk is the image; deallocated it
costs only that), and the same command goes on from it: a builder left from a run that stopped (its
tag names the version) is used again, one deallocated goes on to be generalized, one generalized
straight to the capture; a version a failed capture left is deleted and made again."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from superkube.cluster import bake, inventory
from superkube.fleet.arm import COMPUTE_API, Arm, ArmError
from superkube.model.ipam import AddressPlan
from superkube.model.spec import GALLERY_IMAGE, ClusterSpec, NodePool

GALLERY_API = "2024-03-03"
NETWORK_API = "2024-05-01"
NIC_API_VERSION = "2020-11-01"  # networkProfile.networkApiVersion: NICs made with the VM
BUILDER_TAG = inventory.BUILDER_TAG
VERSION = re.compile(r"^(\d+)\.(\d+)\.(\d+)$")
# tags the builder takes from its pool's scale set: what the inventory groups and filters on
INVENTORY_TAGS = ("cluster", "superkube-role", "superkube-pool")


class CaptureError(RuntimeError):
    """A capture that cannot start or did not finish: one line saying what and how to go on."""


class Converge(Protocol):
    def __call__(self, playbook: str, limit: str, extra_vars: dict[str, Any]) -> None: ...


@dataclass(frozen=True)
class Target:
    """Where the capture happens and what it makes, from the stack and the subscription."""

    subscription: str
    cluster: str
    spec: ClusterSpec
    pool: str
    version: str
    scale_set: str  # the pool's first scale set: the builder's model
    pool_files: tuple[str, ...] = ()  # what the pool's custom data writes: left out of the image

    @property
    def group(self) -> str:
        return f"/subscriptions/{self.subscription}/resourceGroups/{inventory.resource_group(self.cluster)}"

    @property
    def kind(self) -> str:
        return self.pool_spec.role

    @property
    def pool_spec(self) -> NodePool:
        return next(p for p in self.spec.node_pools if p.name == self.pool)

    @property
    def builder(self) -> str:
        return f"bld-{self.cluster}-{self.pool}-{self.version.replace('.', '-')}"[:64]

    @property
    def vm(self) -> str:
        return f"{self.group}/providers/Microsoft.Compute/virtualMachines/{self.builder}"

    @property
    def definition(self) -> str:
        gallery, image = bake.gallery_name(self.cluster), bake.definition_name(self.kind)
        return f"{self.group}/providers/Microsoft.Compute/galleries/{gallery}/images/{image}"

    @property
    def image_version(self) -> str:
        return f"{self.definition}/versions/{self.version}"

    @property
    def scale_set_path(self) -> str:
        return f"{self.group}/providers/Microsoft.Compute/virtualMachineScaleSets/{self.scale_set}"


def target(
    spec: ClusterSpec,
    addresses: AddressPlan,
    subscription: str,
    pool: str,
    version: str,
    pool_files: tuple[str, ...] = (),
) -> Target:
    """The capture's target; CaptureError (one line) when the pool or version cannot be baked."""
    pools = {p.name: p for p in spec.node_pools}
    if pool not in pools:
        raise CaptureError(f"pool {pool!r}: the stack has no such pool (pools: {', '.join(sorted(pools))})")
    match = VERSION.match(version)
    if not match or any(int(part) > 2**31 - 1 for part in match.groups()):
        raise CaptureError(f"--version {version!r}: write a gallery version as major.minor.patch, e.g. 1.4.0")
    if not re.fullmatch(r"[0-9a-fA-F-]{36}", subscription):
        raise CaptureError(f"--subscription {subscription!r}: give the subscription's ID (a GUID)")
    base_image(pools[pool])  # raises for a gallery pool with no base image
    sets = [s.name for s in addresses.scale_sets if s.pool == pool]
    return Target(subscription, addresses.cluster, spec, pool, version, sets[0], pool_files)


def base_image(pool: NodePool) -> dict[str, str]:
    """The marketplace image the builder boots: the pool's base_image, else its own marketplace image."""
    image = pool.base_image or (None if pool.image.startswith(GALLERY_IMAGE) else pool.image)
    if image is None:
        raise CaptureError(
            f"pool {pool.name} boots {pool.image}: set its base_image to the marketplace image a bake "
            "starts from (publisher:offer:sku:version)"
        )
    publisher, offer, sku, version = image.split(":")
    return {"publisher": publisher, "offer": offer, "sku": sku, "version": version}


def builder_body(t: Target, scale_set: Mapping[str, Any]) -> dict[str, Any]:
    """The builder VM: the pool's VM size and base image, in its scale set's subnet with its tags, the
    cluster's admin key, no custom data; its NIC and disk go with it when it is deleted."""
    profile = (scale_set.get("properties") or {}).get("virtualMachineProfile") or {}
    try:
        nic = profile["networkProfile"]["networkInterfaceConfigurations"][0]["properties"]
        subnet = nic["ipConfigurations"][0]["properties"]["subnet"]["id"]
    except (KeyError, IndexError, TypeError):
        raise CaptureError(
            f"scale set {t.scale_set} as Azure holds it names no subnet: run pulumi up"
        ) from None
    tags = {k: v for k, v in (scale_set.get("tags") or {}).items() if k in INVENTORY_TAGS}
    pool, admin = t.pool_spec, t.spec.admin_username
    body: dict[str, Any] = {
        "location": scale_set.get("location", t.spec.region),
        "tags": {**tags, BUILDER_TAG: t.version},
        "properties": {
            "hardwareProfile": {"vmSize": pool.vm_size},
            "storageProfile": {
                "imageReference": base_image(pool),
                "osDisk": {
                    "createOption": "FromImage",
                    "deleteOption": "Delete",
                    "diskSizeGB": pool.os_disk_gb,
                    "managedDisk": {"storageAccountType": "Premium_LRS"},
                },
            },
            "osProfile": {
                "computerName": t.builder,
                "adminUsername": admin,
                "linuxConfiguration": {
                    "disablePasswordAuthentication": True,
                    "ssh": {
                        "publicKeys": [
                            {"path": f"/home/{admin}/.ssh/authorized_keys", "keyData": t.spec.ssh_public_key}
                        ]
                    },
                },
            },
            "networkProfile": {
                "networkApiVersion": NIC_API_VERSION,
                "networkInterfaceConfigurations": [
                    {
                        "name": f"{t.builder}-nic",
                        "properties": {
                            "primary": True,
                            "deleteOption": "Delete",
                            "ipConfigurations": [
                                {"name": "primary", "properties": {"primary": True, "subnet": {"id": subnet}}}
                            ],
                        },
                    }
                ],
            },
        },
    }
    if scale_set.get("zones"):
        body["zones"] = list(scale_set["zones"])[:1]
    return body


def version_body(t: Target, location: str) -> dict[str, Any]:
    return {
        "location": location,
        "tags": {"cluster": t.cluster, "superkube-pool": t.pool},
        "properties": {
            "storageProfile": {"source": {"virtualMachineId": t.vm}},
            "publishingProfile": {
                "targetRegions": [
                    {"name": location, "regionalReplicaCount": 1, "storageAccountType": "Premium_LRS"}
                ],
                "replicaCount": 1,
                "excludeFromLatest": False,
            },
        },
    }


def statuses(arm: Arm, vm: str) -> set[str]:
    view = arm.get(f"{vm}/instanceView", COMPUTE_API) or {}
    return {s.get("code", "") for s in view.get("statuses") or []}


def capture(
    arm: Arm,
    t: Target,
    converge: Converge,
    progress: Callable[[str], None] = lambda line: None,
    keep_builder: bool = False,
) -> dict[str, Any]:
    """Bake and capture `t`; what it made. CaptureError or ArmError (one line) when it could not."""
    definition = arm.get(t.definition, GALLERY_API)
    if definition is None:
        raise CaptureError(
            f"the gallery has no image definition for {t.kind} nodes ({t.definition}): run pulumi up first"
        )
    state = (definition.get("properties") or {}).get("osState")
    if state != "Generalized":
        raise CaptureError(f"{t.definition} holds {state} images; a node image must be Generalized")
    version = arm.get(t.image_version, GALLERY_API)
    if version is not None:
        if (version.get("properties") or {}).get("provisioningState") != "Failed":
            raise CaptureError(
                f"gallery:{t.version} of the {t.kind} node image exists already: capture a new version"
            )
        progress(f"gallery:{t.version}: deleting the version a failed capture left")
        arm.delete(t.image_version, GALLERY_API, f"deleting the failed gallery:{t.version}")
    scale_set = arm.get(t.scale_set_path, COMPUTE_API)
    if scale_set is None:
        raise CaptureError(f"scale set {t.scale_set} does not exist: run pulumi up first")
    location = definition.get("location") or scale_set.get("location", t.spec.region)

    existing = arm.get(t.vm, COMPUTE_API)
    if existing is not None and (existing.get("tags") or {}).get(BUILDER_TAG) != t.version:
        raise CaptureError(f"a VM named {t.builder} exists and is not this capture's builder: delete it")
    ours = existing is not None  # from here on the builder is this capture's to clean up
    captured = False  # past deallocation the builder's disk is the image: kept if a later step fails
    image: Any = None
    try:
        if existing is None:
            progress(f"{t.builder}: creating the builder VM ({t.pool_spec.vm_size}, from its base image)")
            ours = True  # a creation that fails halfway still leaves a VM, a NIC or a disk
            arm.put(t.vm, COMPUTE_API, builder_body(t, scale_set), f"creating builder {t.builder}")
        else:
            progress(f"{t.builder}: using the builder a stopped capture left")
        state = statuses(arm, t.vm)
        if "OSState/generalized" not in state:
            if "PowerState/deallocated" not in state:
                progress(f"{t.builder}: converging the node roles (site.yml, this host alone)")
                converge("site.yml", t.builder, dict(bake.BAKE_VARS))
                progress(f"{t.builder}: generalizing it ({bake.GENERALIZE_PLAYBOOK})")
                converge(bake.GENERALIZE_PLAYBOOK, t.builder, bake.generalize_vars(t.builder, t.pool_files))
                progress(f"{t.builder}: deallocating the VM")
                arm.post(f"{t.vm}/deallocate", COMPUTE_API, f"deallocating {t.builder}")
            captured = True
            progress(f"{t.builder}: generalizing the VM")
            arm.post(f"{t.vm}/generalize", COMPUTE_API, f"generalizing {t.builder}")
        captured = True
        progress(f"gallery:{t.version}: capturing {t.builder} (replication takes minutes)")
        image = arm.put(
            t.image_version, GALLERY_API, version_body(t, location), f"capturing gallery:{t.version}"
        )
    except BaseException:
        if ours and captured:
            keep_builder = True
            progress(
                f"{t.builder}: kept, deallocated (it costs its disk): run the same command again to go on "
                "from it, or delete it"
            )
        raise
    finally:
        deleted = False
        if keep_builder:
            if image is not None:
                progress(f"{t.builder}: kept (--keep-builder); delete it when done")
        elif ours:
            progress(f"{t.builder}: deleting the builder, its NIC and disk")
            try:
                arm.delete(t.vm, COMPUTE_API, f"deleting builder {t.builder}")
                deleted = True
            except ArmError as exc:
                progress(f"{t.builder}: not deleted ({exc}); delete it by hand")
    return {
        "pool": t.pool,
        "kind": t.kind,
        "version": t.version,
        "image": f"{GALLERY_IMAGE}{t.version}",
        "id": (image or {}).get("id", t.image_version),
        "builder": t.builder,
        "builder_deleted": deleted,
    }


def pool_files(recorded: Any, pool: str) -> tuple[str, ...]:
    """The files the pool's custom data writes, from a recorded plan (Azure never returns custom data)."""
    from superkube.cluster import cloudinit

    for vmss in recorded.of_type("azure-native:compute:VirtualMachineScaleSet"):
        if vmss.inputs["tags"].get("superkube-pool") == pool:
            doc = cloudinit.decode(vmss.inputs["virtualMachineProfile"]["osProfile"]["customData"])
            return tuple(f["path"] for f in doc.get("write_files") or [])
    return ()
