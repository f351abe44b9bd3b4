"""Compute: SSH-only login, scale-set limits, the preflight taint, autoscaler discovery, etcd disks."""

from __future__ import annotations

import base64
import binascii
import json
import shlex
from collections.abc import Iterator

import yaml

from superkube.cluster import join
from superkube.cluster.autoscaling import (
    ENABLED_TAG,
    IDENTITY_TAG,
    NAME_TAG,
    SCOPE_TAG,
    is_autoscaled,
    template_tag,
)
from superkube.cluster.cloudinit import JOIN_SCRIPT, POOL_LABEL, REGISTRATION_FILE, join_jitter_seconds
from superkube.cluster.kube import APISERVERS, ETCD_EVENTS, ETCD_MAIN, GPU_NODES
from superkube.model.policy import Finding, PlanResource, Rule, RuleConfig, StackView
from superkube.model.spec import DISK_SKUS, PREFLIGHT_TAINT_KEY
from superkube.model.vmsizes import GPU_RESOURCE

VM = "azure-native:compute:VirtualMachine"
VMSS = "azure-native:compute:VirtualMachineScaleSet"
PREFLIGHT = PREFLIGHT_TAINT_KEY
JOIN_TOKENS_VAR = "superkube_join_tokens"  # the publisher's lifetime settings, as the inventory gives them
CONVERGE_TOKEN_VAR = "kube_pki_bootstrap_token_hours"  # the lifetime of converge's own bootstrap token


def _os_profile(r: PlanResource) -> dict:
    if r.type == VMSS:
        return (r.props.get("virtualMachineProfile") or {}).get("osProfile") or {}
    return r.props.get("osProfile") or {}


def _cloud_init_files(vmss: PlanResource) -> dict[str, str] | None:
    from superkube.cluster.cloudinit import decode

    data = _os_profile(vmss).get("customData")
    if not data:
        return None
    try:
        doc = decode(data)
    except (ValueError, binascii.Error, UnicodeDecodeError, yaml.YAMLError):
        return None
    return {f.get("path", ""): f.get("content", "") for f in doc.get("write_files") or []}


def _no_password_login(view: StackView, config: RuleConfig) -> Iterator[Finding]:
    for r in view.of_type(VM) + view.of_type(VMSS):
        profile = _os_profile(r)
        linux = profile.get("linuxConfiguration") or {}
        if profile.get("adminPassword"):
            yield Finding("an admin password is set", r.urn)
        if linux.get("disablePasswordAuthentication") is not True:
            yield Finding("password authentication is not disabled", r.urn)
        if not (linux.get("ssh") or {}).get("publicKeys"):
            yield Finding("no SSH public key for the admin user", r.urn)


def _vmss_vm_limit(view: StackView, config: RuleConfig) -> Iterator[Finding]:
    limit = config.limits["vmss_vms"]
    for s in view.of_type(VMSS):
        most = s.capacity
        if most > limit:
            yield Finding(f"scale set may hold {most:,} VMs > {limit:,}", s.urn)


def _kubelet_flag(kubelet_env: str, flag: str) -> list[str]:
    """Values of one comma-separated kubelet flag in /etc/default/kubelet's KUBELET_EXTRA_ARGS."""
    _, _, value = kubelet_env.partition("KUBELET_EXTRA_ARGS=")
    try:
        words = shlex.split(value)
    except ValueError:
        return []
    args = [a for w in words for a in w.split()]
    return [v for a in args if a.startswith(f"{flag}=") for v in a.partition("=")[2].split(",")]


def _preflight_taint(view: StackView, config: RuleConfig) -> Iterator[Finding]:
    for s in view.with_role(VMSS, GPU_NODES):
        kubelet = (_cloud_init_files(s) or {}).get(REGISTRATION_FILE, "")
        if f"{PREFLIGHT}=pending:NoSchedule" not in _kubelet_flag(kubelet, "--register-with-taints"):
            yield Finding("GPU nodes register without the preflight taint", s.urn)
        if f"{PREFLIGHT}=pending" not in _kubelet_flag(kubelet, "--node-labels"):
            yield Finding("GPU nodes register without the preflight label", s.urn)
        autoscaled = is_autoscaled(s.tags)
        if autoscaled and s.tags.get(template_tag("taint", PREFLIGHT)) != "pending:NoSchedule":
            yield Finding(
                "the autoscaler's node template lacks the preflight taint, so it would plan pods onto new nodes",
                s.urn,
            )


