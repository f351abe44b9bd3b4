"""The pinned control plane built from its Go modules by `superkube lab build`, as the tests use it.

The first run builds what the cache lacks (cold on a fresh machine: minutes); everything after it
finds the cache. A bad pin is tried in a cache of its own, so it cannot touch the shared one.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from superkube.cluster import gang
from superkube.harness import build

ROOT = Path(__file__).resolve().parents[2]
SUPERKUBE = [sys.executable, "-m", "superkube.cli"]


def superkube(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*SUPERKUBE, *args], cwd=ROOT, capture_output=True, text=True, env={**os.environ, **(env or {})}
    )


@pytest.fixture(scope="module")
def built() -> list[dict[str, Any]]:
    proc = superkube("lab", "build", "--output", "json")
    assert proc.returncode == 0, proc.stderr
    doc: list[dict[str, Any]] = json.loads(proc.stdout)
    return doc


def by_name(built: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {entry["component"]: entry for entry in built}


def test_every_pinned_component_is_built_at_its_pin(built: list[dict[str, Any]]) -> None:
    release = build.release()
    entries = by_name(built)
    assert set(entries) == set(build.NAMES)
    assert entries["etcd"]["version"] == f"v{release['etcd']['version']}" == "v3.6.6"
    assert entries["kubernetes"]["version"] == f"v{release['version']}" == "v1.35.0"
    assert entries["scheduler-plugins"]["version"] == gang.scheduler_plugins_version(release["version"])
    assert set(entries["etcd"]["binaries"]) == {"etcd", "etcdctl"}
    assert set(entries["kubernetes"]["binaries"]) == {"kube-apiserver", "kube-controller-manager", "kubectl"}
    assert entries["kubernetes-node"]["version"] == "v1.35.0"
    assert set(entries["kubernetes-node"]["binaries"]) == {"kubelet", "kube-proxy"}
    assert set(entries["scheduler-plugins"]["binaries"]) == {"kube-scheduler"}
    # the node's runtime at the release file's pins; kwok at the lab's
    assert entries["containerd"]["version"] == f"v{release['runtime']['containerd']['version']}"
    assert set(entries["containerd"]["binaries"]) == set(release["runtime"]["containerd"]["binaries"])
    assert entries["runc"]["version"] == f"v{release['runtime']['runc']['version']}"
    assert entries["kwok"]["version"] == build.KWOK_VERSION
    # the gang scheduler's in-cluster half at the scheduler's own pin; the MPI Operator at the layer's
    assert entries["scheduler-plugins-controller"]["version"] == entries["scheduler-plugins"]["version"]
    assert set(entries["scheduler-plugins-controller"]["binaries"]) == {"controller"}
    assert entries["mpi-operator"]["version"] == f"v{gang.MPI_OPERATOR_VERSION}"
    assert set(entries["mpi-operator"]["binaries"]) == {"mpi-operator"}


def test_the_manifest_records_what_is_on_disk(built: list[dict[str, Any]]) -> None:
    go = build.go_version()
    for entry in built:
        path = Path(entry["path"])
        manifest = json.loads((path / "manifest.json").read_text())
        assert manifest["go"] == go and manifest["version"] == entry["version"]
        for name, info in manifest["binaries"].items():
            assert hashlib.sha256((path / "bin" / name).read_bytes()).hexdigest() == info["sha256"], name
        # what went into the binaries is kept beside them
        gomod = (path / "go.mod").read_text()
        assert f"{manifest['module']} {manifest['version']}" in gomod
        # a module the proxy refused at upstream's pin is built at a patch release of the same
        # minor, and the manifest says so wherever one is compiled in
        for module, sub in manifest["substituted"].items():
            assert sub["pinned"] != sub["built"] and sub["why"], module
            if sub["built"]:
                assert sub["built"].rsplit(".", 1)[0] == sub["pinned"].rsplit(".", 1)[0], module
        for info in manifest["binaries"].values():
            for compiled in info["substitutes_compiled_in"]:
                module, version = compiled.split()
                assert manifest["substituted"][module]["built"] == version
    # Kubernetes is built exactly at upstream's pins: the build compares every module compiled in
    for name in ("kubernetes", "kubernetes-node"):
        kubernetes = by_name(built)[name]
        assert kubernetes["substituted"] == {}
        assert all(not b["substitutes_compiled_in"] for b in kubernetes["binaries"].values())


def test_the_readme_names_every_substitute_compiled_in(built: list[dict[str, Any]]) -> None:
    readme = (ROOT / "docs" / "02-the-lab.md").read_text()
    for entry in built:
        for name, info in entry["binaries"].items():
            for compiled in info["substitutes_compiled_in"]:
                module, version = compiled.split()
                pinned = entry["substituted"][module]["pinned"]
                assert f"`{module}` {version} for {pinned}" in readme, (name, compiled)


def version_of(path: Path, *args: str) -> str:
    proc = subprocess.run([str(path), *args], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout + proc.stderr


def test_the_binaries_report_their_pinned_versions(built: list[dict[str, Any]]) -> None:
    entries = {name: Path(entry["path"]) / "bin" for name, entry in by_name(built).items()}
    assert "etcd Version: 3.6.6" in version_of(entries["etcd"] / "etcd", "--version")
    assert "etcdctl version: 3.6.6" in version_of(entries["etcd"] / "etcdctl", "version")
    for component, name in (("kubernetes", "kube-apiserver"), ("kubernetes", "kube-controller-manager"),
                            ("kubernetes-node", "kubelet"), ("kubernetes-node", "kube-proxy")):  # fmt: skip
        assert version_of(entries[component] / name, "--version").strip() == "Kubernetes v1.35.0"
    client = json.loads(version_of(entries["kubernetes"] / "kubectl", "version", "--client", "-o", "json"))
    assert client["clientVersion"]["gitVersion"] == "v1.35.0"
    assert client["clientVersion"]["gitCommit"] == build.release()["commit"]
    # scheduler-plugins v0.M.P is stamped as the Kubernetes v1.M.P it is built on (a 0.M binary
    # version stops kube-scheduler at start: its emulation version would be below what it supports)
    plugins = by_name(built)["scheduler-plugins"]["version"]
    stamped = "v1." + plugins.removeprefix("v0.")
    assert (
        version_of(entries["scheduler-plugins"] / "kube-scheduler", "--version").strip()
        == f"Kubernetes {stamped}"
    )
    runtime = build.release()["runtime"]
    containerd = runtime["containerd"]["version"]
    assert f"github.com/containerd/containerd/v2 v{containerd}" in version_of(
        entries["containerd"] / "containerd", "--version"
    )
    assert f"ctr github.com/containerd/containerd/v2 v{containerd}" in version_of(
        entries["containerd"] / "ctr", "--version"
    )
    said = version_of(entries["runc"] / "runc", "--version")
    assert f"runc version {runtime['runc']['version']}" in said and "libseccomp" in said
    assert build.KWOK_VERSION.removeprefix("v") in version_of(entries["kwok"] / "kwok", "--version")


def test_a_second_run_builds_nothing(built: list[dict[str, Any]]) -> None:
    stamps = {p: p.stat().st_mtime_ns for entry in built for p in (Path(entry["path"]) / "bin").iterdir()}
    proc = superkube("lab", "build", "--output", "json")
    assert proc.returncode == 0, proc.stderr
    again = json.loads(proc.stdout)
    assert [e["cached"] for e in again] == [True] * len(build.NAMES)
    assert [e["path"] for e in again] == [e["path"] for e in built]
    assert {p: p.stat().st_mtime_ns for p in stamps} == stamps
    assert "cached" in proc.stderr  # progress says so, per component


def test_a_version_that_does_not_exist_fails_in_one_line_naming_the_component(tmp_path: Path) -> None:
    proc = superkube(
        "lab",
        "build",
        "--only",
        "etcd",
        "--pin",
        "etcd=3.6.999",
        env={"SUPERKUBE_BUILD_CACHE": str(tmp_path)},
    )
    assert proc.returncode == 1
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in proc.stderr
    assert "etcd v3.6.999" in errors[0] and "resolving modules failed" in errors[0]
    # nothing that looks built is left; the full log is kept where the line says
    entry = tmp_path / "etcd" / "v3.6.999"
    assert not (entry / f"go{build.go_version()}").exists()
    assert (entry / f"go{build.go_version()}.failed.log").is_file()
