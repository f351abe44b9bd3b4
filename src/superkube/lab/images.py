"""Container images without a registry: built here from the project's own files as OCI image archives,
named by their content digest, and imported into each lab node's containerd by converge.

The lab's hosts reach no registry, so the images a pod needs arrive as files: the sandbox image (our
own `pause`, from images/pause), `netload` (images/netload), which measures a pod's network, and the
agents' image (superkube.lab.agents_image, made the same way from the project's wheel). An
archive is an OCI image layout in one tar: `oci-layout`, `index.json` (one linux/amd64 manifest, with
the name containerd imports it under) and the blobs.
Every byte is deterministic (sorted entries, zero times and owners, gzip without a name or time), so
the same sources, Go toolchain and zlib give the same digest, and a changed source a new name.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import subprocess
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

from superkube.harness import build

SOURCES = "images"  # in the project (the checkout's Pulumi.yaml directory): one directory per image
REGISTRY = "superkube.local"  # a name no host resolves: these images are only ever imported
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
OCI_LAYER = "application/vnd.oci.image.layer.v1.tar+gzip"


@dataclass(frozen=True)
class Image:
    name: str  # e.g. pause
    ref: str  # what containerd and pods call it: superkube.local/<name>:<digest prefix>, or a pinned name
    archive: Path  # the OCI archive on this machine
    sha256: str  # of the archive file, which converge checks after copying it
    digest: str  # of its manifest: what containerd records as the image's target

    def as_fact(self) -> dict[str, str]:
        return {"ref": self.ref, "path": str(self.archive), "sha256": self.sha256, "digest": self.digest}


def _digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


@dataclass(frozen=True)
class Link:
    """A symbolic link in a layer, to `target` (as the link itself would hold it)."""

    target: str


Entry = tuple[bytes, int] | Link  # a file's content and mode, or a link
DIRECTORY = (b"", -1)  # an entry that is a directory (0755; /tmp is 1777)


def _layer(files: dict[str, Entry]) -> bytes:
    """An uncompressed tar of `files` (path -> content and mode, a Link, or DIRECTORY), root-owned,
    time zero, sorted (so a directory comes before what it holds)."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for path in sorted(files):
            entry = files[path]
            info = tarfile.TarInfo(path.strip("/"))
            info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
            if isinstance(entry, Link):
                info.type, info.linkname, info.mode = tarfile.SYMTYPE, entry.target, 0o777
                tar.addfile(info)
            elif entry == DIRECTORY:
                info.type, info.mode = tarfile.DIRTYPE, 0o1777 if path.strip("/") == "tmp" else 0o755
                tar.addfile(info)
            else:
                content, mode = entry
                info.size, info.mode = len(content), mode
                tar.addfile(info, io.BytesIO(content))
    return out.getvalue()


def oci_archive(
    name: str,
    files: dict[str, Entry],
    entrypoint: list[str],
    out_dir: Path,
    *,
    ref: str | None = None,
    user: str = "65535:65535",
    env: list[str] | None = None,
) -> Image:
    """Write `name`'s OCI archive (one layer of `files`) into out_dir; its tag is its manifest's digest,
    unless `ref` names it (an image whose name something else pins, as the in-cluster layer pins the
    agents')."""
    layer = _layer(files)
    gz = io.BytesIO()
    with gzip.GzipFile(fileobj=gz, mode="wb", mtime=0, filename="") as z:
        z.write(layer)
    layer_gz = gz.getvalue()
    config = json.dumps(
        {
            "architecture": "amd64",
            "os": "linux",
            "config": {"Entrypoint": entrypoint, "User": user, **({"Env": env} if env else {})},
            "rootfs": {"type": "layers", "diff_ids": [_digest(layer)]},
        },
        sort_keys=True,
    ).encode()
    manifest = json.dumps(
        {
            "schemaVersion": 2,
            "mediaType": OCI_MANIFEST,
            "config": {"mediaType": OCI_CONFIG, "digest": _digest(config), "size": len(config)},
            "layers": [{"mediaType": OCI_LAYER, "digest": _digest(layer_gz), "size": len(layer_gz)}],
        },
        sort_keys=True,
    ).encode()
    tag = _digest(manifest).removeprefix("sha256:")[:16]
    ref = ref or f"{REGISTRY}/{name}:{tag}"
    index = json.dumps(
        {
            "schemaVersion": 2,
            "mediaType": OCI_INDEX,
            "manifests": [
                {
                    "mediaType": OCI_MANIFEST,
                    "digest": _digest(manifest),
                    "size": len(manifest),
                    "platform": {"architecture": "amd64", "os": "linux"},
                    "annotations": {
                        "io.containerd.image.name": ref,
                        "org.opencontainers.image.ref.name": ref.rsplit(":", 1)[1],
                    },
                }
            ],
        },
        sort_keys=True,
    ).encode()
    entries = {
        "oci-layout": json.dumps({"imageLayoutVersion": "1.0.0"}).encode(),
        "index.json": index,
        **{f"blobs/sha256/{_digest(b).removeprefix('sha256:')}": b for b in (config, manifest, layer_gz)},
    }
    out_dir.mkdir(parents=True, exist_ok=True)
    archive = out_dir / f"{name}-{tag}.tar"
    data = _layer({path: (content, 0o644) for path, content in entries.items()})
    if not archive.exists() or archive.read_bytes() != data:
        fd, tmp = tempfile.mkstemp(dir=out_dir, prefix=f".{name}.")
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, archive)
    return Image(name, ref, archive, hashlib.sha256(data).hexdigest(), _digest(manifest))


