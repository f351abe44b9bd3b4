"""Topology: the control plane's shape (API servers, split etcd) and where it runs."""

from __future__ import annotations

import re
from collections.abc import Iterator

from superkube.cluster.kube import APISERVERS, ETCD_EVENTS, ETCD_MAIN
from superkube.model.policy import Finding, Rule, RuleConfig, StackView
from superkube.model.spec import is_quorum_size

VM = "azure-native:compute:VirtualMachine"
VMSS = "azure-native:compute:VirtualMachineScaleSet"
GPU_SIZE = re.compile(r"^Standard_N", re.IGNORECASE)  # the N families are Azure's GPU VM sizes
CONTROL_ROLES = (APISERVERS, ETCD_MAIN, ETCD_EVENTS)


def _apiserver_count(view: StackView, config: RuleConfig) -> Iterator[Finding]:
    apis = view.with_role(VM, APISERVERS)
    expected = config.apiserver_count
    if not is_quorum_size(expected):
        yield Finding(
            f"the stack configures {expected} API servers; only 5, or an odd count >= 3, is allowed"
        )
    if len(apis) != expected:
        yield Finding(f"{len(apis)} API-server VMs, expected {expected}")


def _quorum(view: StackView, role: str, label: str) -> Iterator[Finding]:
    members = view.with_role(VM, role)
    if not members:
        yield Finding(f"no {label} members: the cluster has no {label} store")
    elif len(members) < 3 or len(members) % 2 == 0:
        yield Finding(
            f"{len(members)} {label} members; etcd needs an odd count >= 3 to keep quorum through failures"
        )


def _etcd_main_quorum(view: StackView, config: RuleConfig) -> Iterator[Finding]:
    yield from _quorum(view, ETCD_MAIN, "etcd main")


def _etcd_events_present(view: StackView, config: RuleConfig) -> Iterator[Finding]:
    yield from _quorum(view, ETCD_EVENTS, "etcd events")


def _etcd_events_separate(view: StackView, config: RuleConfig) -> Iterator[Finding]:
    main = view.with_role(VM, ETCD_MAIN)
    events = view.with_role(VM, ETCD_EVENTS)
    shared = {v.props.get("vmName") for v in main} & {v.props.get("vmName") for v in events}
    for name in sorted(n for n in shared if n):
        yield Finding(f"VM {name} serves both etcd main and etcd events")
    for vm in view.of_type(VM):
        roles = {t for k, t in vm.tags.items() if k.startswith("superkube-role")}
        if {ETCD_MAIN, ETCD_EVENTS} <= roles:
            yield Finding("one VM carries both etcd roles", vm.urn)

    def placement(vms: list) -> tuple[set[str], set[str]]:
        ips, subnets = set(), set()
        for vm in vms:
            nic = view.nic_of_vm(vm)
            for ipc in (nic.props.get("ipConfigurations") or []) if nic else []:
                ips.add(ipc.get("privateIPAddress", ""))
                subnets.add((ipc.get("subnet") or {}).get("id", ""))
        return ips, subnets

    main_ips, main_subnets = placement(main)
    event_ips, event_subnets = placement(events)
    for ip in sorted((main_ips & event_ips) - {""}):
        yield Finding(f"{ip} is both an etcd main and an etcd events member")
    if main_subnets & event_subnets - {""}:
        yield Finding("etcd main and etcd events share a subnet; each store gets its own")


def _control_plane_not_on_gpu(view: StackView, config: RuleConfig) -> Iterator[Finding]:
    for vm in view.of_type(VM):
        if vm.role in CONTROL_ROLES:
            size = (vm.props.get("hardwareProfile") or {}).get("vmSize", "")
            if GPU_SIZE.match(size):
                yield Finding(f"{vm.role} VM on GPU size {size}", vm.urn)
    for vmss in view.of_type(VMSS):
        if vmss.role in CONTROL_ROLES:
            yield Finding(f"{vmss.role} runs in a node-pool scale set", vmss.urn)


RULES = [
    Rule(
        "topology-apiserver-count",
        "high",
        "Exactly 5 dedicated API servers, or the odd count >= 3 the stack configures.",
        "Set superkube:apiserver_count to 5 (or an odd count >= 3) and let the ApiServers component create them.",
        _apiserver_count,
    ),
    Rule(
        "topology-etcd-main-quorum",
        "critical",
        "The main etcd cluster has an odd member count of at least 3.",
        "Set superkube:etcd_main_count to 3 or 5.",
        _etcd_main_quorum,
    ),
    Rule(
        "topology-etcd-events-present",
        "high",
        "A separate etcd cluster for Kubernetes Events exists, with an odd member count of at least 3.",
        "Keep the events EtcdCluster; set superkube:etcd_events_count to 3 or 5.",
        _etcd_events_present,
    ),
    Rule(
        "topology-etcd-events-separate",
        "high",
        "Events etcd members run on VMs, IPs and a subnet of their own, never shared with main etcd.",
        "Give each store its own EtcdCluster; never reuse a main member for events.",
        _etcd_events_separate,
    ),
    Rule(
        "topology-controlplane-not-on-gpu",
        "high",
        "API servers and etcd never run on GPU VM sizes or in node-pool scale sets.",
        "Use a general-purpose or memory-optimised size (D or E family) for superkube:apiserver_vm_size and etcd_vm_size.",
        _control_plane_not_on_gpu,
    ),
]
