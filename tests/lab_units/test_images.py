"""The node images as OCI archives: built from the project's own files, named by content, the same
bytes every time (no lab needed; the lab's nodes import them in test_running_nodes)."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import shutil
import signal
import socket
import subprocess
import tarfile
import time
from pathlib import Path
from typing import Any

from superkube.lab import images


def _entries(archive: Path) -> dict[str, bytes]:
    with tarfile.open(archive) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}  # type: ignore[union-attr]


def _blob(entries: dict[str, bytes], digest: str) -> bytes:
    data = entries[f"blobs/sha256/{digest.removeprefix('sha256:')}"]
    assert "sha256:" + hashlib.sha256(data).hexdigest() == digest  # content-addressed, as OCI says
    return data


def test_an_archive_is_an_oci_layout_whose_name_is_its_digest(tmp_path: Path) -> None:
    image = images.oci_archive(
        "tool", {"/bin/tool": (b"#!/bin/sh\necho hi\n", 0o755)}, ["/bin/tool"], tmp_path
    )
    entries = _entries(image.archive)
    assert json.loads(entries["oci-layout"]) == {"imageLayoutVersion": "1.0.0"}
    (entry,) = json.loads(entries["index.json"])["manifests"]
    assert entry["platform"] == {"architecture": "amd64", "os": "linux"}
    assert entry["annotations"]["io.containerd.image.name"] == image.ref
    assert image.ref == f"{images.REGISTRY}/tool:{entry['digest'].removeprefix('sha256:')[:16]}"
    manifest = json.loads(_blob(entries, entry["digest"]))
    config = json.loads(_blob(entries, manifest["config"]["digest"]))
    (layer_ref,) = manifest["layers"]
    layer = gzip.decompress(_blob(entries, layer_ref["digest"]))
    assert config["rootfs"]["diff_ids"] == ["sha256:" + hashlib.sha256(layer).hexdigest()]
    assert config["config"]["Entrypoint"] == ["/bin/tool"]
    with tarfile.open(fileobj=io.BytesIO(layer)) as tar:
        (member,) = tar.getmembers()
        assert (member.name, member.mode, member.uid, member.mtime) == ("bin/tool", 0o755, 0, 0)
    assert image.sha256 == hashlib.sha256(image.archive.read_bytes()).hexdigest()


def test_the_same_files_give_the_same_bytes_and_a_change_gives_a_new_name(tmp_path: Path) -> None:
    files = {"/a": (b"one", 0o644)}
    first = images.oci_archive("x", files, ["/a"], tmp_path / "1")
    again = images.oci_archive("x", files, ["/a"], tmp_path / "2")
    assert first.ref == again.ref and first.archive.read_bytes() == again.archive.read_bytes()
    changed = images.oci_archive("x", {"/a": (b"two", 0o644)}, ["/a"], tmp_path / "3")
    assert changed.ref != first.ref


def _static_binary(image: images.Image, tmp_path: Path) -> Path:
    """The image's one program, taken out of its layer into tmp_path, after checking it is static."""
    assert image.ref.startswith(f"{images.REGISTRY}/{image.name}:")
    entries = _entries(image.archive)
    (entry,) = json.loads(entries["index.json"])["manifests"]
    manifest = json.loads(_blob(entries, entry["digest"]))
    layer = gzip.decompress(_blob(entries, manifest["layers"][0]["digest"]))
    with tarfile.open(fileobj=io.BytesIO(layer)) as tar:
        binary = tar.extractfile(image.name).read()  # type: ignore[union-attr]
    assert binary[:4] == b"\x7fELF" and b"/lib64/ld-linux" not in binary  # no interpreter: static
    path = tmp_path / image.name
    path.write_bytes(binary)
    path.chmod(0o755)
    return path


def test_pause_is_built_static_and_exits_on_sigterm(tmp_path: Path) -> None:
    image = images.pause()
    path = _static_binary(image, tmp_path)
    with subprocess.Popen([str(path)], stderr=subprocess.PIPE, text=True) as proc:
        # not PID 1 here: it says so once its handlers are in place (the Go runtime catches every
        # signal from its start, so the process's caught-signal mask cannot tell when they are ours)
        assert proc.stderr is not None and "not PID 1" in proc.stderr.readline()
        assert proc.poll() is None  # it waits
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
    assert images.pause().ref == image.ref  # cached: the same sources, the same name