def _go_build(source: Path, out: Path) -> None:
    """A static binary from one of our own Go programs (its dependencies, if any, from the module
    proxy at its go.sum's pins)."""
    go = build.go_binary()  # the components' pinned Go
    env = {
        **build.go_env(go),
        "CGO_ENABLED": "0",
        "GOFLAGS": "-mod=mod -buildvcs=false",
        "GOOS": "linux",
        "GOARCH": "amd64",
    }
    proc = subprocess.run(
        [go, "build", "-trimpath", "-ldflags=-s -w -buildid=", "-o", str(out), "."],
        cwd=source, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    if proc.returncode != 0:
        raise build.BuildError(f"building {source.name}: {proc.stderr.strip()[-500:]}")


def go_image(name: str, cache_dir: Path = build.CACHE_DIR) -> Image:
    """images/<name>, built static, as /<name> and its entrypoint. Cached by its sources and Go version."""
    from superkube.plan import engine as planning

    source = planning.find_project() / SOURCES / name
    sums = hashlib.sha256()
    for path in sorted(p for p in source.rglob("*") if p.is_file()):
        sums.update(path.relative_to(source).as_posix().encode() + b"\0" + path.read_bytes())
    where = cache_dir / "images" / name / f"{sums.hexdigest()[:16]}-go{build.go_version()}"
    binary = where / name
    if not binary.exists():
        where.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=where) as tmp:
            _go_build(source, Path(tmp) / name)
            os.replace(Path(tmp) / name, binary)
    return oci_archive(name, {f"/{name}": (binary.read_bytes(), 0o755)}, [f"/{name}"], where)


def pause(cache_dir: Path = build.CACHE_DIR) -> Image:
    """The sandbox image (images/pause): every pod's first container."""
    return go_image("pause", cache_dir)


def netload(cache_dir: Path = build.CACHE_DIR) -> Image:
    """A pod that measures its network (images/netload): the lab's egress-limit and Service tests."""
    return go_image("netload", cache_dir)


def lab_device_plugin(cache_dir: Path = build.CACHE_DIR) -> Image:
    """The lab's stand-in for NVIDIA's device plugin (images/lab-device-plugin): advertises the GPUs of
    a lab GPU node's reading to its kubelet (superkube.lab.agent_pods)."""
    return go_image("lab-device-plugin", cache_dir)


@dataclass(frozen=True)
class Pinned:
    """A pinned component's release image: its name, where its binary lies in it, as which user."""

    component: str  # superkube.harness.build's name of the component
    binary: str  # the binary of that component
    ref: str  # the name the in-cluster layer pins
    path: str  # where the release image puts the binary (its entrypoint)
    user: str = "65532:65532"


def pinned_images() -> list[Pinned]:
    """The release images the lab makes from the components' builds, under the names the layer pins:
    cluster DNS and the two gang controllers (each release image holds the one static binary)."""
    from superkube.cluster import dns, gang

    return [
        Pinned("coredns", "coredns", dns.COREDNS_IMAGE, "/coredns"),
        Pinned(
            "scheduler-plugins-controller",
            "controller",
            gang.controller_image(build.release()["version"]),
            "/bin/controller",
        ),
        Pinned("mpi-operator", "mpi-operator", gang.MPI_OPERATOR_IMAGE, "/opt/mpi-operator"),
    ]


def normalized(ref: str) -> str:
    """An image name as the kubelet asks containerd for it: a name without a registry is Docker Hub's
    (`mpioperator/mpi-operator:0.8.2` is `docker.io/mpioperator/mpi-operator:0.8.2`), and an image
    imported under the short name is not found by the long one."""
    first, _, rest = ref.partition("/")
    if not rest:
        return f"docker.io/library/{ref}"
    if "." in first or ":" in first or first == "localhost":
        return ref
    return f"docker.io/{ref}"


def component_image(pinned: Pinned, binary: Path, cache_dir: Path = build.CACHE_DIR) -> Image:
    """`binary` as the image `pinned` names (imported under its normalized name). Cached by the
    binary's digest: the archive is made once per build, and a later lab finds it with its facts."""
    ref = normalized(pinned.ref)
    digest = hashlib.sha256(binary.read_bytes()).hexdigest()
    where = cache_dir / "images" / pinned.component / digest[:16]
    facts = where / "image.json"
    if facts.is_file():
        known = json.loads(facts.read_text())
        archive = Path(known["path"])
        if known.get("ref") == ref and archive.is_file():
            return Image(pinned.component, ref, archive, known["sha256"], known["digest"])
    image = oci_archive(
        pinned.component,
        {pinned.path: (binary.read_bytes(), 0o755)},
        [pinned.path],
        where,
        ref=ref,
        user=pinned.user,
    )
    facts.write_text(json.dumps(image.as_fact(), sort_keys=True))
    return image