def _autoscaler_tags(view: StackView, config: RuleConfig) -> Iterator[Finding]:
    for s in view.of_type(VMSS):
        tags = s.tags
        if not config.autoscaler_enabled:
            # the stack chose fixed-size pools: no set may carry discovery tags the autoscaler would act on
            if tags.get(ENABLED_TAG):
                yield Finding(
                    "scale set carries autoscaler discovery tags while autoscaler_enabled is false", s.urn
                )
            continue
        if not is_autoscaled(tags):
            yield Finding(f"scale set is not tagged {ENABLED_TAG}=true", s.urn)
        if config.cluster and tags.get(NAME_TAG) != config.cluster:
            yield Finding(
                f"{NAME_TAG} is {tags.get(NAME_TAG)!r}, not {config.cluster!r}",
                s.urn,
            )
        lo, hi = tags.get("min", ""), tags.get("max", "")
        if not (lo.isdigit() and hi.isdigit()) or int(lo) > int(hi):
            yield Finding(f"min/max tags are {lo!r}/{hi!r}; both must be counts with min <= max", s.urn)
        if template_tag("label", POOL_LABEL) not in tags:
            yield Finding(
                "no node-template label tags, so the autoscaler cannot scale this set from zero", s.urn
            )
        if s.role == GPU_NODES and not tags.get(template_tag("resources", GPU_RESOURCE), "").isdigit():
            yield Finding("GPU scale set does not declare its GPUs in the node template", s.urn)


def _identities(r: PlanResource) -> list[str]:
    found = (r.props.get("identity") or {}).get("userAssignedIdentities") or []
    return [str(i) for i in (found if isinstance(found, list) else found.keys())]


def _autoscaler_identity(view: StackView, config: RuleConfig) -> Iterator[Finding]:
    for vm in view.with_role(VM, APISERVERS):
        if not config.autoscaler_enabled:
            if vm.tags.get(IDENTITY_TAG):
                yield Finding(f"API server carries {IDENTITY_TAG} while autoscaler_enabled is false", vm.urn)
            continue
        if not _identities(vm):
            yield Finding("API server carries no user-assigned identity for cluster-autoscaler", vm.urn)
        for tag in (IDENTITY_TAG, SCOPE_TAG):
            if not vm.tags.get(tag):
                yield Finding(f"API server lacks the {tag} tag its autoscaler service reads", vm.urn)
    for s in view.of_type(VMSS):
        if _identities(s):
            yield Finding(
                "scale set carries a user-assigned identity: a node (any pod on it) could act as it", s.urn
            )


def _etcd_premium_disk(view: StackView, config: RuleConfig) -> Iterator[Finding]:
    attached = {
        str(d.props.get("diskName", d.name)): (d.props.get("sku") or {}).get("name")
        for d in view.of_type("azure-native:compute:Disk")
    }
    for vm in view.with_role(VM, ETCD_MAIN) + view.with_role(VM, ETCD_EVENTS):
        disks = (vm.props.get("storageProfile") or {}).get("dataDisks") or []
        if not disks:
            yield Finding("etcd member has no data disk for its data dir", vm.urn)
        for d in disks:
            managed = d.get("managedDisk") or {}
            sku = managed.get("storageAccountType")
            if sku is None and managed.get("id"):  # an existing Disk attached by ID: its own SKU counts
                sku = attached.get(str(managed["id"]).rsplit("/", 1)[-1])
            if sku not in DISK_SKUS:
                yield Finding(f"etcd data disk is {sku}, not premium or ultra", vm.urn)


def _decoded(r: PlanResource) -> dict | None:
    from superkube.cluster.cloudinit import decode

    data = _os_profile(r).get("customData")
    if not data:
        return None
    try:
        return decode(data)
    except (ValueError, binascii.Error, UnicodeDecodeError, yaml.YAMLError):
        return None


