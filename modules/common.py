"""Small helpers every component shares: tags, child options, VM profile pieces."""

from __future__ import annotations

from collections.abc import Mapping

import pulumi
from pulumi_azure_native import compute, network

from modules import azure

if azure.planning():  # under `superkube plan`'s engine, not `pulumi up`: each name from its own module
    azure.load_by_name(*azure.PACKAGES)  # before any component reads a name of them

ROLE_TAG = "superkube-role"  # Ansible's dynamic inventory groups hosts by this tag


def child(parent: pulumi.Resource, **kwargs: object) -> pulumi.ResourceOptions:
    return pulumi.ResourceOptions(parent=parent, **kwargs)  # type: ignore[arg-type]


def tagged(tags: Mapping[str, str], **extra: str) -> dict[str, str]:
    return {**tags, **{k.replace("_", "-"): v for k, v in extra.items()}}


def image_reference(image: str) -> compute.ImageReferenceArgs:
    publisher, offer, sku, version = image.split(":")
    return compute.ImageReferenceArgs(publisher=publisher, offer=offer, sku=sku, version=version)


def linux_ssh_only(admin_username: str, ssh_public_key: str) -> compute.LinuxConfigurationArgs:
    """Linux login by SSH key only: password authentication is disabled on every VM."""
    return compute.LinuxConfigurationArgs(
        disable_password_authentication=True,
        ssh=compute.SshConfigurationArgs(
            public_keys=[
                compute.SshPublicKeyArgs(
                    path=f"/home/{admin_username}/.ssh/authorized_keys", key_data=ssh_public_key
                )
            ]
        ),
        provision_vm_agent=True,
    )


def require(condition: bool, field: str, message: str) -> None:
    """Fail at construction, naming the args field."""
    if not condition:
        raise ValueError(f"{field}: {message}")


def deny_internet_inbound() -> network.SecurityRuleArgs:
    """Azure's default rules already admit VNet traffic; this refuses the internet explicitly."""
    return network.SecurityRuleArgs(
        name="deny-internet-inbound",
        priority=4000,
        direction="Inbound",
        access="Deny",
        protocol="*",
        source_address_prefix="Internet",
        source_port_range="*",
        destination_address_prefix="*",
        destination_port_range="*",
    )
