"""The cluster's node images: an Azure Compute Gallery with one image definition per pool kind.

A version of a definition is a node baked once per change: a builder VM of that kind converged with
the node roles (the same roles and variables as a converge; no join credential) and captured. The
capture happens outside `pulumi up` (it needs the running builder); the program owns the gallery and
the definitions, and a pool whose `image` is `gallery:<version>` boots that version.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import pulumi
from pulumi_azure_native import compute

from modules.common import child, require
from superkube.cluster.bake import definition_name, gallery_name

PUBLISHER = "superkube"


@dataclass(frozen=True, kw_only=True)
class NodeImagesArgs:
    cluster: str
    """Cluster name: the gallery's name and each definition's offer."""
    location: str
    """Azure region."""
    resource_group_name: pulumi.Input[str]
    """Resource group of the cluster."""
    kinds: Sequence[str]
    """Pool kinds (roles) with a definition each, e.g. ("gpu", "cpu")."""
    tags: dict[str, str] = field(default_factory=dict)
    """Tags on the gallery and its definitions (default: none)."""

    def __post_init__(self) -> None:
        require(bool(self.kinds), "kinds", "name at least one pool kind")
        require(len(set(self.kinds)) == len(self.kinds), "kinds", "each kind once")


class NodeImages(pulumi.ComponentResource):
    """The gallery and a generalized Linux (Gen2, x64) image definition per pool kind."""

    def __init__(self, name: str, args: NodeImagesArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("superkube:compute:NodeImages", name, None, opts)
        self.gallery = compute.Gallery(
            f"{name}-gallery",
            gallery_name=gallery_name(args.cluster),
            resource_group_name=args.resource_group_name,
            location=args.location,
            description=f"superkube {args.cluster}: node images baked from the node roles",
            tags=args.tags,
            opts=child(self),
        )
        self.definitions: dict[str, compute.GalleryImage] = {
            kind: compute.GalleryImage(
                f"{name}-{kind}",
                gallery_name=self.gallery.name,
                gallery_image_name=definition_name(kind),
                resource_group_name=args.resource_group_name,
                location=args.location,
                os_type=compute.OperatingSystemTypes.LINUX,
                os_state=compute.OperatingSystemStateTypes.GENERALIZED,
                hyper_v_generation=compute.HyperVGeneration.V2,
                architecture=compute.Architecture.X64,
                identifier=compute.GalleryImageIdentifierArgs(
                    publisher=PUBLISHER, offer=args.cluster, sku=kind
                ),
                tags=args.tags,
                opts=child(self),
            )
            for kind in args.kinds
        }
        self.image_ids = {kind: d.id for kind, d in self.definitions.items()}
        self.register_outputs({"gallery_id": self.gallery.id, "image_ids": self.image_ids})
