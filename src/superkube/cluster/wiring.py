"""The Kubernetes wiring as the playbooks would write it, rendered offline from a recorded plan.

The cross-layer policy rules compare three layers that each hold the same facts: the Azure plan
(NIC addresses, the load balancer's frontend, scale-set IP configurations and tags, cloud-init), the
Ansible variables (the inventory `superkube inventory` writes, plus any group variables a team adds)
and the Kubernetes configuration the roles render from them (flags, kubeconfigs, KubeletConfiguration).
Nothing here restates a role: the roles' own defaults and vars are rendered with Ansible's templating
engine over an inventory built from the plan's hosts, exactly as a converge would see them.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

PLAYBOOKS = Path(__file__).resolve().parents[3] / "playbooks"
VM = "azure-native:compute:VirtualMachine"
VMSS = "azure-native:compute:VirtualMachineScaleSet"
NIC = "azure-native:network:NetworkInterface"


@dataclass(frozen=True)
class PlanHost:
    """A host of the simulated inventory: a VM, or one instance standing for a scale set."""

    name: str
    group: str
    address: str
    urn: str
    tags: Mapping[str, str] = field(default_factory=dict)


@functools.cache
def _ansible() -> tuple[Any, Any, Any]:
    from ansible.parsing.dataloader import DataLoader
    from ansible.plugins.loader import add_all_plugin_dirs, init_plugin_loader
    from ansible.template import Templar, trust_as_template

    init_plugin_loader()
    add_all_plugin_dirs(str(PLAYBOOKS))
    return DataLoader(), Templar, trust_as_template


@functools.cache
def _role_file(role: str, part: str) -> dict[str, Any]:
    """A role's defaults or vars as loaded (templates unrendered); callers copy before changing."""
    loader, _, _ = _ansible()
    path = PLAYBOOKS / "roles" / role / part / "main.yml"
    return dict(loader.load_from_file(str(path), trusted_as_template=True) or {}) if path.is_file() else {}


def inventory_vars(azure_rm: Mapping[str, Any], tags: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The variables the Azure dynamic inventory gives a host: its hostvar_expressions, evaluated."""
    loader, templar_class, trust = _ansible()
    templar = templar_class(
        loader=loader, variables={"tags": dict(tags or {}), "private_ipv4_addresses": [""]}
    )
    out = {}
    for name, expression in azure_rm["hostvar_expressions"].items():
        if name in ("ansible_host", "ansible_user"):
            continue
        out[name] = templar.template(trust("{{ " + expression + " }}"))
    return out


class Wiring:
    """Render role variables for the hosts of a plan, over the inventory the stack would have."""

    def __init__(
        self,
        hosts: list[PlanHost],
        azure_rm: Mapping[str, Any],
        group_vars: Mapping[str, Any] | None = None,
    ) -> None:
        self.hosts = hosts
        self.azure_rm = azure_rm
        self.group_vars = dict(group_vars or {})
        self.groups: dict[str, list[str]] = {}
        for h in hosts:
            self.groups.setdefault(h.group, []).append(h.name)
        self.groups["cluster"] = [h.name for h in hosts]
        self._inventory: dict[tuple[tuple[str, str], ...], dict[str, Any]] = {}

    def host_vars(self, host: PlanHost) -> dict[str, Any]:
        key = tuple(sorted(host.tags.items()))
        if key not in self._inventory:
            self._inventory[key] = inventory_vars(self.azure_rm, host.tags)
        return {
            **self._inventory[key],
            **self.group_vars,
            "ansible_host": host.address,
            "inventory_hostname": host.name,
            "group_names": [host.group],
        }

    def template(self, role: str, host: PlanHost, name: str, **task_vars: Any) -> str:
        """The role's template `name` as a converge would write it on `host` (with the task's vars)."""
        _, _, trust = _ansible()
        text = (PLAYBOOKS / "roles" / role / "templates" / name).read_text()
        templar = self._templar(role, host)
        if task_vars:
            templar.available_variables = {**templar.available_variables, **task_vars}
        return str(templar.template(trust(text)))

    def render(self, role: str, host: PlanHost, names: list[str], **task_vars: Any) -> dict[str, Any]:
        """The named variables of `role` as `host` would see them in a converge (with the task's vars)."""
        templar = self._templar(role, host)
        if task_vars:
            templar.available_variables = {**templar.available_variables, **task_vars}
        return {n: _plain(templar.template(templar.available_variables[n])) for n in names}

    def _templar(self, role: str, host: PlanHost) -> Any:
        loader, templar_class, _ = _ansible()
        hostvars = {h.name: {"ansible_host": h.address} for h in self.hosts}
        # Ansible's precedence: role defaults < inventory and group variables < role vars
        variables = {
            **_role_file(role, "defaults"),
            **self.host_vars(host),
            **_role_file(role, "vars"),
            "groups": self.groups,
            "hostvars": hostvars,
            "inventory_dir": "/inventory",
            "ansible_managed": "superkube",
        }
        return templar_class(loader=loader, variables=variables)


def _plain(value: Any) -> Any:
    """Ansible's tagged values as plain JSON data."""
    return json.loads(json.dumps(value, default=str))


def plan_hosts(resources: list[Any]) -> list[PlanHost]:
    """Hosts of the plan by their superkube-role tag: every VM, and one instance per scale set at
    the first address of its subnet (pools register alike, so one stands for all)."""
    nics = {r.props.get("networkInterfaceName"): r for r in resources if r.type == NIC}
    hosts = []
    for r in resources:
        tags = r.props.get("tags") or {}
        role = tags.get("superkube-role")
        if not role:
            continue
        if r.type == VM:
            names = [
                str(n.get("id", "")).rsplit("/", 1)[-1]
                for n in (r.props.get("networkProfile") or {}).get("networkInterfaces", [])
            ]
            nic = nics.get(names[0]) if names else None
            configs = (nic.props.get("ipConfigurations") or []) if nic else []
            address = configs[0].get("privateIPAddress", "") if configs else ""
            hosts.append(PlanHost(r.props.get("vmName", r.name), role, address, r.urn, tags))
        elif r.type == VMSS:
            hosts.append(PlanHost(f"{r.props.get('vmScaleSetName', r.name)}-0", role, "", r.urn, tags))
    return hosts
