"""What baking a node image changes of a converge, and what its capture leaves out.

One list for both bakes: the lab's (`superkube.lab.scaleout.bake`) and Azure's capture job
(`superkube.fleet.capture`). Each converges a builder with `site.yml` and `BAKE_VARS`, then runs
`playbooks/generalize.yml` on it with `generalize_vars`, over SSH, before its disk is captured."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from superkube.cluster.join import BOOTSTRAP_KUBECONFIG

BAKE_VARS: dict[str, Any] = {"kubelet_write_bootstrap_kubeconfig": False}
"""What a bake changes of a converge: no bootstrap kubeconfig (an image carries no join credential)."""
GENERALIZE_PLAYBOOK = "generalize.yml"
GENERALIZED = (
    "/etc/hostname",
    "/etc/machine-id",
    "/etc/ssh/ssh_host_*",
    "/root/.ssh",
    "/var/lib/kubelet/pki",
    "/var/lib/superkube-lab",
    "/var/log/journal/*",
    BOOTSTRAP_KUBECONFIG,
)
"""Left out of an image: what is the builder's own (names, keys, node credentials, its GPUs' lab
reading, logs). A pattern's last part may hold shell wildcards. cloud-init's files are left out too
(`generalized`): each instance writes them from its custom data."""


def gallery_name(cluster: str) -> str:
    """The cluster's Azure Compute Gallery: names take letters, digits, underscores and periods;
    cluster names take '-'."""
    return f"gal_{cluster.replace('-', '_')}"


def definition_name(kind: str) -> str:
    """A pool kind's image definition in that gallery."""
    return f"superkube-{kind}-node"


def generalized(pool_files: Iterable[str] = ()) -> list[str]:
    """The paths a capture leaves out: `GENERALIZED`, then the files the pool's custom data writes."""
    extra = [p if p.startswith("/") else f"/{p}" for p in pool_files]
    return [*GENERALIZED, *(p for p in extra if p not in GENERALIZED)]


def generalize_vars(builder: str, pool_files: Iterable[str] = ()) -> dict[str, Any]:
    """generalize.yml's variables: the one host it may touch, and what it removes there."""
    return {"superkube_builder": builder, "superkube_generalized_paths": generalized(pool_files)}
