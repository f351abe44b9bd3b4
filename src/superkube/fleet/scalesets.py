"""A node pool's scale sets on Azure as a roll sees them (`superkube.cluster.roll.Pool`): the
instances through Resource Manager, their Nodes through the API server.

- members: every instance of the pool's scale sets, named as its Node is (its computer name), with
  the image version it runs (`gallery:` version from its image reference);
- cordon, drain, uncordon: through the API server. A drain evicts every pod but DaemonSet and mirror
  pods, in every namespace (the instance goes away), so PodDisruptionBudgets hold, and waits until
  they are gone; one that cannot finish in time stops the roll with the pods that are left;
- replace, per scale set, the batch's instances together:
  1. power off, so the old kubelet stops;
  2. delete their Nodes, so each new kubelet registers its own behind preflight, with no cordon,
     taint or verdict of the one before (a kubelet updates a Node of its name if one is there);
  3. `manualupgrade`: the scale set's upgrade policy is Manual, so this is where an instance takes
     the model, the new image (its OS disk made again from it) and the model's custom data with the
     current join token. The computer name stays;
  4. start (an upgraded instance that is already running is left so).
The roll's decisions (which, when, when to stop) are `superkube.cluster.roll`'s, shared with the lab."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from superkube.agents.kubeapi import Kube, refused, unreachable
from superkube.agents.node_health import evictable
from superkube.cluster import roll
from superkube.fleet.arm import COMPUTE_API, Arm, ArmError
from superkube.model.spec import POOL_LABEL


def version_of(image_reference: Mapping[str, Any], model: Mapping[str, Any] | None = None) -> str:
    """The image version an image reference names: a gallery version's number, or the marketplace
    image as publisher:offer:sku:version. An instance of a model on a marketplace image's `latest`
    runs that image's then-latest version (`exactVersion`): it counts as on the model's."""
    ref = str(image_reference.get("id") or "")
    at = ref.lower().rfind("/versions/")
    if at >= 0:
        return ref[at + len("/versions/") :]
    keys = ("publisher", "offer", "sku")
    parts = [str(image_reference.get(k, "")).lower() for k in keys]
    version = image_reference.get("exactVersion") or image_reference.get("version", "")
    on_latest = model is not None and str(model.get("version", "")).lower() == "latest"
    if on_latest and [str(model.get(k, "")).lower() for k in keys] == parts:  # type: ignore[union-attr]
        version = "latest"
    return ":".join([*parts, str(version)])


class ScaleSetPool:
    def __init__(
        self,
        arm: Arm,
        kube: Kube,
        group: str,
        pool: str,
        scale_sets: Sequence[str],
        drain_timeout_s: float = 900.0,
        progress: Callable[[str], None] = lambda line: None,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.arm, self.kube, self.name, self.scale_sets = arm, kube, pool, list(scale_sets)
        self.group = group.rstrip("/")
        self.drain_timeout_s, self.progress, self.sleep, self.clock = drain_timeout_s, progress, sleep, clock
        self._where: dict[str, tuple[str, str]] = {}  # node name -> (scale set, instance ID)

    def path(self, scale_set: str) -> str:
        return f"{self.group}/providers/Microsoft.Compute/virtualMachineScaleSets/{scale_set}"

    # --- what the pool runs and should run ---------------------------------------------------------

    def model_version(self) -> str:
        """The version every scale set of the pool's model names; RollError when they differ."""
        versions = {}
        for s in self.scale_sets:
            try:
                model = self._model(s)
            except ArmError as exc:
                raise roll.RollError(str(exc)) from None
            versions[s] = version_of(model, model)
        if len(set(versions.values())) > 1:
            said = ", ".join(f"{s}: {v}" for s, v in versions.items())
            raise roll.RollError(
                f"pool {self.name}'s scale sets name different images ({said}): run pulumi up"
            )
        return next(iter(versions.values()))

    def members(self) -> list[roll.Member]:
        out = []
        self._where = {}
        for s in self.scale_sets:
            try:
                model = self._model(s)
                instances = self.arm.list(f"{self.path(s)}/virtualMachines", COMPUTE_API)
            except ArmError as exc:
                raise roll.RollError(str(exc)) from None
            for vm in sorted(instances, key=lambda v: int(v.get("instanceId") or 0)):
                props = vm.get("properties") or {}
                # as the kubelet names its Node: the computer name, lower-cased
                name = str((props.get("osProfile") or {}).get("computerName") or vm.get("name", "")).lower()
                image = (props.get("storageProfile") or {}).get("imageReference") or {}
                self._where[name] = (s, str(vm.get("instanceId")))
                out.append(roll.Member(name, version_of(image, model)))
        return out

    def _model(self, scale_set: str) -> Mapping[str, Any]:
        found = self.arm.get(self.path(scale_set), COMPUTE_API)
        if found is None:
            raise roll.RollError(f"scale set {scale_set} does not exist: run pulumi up")
        image: Mapping[str, Any] = found["properties"]["virtualMachineProfile"]["storageProfile"][
            "imageReference"
        ]
        return image

    # --- the API server's side ---------------------------------------------------------------------

    def nodes(self) -> Mapping[str, Mapping[str, Any]]:
        try:
            found = self.kube.nodes(f"{POOL_LABEL}={self.name}")
        except Exception as exc:  # the client raises its own and urllib3's
            raise roll.RollError(f"the Nodes cannot be listed: {_said(exc)}") from None
        return {n["metadata"]["name"]: n for n in found}

    def cordon(self, name: str) -> None:
        self._unschedulable(name, True)

    def uncordon(self, name: str) -> None:
        self._unschedulable(name, None)

    def _unschedulable(self, name: str, value: bool | None) -> None:
        try:
            self.kube.patch_node(name, {"spec": {"unschedulable": value}})
        except Exception as exc:
            if "404" in refused(exc):  # never registered: nothing to cordon, it is replaced all the same
                return
            raise roll.RollError(f"{'cordon' if value else 'uncordon'}: {_said(exc)}") from None

    def drain(self, name: str) -> None:
        """Evict every pod but DaemonSet and mirror pods, and wait until they are gone."""
        deadline = self.clock() + self.drain_timeout_s
        while True:
            try:
                pods = self.kube.pods_on(name)
                left = evictable(pods, protected=())
                leaving = {
                    (p["metadata"]["namespace"], p["metadata"]["name"])
                    for p in pods
                    if p["metadata"].get("deletionTimestamp")
                }
                held = [p for p in left if (p.namespace, p.name) not in leaving and not self.kube.evict(p)]
            except Exception as exc:
                if unreachable(exc) and self.clock() < deadline:
                    self.sleep(2.0)
                    continue
                raise roll.RollError(f"drain: {_said(exc)}") from None
            if not left:
                return
            if self.clock() > deadline:
                why = f"{len(held)} held by a PodDisruptionBudget" if held else "still terminating"
                names = ", ".join(f"{p.namespace}/{p.name}" for p in left[:5])
                raise roll.RollError(
                    f"{len(left)} pods left after {self.drain_timeout_s:.0f} s ({why}: {names}); "
                    "nothing replaced"
                )
            self.sleep(2.0)

    # --- the instances -----------------------------------------------------------------------------

    def replace(self, names: Sequence[str], version: str) -> None:
        if not self._where:
            self.members()
        unknown = [n for n in names if n not in self._where]
        if unknown:
            raise roll.RollError(f"nothing replaced: {', '.join(unknown)} is no instance of pool {self.name}")
        model = self.model_version()
        if model != version:
            raise roll.RollError(
                f"nothing replaced: the pool's model is {model}, not {version}: run pulumi up"
            )
        by_set: dict[str, list[str]] = {}
        for n in names:
            by_set.setdefault(self._where[n][0], []).append(n)
        for s, members in by_set.items():
            ids = {"instanceIds": [self._where[n][1] for n in members]}
            which = ", ".join(members)
            step = "power off"
            try:
                self.arm.post(f"{self.path(s)}/poweroff", COMPUTE_API, f"powering off {which}", ids)
                step = "delete the Nodes"
                for n in members:
                    self.kube.delete_node(n)
                self.progress(f"{which}: powered off, Nodes deleted")
                step = "manual upgrade"
                self.arm.post(f"{self.path(s)}/manualupgrade", COMPUTE_API, f"upgrading {which}", ids)
                step = "start"
                self.arm.post(f"{self.path(s)}/start", COMPUTE_API, f"starting {which}", ids)
            except ArmError as exc:
                raise roll.RollError(f"{which}: {step}: {exc}") from None
            except Exception as exc:
                raise roll.RollError(f"{which}: {step}: {_said(exc)}") from None
            self.progress(f"{which}: on the model's image, starting")


def _said(exc: BaseException) -> str:
    return refused(exc) or str(exc).splitlines()[0][:200]