def _no_credentials_in_plan(view: StackView, config: RuleConfig) -> Iterator[Finding]:
    for r in view.of_type(VM) + view.of_type(VMSS):
        doc = _decoded(r)
        found = join.credentials_in(doc) if doc else []
        for what in found:
            yield Finding(f"custom data carries a credential: {what}", r.urn)
        try:  # anywhere else in it: runcmd, bootcmd, a document that is not cloud-config
            text = base64.b64decode(_os_profile(r).get("customData") or "").decode(errors="replace")
        except (ValueError, binascii.Error):
            text = ""
        if not found and (join.TOKEN_PATTERN.search(text) or "PRIVATE KEY-----" in text):
            yield Finding("custom data carries a bootstrap token or a private key", r.urn)
        profile = r.props.get("virtualMachineProfile") if r.type == VMSS else r.props
        if (profile or {}).get("userData"):
            yield Finding(
                "user data is set: every process on the VM, pods included, reads it from instance metadata",
                r.urn,
            )


def _join_token_lifetime(view: StackView, config: RuleConfig) -> Iterator[Finding]:
    if not view.of_type(VMSS):
        return
    expression = (config.inventory.get("hostvar_expressions") or {}).get(JOIN_TOKENS_VAR)
    settings = config.group_vars.get(JOIN_TOKENS_VAR)
    if settings is None and expression:
        try:
            settings = json.loads(expression)
        except ValueError:
            settings = expression
    if not isinstance(settings, dict):
        yield Finding(
            f"the join-token publisher has no lifetime settings ({JOIN_TOKENS_VAR}: {settings!r:.80})"
        )
        return
    try:
        join.check_lifetime(float(settings.get("ttl_s", 0)), float(settings.get("rotate_s", 0)))
    except (TypeError, ValueError) as exc:
        yield Finding(f"join tokens: {exc}")
    # converge's own token (kube_pki): the role's default is a day; a group variable may change it
    hours = config.group_vars.get(CONVERGE_TOKEN_VAR)
    if hours is not None:
        ok = isinstance(hours, int) and not isinstance(hours, bool) and 0 < hours * 3600 <= join.MAX_TTL_S
        if not ok:
            yield Finding(
                f"converge's bootstrap token: {CONVERGE_TOKEN_VAR} {hours!r} must be whole hours, above 0 and at most "
                f"{join.MAX_TTL_S // 3600}: a bootstrap token must be short-lived"
            )


def _join_jitter(view: StackView, config: RuleConfig) -> Iterator[Finding]:
    for s in view.of_type(VMSS):
        join = (_cloud_init_files(s) or {}).get(JOIN_SCRIPT, "")
        if not join_jitter_seconds(join):
            yield Finding("new nodes start their kubelet without a random join delay", s.urn)


TERMINATE_NOTICE_MIN = (5, 15)  # Azure's bounds on a scale set's terminate notification


def _notice_minutes(value: object) -> int | None:
    """Minutes of an ISO 8601 duration of whole minutes ("PT10M"); None for anything else."""
    text = str(value or "")
    if text.startswith("PT") and text.endswith("M") and text[2:-1].isdigit():
        return int(text[2:-1])
    return None


def _terminate_notification(view: StackView, config: RuleConfig) -> Iterator[Finding]:
    low, high = TERMINATE_NOTICE_MIN
    for s in view.of_type(VMSS):
        events = (s.props.get("virtualMachineProfile") or {}).get("scheduledEventsProfile") or {}
        if (events.get("osImageNotificationProfile") or {}).get("enable") is not True:
            yield Finding(
                "scale set reimages or upgrades VMs' OS without a scheduled event "
                "(osImageNotificationProfile.enable is not true)",
                s.urn,
            )
        profile = events.get("terminateNotificationProfile") or {}
        if profile.get("enable") is not True:
            yield Finding("scale set deletes VMs without a terminate notification", s.urn)
            continue
        minutes = _notice_minutes(profile.get("notBeforeTimeout"))
        if minutes is None or not low <= minutes <= high:
            yield Finding(
                f"terminate notification's notBeforeTimeout {profile.get('notBeforeTimeout')!r} is not "
                f"PT{low}M to PT{high}M",
                s.urn,
            )