def test_netload_counts_what_arrives_and_reports_it_as_the_sender(tmp_path: Path) -> None:
    path = _static_binary(images.netload(), tmp_path)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with subprocess.Popen([str(path), "sink", str(port)], stderr=subprocess.PIPE) as sink:
        try:
            deadline = time.monotonic() + 10
            while True:
                sent = subprocess.run(
                    [str(path), "send", f"127.0.0.1:{port}", "0.5"], capture_output=True, text=True
                )
                if sent.returncode == 0 or time.monotonic() > deadline:
                    break
                time.sleep(0.1)  # the sink is not listening yet
            assert sent.returncode == 0, sent.stderr
            got = json.loads(sent.stdout)
            assert got["bytes"] > 1 << 20 and 0.3 < got["seconds"] < 5, got
        finally:
            sink.terminate()
    wrong = subprocess.run([str(path), "send", "127.0.0.1:1", "soon"], capture_output=True, text=True)
    assert wrong.returncode == 1 and wrong.stderr.count("\n") == 1 and "SECONDS" in wrong.stderr


def test_the_agents_image_runs_every_agent_on_its_own_python(tmp_path: Path, flagship_plan: Any) -> None:
    """The agents' image alone (its layer unpacked, nothing of this machine's), as its user: every
    entry point the layer and the node roles start answers, and the package inside computes the very
    name the image is imported under, which is the layer's pin."""
    from superkube.agents import AGENTS_IMAGE
    from superkube.lab import agents_image, rootfs
    from tests.agents.test_wheel import HOST_PROGRAMS, layer_programs

    base = rootfs.build_base_image(lambda what, fraction: None)
    image = agents_image.agents(base)
    assert image.ref == AGENTS_IMAGE
    # built again from nothing (its own cache): the same bytes, pip's record of where the wheel was
    # and every other trace of the build left out
    again = agents_image.agents(base, tmp_path / "cache")
    assert again.archive != image.archive and (again.sha256, again.digest) == (image.sha256, image.digest)
    entries = _entries(image.archive)
    (entry,) = json.loads(entries["index.json"])["manifests"]
    assert entry["annotations"]["io.containerd.image.name"] == AGENTS_IMAGE
    assert entry["digest"] == image.digest
    manifest = json.loads(_blob(entries, entry["digest"]))
    config = json.loads(_blob(entries, manifest["config"]["digest"]))["config"]
    assert config["User"] == "65532:65532" and config["Entrypoint"] == ["/usr/local/bin/python"]
    root = tmp_path / "root"
    with tarfile.open(
        fileobj=io.BytesIO(gzip.decompress(_blob(entries, manifest["layers"][0]["digest"])))
    ) as tar:
        names = tar.getnames()
        tar.extractall(root, filter="tar")
    assert not [n for n in names if n.split("/")[-1] in ("pulumi", "ansible", "ansible_runner")]

    def python(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [shutil.which("chroot") or "chroot", "--userspec=65532:65532", str(root), *config["Entrypoint"], *args],
            env=dict(e.split("=", 1) for e in config["Env"]), capture_output=True, text=True, timeout=120,
        )  # fmt: skip

    for name in sorted(layer_programs(flagship_plan) | set(HOST_PROGRAMS)):
        done = python("-m", f"superkube.agents.{name}", "--help")
        assert done.returncode == 0 and "usage:" in done.stdout, (name, done.stderr)
    # the libraries the entry points import only when they work (the approver's x509, NVML)
    inside = python(
        "-c", "import superkube.agents as a, kubernetes, pynvml, cryptography.x509; print(a.AGENTS_IMAGE)"
    )
    assert inside.returncode == 0 and inside.stdout.strip() == AGENTS_IMAGE, inside.stderr


def test_the_lab_example_job_runs_the_trainer_image_the_lab_builds() -> None:
    """The example names the trainer by the name `lab up` imports it under, and the component images
    go in under the names the kubelet asks containerd for (a Docker Hub name in full)."""
    from superkube.cluster import jobs
    from superkube.lab import trainer_image

    job = jobs.load(Path(__file__).resolve().parents[2] / "examples" / "jobs" / "allreduce-lab.yaml")
    assert job.image == trainer_image.TRAINER_IMAGE
    assert images.normalized("mpioperator/mpi-operator:0.8.2") == "docker.io/mpioperator/mpi-operator:0.8.2"
    assert (
        images.normalized("registry.k8s.io/coredns/coredns:v1.13.1")
        == "registry.k8s.io/coredns/coredns:v1.13.1"
    )
    assert images.normalized("pause:1") == "docker.io/library/pause:1"
    # every component lab up makes an image of has the name the layer pins for it
    from superkube.harness import build

    assert {p.component for p in images.pinned_images()} == set(build.IMAGE_COMPONENTS)