RULES = [
    Rule(
        "compute-vm-no-password-login",
        "critical",
        "Every VM and scale set logs in by SSH key only.",
        "Keep linuxConfiguration.disablePasswordAuthentication true and set superkube:ssh_public_key.",
        _no_password_login,
    ),
    Rule(
        "compute-vmss-vm-limit",
        "high",
        "No scale set may hold more VMs than Azure's per-scale-set limit.",
        "Let the address plan split the pool (it does so automatically), or raise vmss_vms with a reason.",
        _vmss_vm_limit,
    ),
    Rule(
        "compute-vmss-preflight-taint",
        "high",
        "GPU nodes register behind the preflight taint and label, and the autoscaler knows it.",
        "No stack key turns this off: superkube writes the taint and label into every gpu pool's cloud-init (and node "
        "template); re-plan with `superkube plan` rather than editing customData or tags by hand.",
        _preflight_taint,
    ),
    Rule(
        "compute-autoscaler-identity-on-apiservers",
        "critical",
        "With autoscaling on, cluster-autoscaler's identity is carried by the API-server VMs that run it, "
        "tagged for its service; no scale set carries an identity, so no node can resize the fleet.",
        "Re-plan with `superkube plan`: Cluster attaches the autoscaler identity to the API servers; remove "
        "identities from node pools.",
        _autoscaler_identity,
    ),
    Rule(
        "compute-vmss-autoscaler-tags",
        "medium",
        "With autoscaling on, every scale set carries cluster-autoscaler discovery, min/max and node-template tags; with it off, none does.",
        "Re-plan with `superkube plan`: NodePool writes the tags when superkube:autoscaler_enabled is true and none "
        "when it is false.",
        _autoscaler_tags,
    ),
    Rule(
        "compute-disk-etcd-premium",
        "high",
        "Every etcd member keeps its data on a premium or ultra data disk.",
        f"Set superkube:etcd_disk_sku to {', '.join(DISK_SKUS[:-1])} or {DISK_SKUS[-1]}.",
        _etcd_premium_disk,
    ),
    Rule(
        "compute-vmss-join-jitter",
        "medium",
        "New nodes wait a random delay before registering, so hundreds joining at once do not hit the API servers together.",
        "Set superkube:autoscaler_join_jitter_seconds above 0 (300 by default).",
        _join_jitter,
        enforcement="advisory",
    ),
    Rule(
        "compute-vmss-custom-data-no-credentials",
        "critical",
        "No VM or scale set is planned with a credential in its custom data, nor with user data: Pulumi keeps "
        "every input in the stack's state for the stack's life, and user data is served to every process "
        "on the VM (pods too) by instance metadata. New nodes get their short-lived join token from the "
        "join-token publisher, which writes it into the scale sets' models.",
        "Remove the kubeconfig, token or key from the program's custom data and any userData; let the "
        "publisher (superkube.agents.join_tokens) deliver join credentials.",
        _no_credentials_in_plan,
    ),
    Rule(
        "compute-join-token-short-lived",
        "critical",
        f"Every join token the publisher issues expires, within a day ({join.MAX_TTL_S // 3600} h), and a new one is published before "
        "the last expires; converge's own bootstrap token expires within a day too: a leaked token mints node "
        "identities until it does.",
        f"Drop the {JOIN_TOKENS_VAR} group variable, or set ttl_s above 0 and at most {join.MAX_TTL_S} and "
        f"rotate_s below ttl_s; drop {CONVERGE_TOKEN_VAR}, or set it between 1 and {join.MAX_TTL_S // 3600}.",
        _join_token_lifetime,
    ),
    Rule(
        "compute-vmss-terminate-notification",
        "high",
        "Every scale set tells its VMs before deleting one (a Terminate scheduled event) and waits 5 to 15 "
        "minutes, so the node's health agent has it cordoned and drained and then approves the delete: "
        "the drain takes about three minutes with the agents' minute-long rounds and a pod's 30 s grace. "
        "It also announces a reimage or OS upgrade (osImageNotificationProfile enabled), which replaces "
        "the OS disk under a running job.",
        "Set superkube:terminate_notice_minutes between 5 and 15 (10 by default); superkube writes the scale "
        "sets' scheduledEventsProfile from it, the OS image notice included (PT15M, the one value Azure takes); "
        "re-plan rather than editing the profile by hand.",
        _terminate_notification,
    ),
]
