"""`superkube lab build` without building: pins, bad input, and the cache's trust in its manifest."""

from __future__ import annotations

import hashlib
import itertools
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from superkube.cli import app
from superkube.harness import build

runner = CliRunner()


def test_the_components_are_read_from_the_roles_pins() -> None:
    got = {c.name: c for c in build.components()}
    assert tuple(got) == build.NAMES
    assert got["etcd"].version == "v3.6.6"
    assert got["kubernetes"].version == "v1.35.0"
    assert (
        f"-X k8s.io/component-base/version.gitCommit={build.release()['commit']}" in got["kubernetes"].ldflags
    )
    # another Kubernetes version is not stamped with the pinned release's commit
    other = {c.name: c for c in build.components({"kubernetes": "1.35.1"})}["kubernetes"]
    assert other.version == "v1.35.1" and not any("gitCommit" in flag for flag in other.ldflags)
    # the gang scheduler carries the Kubernetes version it is built on, not scheduler-plugins' own
    plugins = got["scheduler-plugins"]
    assert plugins.version == "v0.34.7"
    assert "-X k8s.io/component-base/version.gitVersion=v1.34.7" in plugins.ldflags
    # kwok is the lab's, not the roles': pinned in the build, never installed on the lab's hosts
    assert got["kwok"].version == build.KWOK_VERSION and "kwok" not in build.HOST_COMPONENTS
    # the gang controllers and cluster DNS: the scheduler's pin, the layer's and kubeadm 1.35's, made
    # into the images the lab's nodes import, never installed on its hosts
    assert got["scheduler-plugins-controller"].version == plugins.version
    assert got["mpi-operator"].version == "v0.8.2"
    assert got["coredns"].version == "v1.13.1"
    assert set(build.IMAGE_COMPONENTS) == {"coredns", "scheduler-plugins-controller", "mpi-operator"}
    assert not set(build.IMAGE_COMPONENTS) & set(build.HOST_COMPONENTS)


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--pin", "etcd"], "--pin etcd: expected NAME=VERSION"),
        (["--pin", "etc=3.6.6"], "--pin no component named etc; the components are etcd, kubernetes"),
        (["--pin", "etcd=latest"], "--pin etcd=latest: not a release version; give one like v3.6.6"),
        (["--only", "kubelet"], "--only kubelet: no such component"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(args: list[str], said: str) -> None:
    result = runner.invoke(app, ["lab", "build", *args])
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and said in lines[0], result.output


ETCD = build.components()[0]


def fake_entry(root: Path) -> Path:
    (root / "bin").mkdir(parents=True)
    for name in ETCD.binaries:
        (root / "bin" / name).write_bytes(b"binary")
    sha = hashlib.sha256(b"binary").hexdigest()
    binaries = {name: {"sha256": sha} for name in ETCD.binaries}
    manifest = {"recipe": build.RECIPE, "ldflags": list(ETCD.ldflags), "binaries": binaries}
    (root / "manifest.json").write_text(json.dumps(manifest))
    return root


def test_an_entry_counts_as_built_only_while_its_binaries_match_the_manifest(tmp_path: Path) -> None:
    entry = fake_entry(tmp_path / "entry")
    assert build._cached(entry, ETCD) is not None
    manifest = json.loads((entry / "manifest.json").read_text())
    (entry / "manifest.json").write_text(json.dumps({**manifest, "recipe": build.RECIPE - 1}))
    assert build._cached(entry, ETCD) is None  # made by an older recipe: built again
    (entry / "manifest.json").write_text(json.dumps({**manifest, "ldflags": ["-X other.version=v0"]}))
    assert build._cached(entry, ETCD) is None  # stamped otherwise: built again
    (entry / "manifest.json").write_text(
        json.dumps({**manifest, "binaries": {"etcd": manifest["binaries"]["etcd"]}})
    )
    assert build._cached(entry, ETCD) is None  # built for fewer binaries than the component names now
    (entry / "manifest.json").write_text(json.dumps({**manifest, "tags": ["seccomp"]}))
    assert build._cached(entry, ETCD) is None  # built with other tags
    (entry / "manifest.json").write_text(json.dumps(manifest))
    assert build._cached(entry, ETCD) is not None
    (entry / "bin" / "etcd").write_bytes(b"binarY")
    assert build._cached(entry, ETCD) is None
    assert build._cached(tmp_path / "absent", ETCD) is None
    (entry / "manifest.json").write_text("{not json")
    assert build._cached(entry, ETCD) is None


def test_a_cached_entry_is_returned_without_running_go(tmp_path: Path) -> None:
    fake_entry(build.entry(ETCD, build.GO_VERSION, tmp_path))
    said: list[str] = []
    got = build.build(ETCD, "no-go-is-run", lambda component, what: said.append(what), tmp_path)
    assert got.cached and said == ["cached"]


def test_the_line_for_a_failure_is_gos_first_error() -> None:
    stderr = "go: downloading x\ngo: example.com/m@v9: invalid version: unknown revision v9\nexit status 1\n"
    assert build._cause(stderr) == "go: example.com/m@v9: invalid version: unknown revision v9"
    assert build._cause("") == "go exited with an error and printed nothing"


UPSTREAM = {
    "Require": [
        {"Path": "k8s.io/api", "Version": "v0.0.0"},
        {"Path": "golang.org/x/crypto", "Version": "v0.36.0"},
    ],
    "Replace": [
        {"Old": {"Path": "k8s.io/api"}, "New": {"Path": "k8s.io/api", "Version": "v0.34.7"}},
        {"Old": {"Path": "k8s.io/local"}, "New": {"Path": "./staging/local"}},
    ],
}


def test_every_upstream_requirement_is_pinned_and_its_replaces_repeated() -> None:
    copy = {c.name: c for c in build.components()}["scheduler-plugins"]
    assert build._replaces(copy, UPSTREAM) == {
        "k8s.io/api": "k8s.io/api@v0.34.7",  # upstream's replace wins over the v0.0.0 requirement
        "golang.org/x/crypto": "golang.org/x/crypto@v0.36.0",  # pinned: nothing may pull it up
    }
    staging = {c.name: c for c in build.components()}["kubernetes"]
    assert build._replaces(staging, {"Require": UPSTREAM["Require"]}) == {
        "k8s.io/api": "k8s.io/api@v0.35.0",  # a staging module at v0.0.0: its release for v1.35.0
        "golang.org/x/crypto": "golang.org/x/crypto@v0.36.0",
    }
    with pytest.raises(build.BuildError, match="requires no staging module"):
        build._replaces(staging, {"Require": UPSTREAM["Require"][1:]})


LISTING = """bin/kube-scheduler: go1.26.8
\tpath\tsigs.k8s.io/scheduler-plugins/cmd/scheduler
\tmod\tsuperkube.build/scheduler-plugins\t(devel)\t
\tdep\tgolang.org/x/crypto\tv0.36.0\th1:x=
\tdep\tk8s.io/api\tv0.0.0
\t=>\tk8s.io/api\tv0.34.7\th1:y=
\tdep\tk8s.io/csi-translation-lib\tv0.32.5
\t=>\tk8s.io/csi-translation-lib\tv0.34.8\th1:z=
"""
PINS = {"golang.org/x/crypto": "v0.36.0", "k8s.io/api": "v0.34.7", "k8s.io/csi-translation-lib": "v0.34.7"}
SUBSTITUTED = {
    "k8s.io/csi-translation-lib": {"pinned": "v0.34.7", "built": "v0.34.8", "why": "refused"},
    "k8s.io/cluster-bootstrap": {"pinned": "v0.34.7", "built": "v0.34.8", "why": "refused"},
}


def test_the_binary_holds_upstreams_pins_but_for_the_recorded_substitutes() -> None:
    plugins = {c.name: c for c in build.components()}["scheduler-plugins"]
    # what was compiled in is the replacement (=>), not the requirement; graph-only substitutes are not listed
    got = build._check_modules(plugins, "kube-scheduler", LISTING, PINS, SUBSTITUTED)
    assert got == ["k8s.io/csi-translation-lib v0.34.8"]
    drifted = LISTING.replace("crypto\tv0.36.0", "crypto\tv0.53.0")
    with pytest.raises(build.BuildError, match=r"golang\.org/x/crypto v0\.53\.0, upstream pins v0\.36\.0"):
        build._check_modules(plugins, "kube-scheduler", drifted, PINS, SUBSTITUTED)
    with pytest.raises(build.BuildError, match=r"upstream pins v0\.34\.7"):  # a substitute nobody recorded
        build._check_modules(plugins, "kube-scheduler", LISTING, PINS, {})
    with pytest.raises(build.BuildError, match="lists no modules"):
        build._check_modules(plugins, "kube-scheduler", "bin/x: go1.26.8\n", PINS, {})


def test_go_json_streams_are_read_object_by_object() -> None:
    text = '{\n\t"Path": "a",\n\t"Error": "refused"\n}\n{\n\t"Path": "b"\n}\n'
    assert build._json_stream(text) == [{"Path": "a", "Error": "refused"}, {"Path": "b"}]
    assert build._json_stream("") == []


def test_builds_run_two_at_a_time_but_never_two_of_one_module(monkeypatch: pytest.MonkeyPatch) -> None:
    import threading
    import time

    wanted = build.components()
    spans: dict[str, tuple[float, float]] = {}
    running: set[str] = set()
    most = [0]
    guard = threading.Lock()

    def fake_build(component: build.Component, go: str, progress: object, cache_dir: Path) -> build.Built:
        with guard:
            running.add(component.name)
            most[0] = max(most[0], len(running))
        started = time.monotonic()
        time.sleep(0.05)
        with guard:
            running.discard(component.name)
        spans[component.name] = (started, time.monotonic())
        return build.Built(component, cache_dir, {}, False, 0.05)

    monkeypatch.setattr(build, "build", fake_build)
    monkeypatch.setattr(build, "go_binary", lambda progress=None: "go")
    done = build.build_all(wanted, jobs=2)
    assert [b.component.name for b in done] == [c.name for c in wanted]  # results in the order asked
    assert most[0] == 2
    by_module: dict[str, list[tuple[float, float]]] = {}
    for c in wanted:
        by_module.setdefault(c.module, []).append(spans[c.name])
    for module, each in by_module.items():
        each.sort()
        assert all(a[1] <= b[0] for a, b in itertools.pairwise(each)), module
    # one at a time when asked
    most[0] = 0
    build.build_all(wanted, jobs=1)
    assert most[0] == 1


def test_a_failed_build_stops_the_queue_and_is_raised(monkeypatch: pytest.MonkeyPatch) -> None:
    started: list[str] = []

    def fake_build(component: build.Component, go: str, progress: object, cache_dir: Path) -> build.Built:
        started.append(component.name)
        if component.name == "etcd":
            raise build.BuildError("etcd v3.6.6: compiling etcd failed: boom")
        return build.Built(component, cache_dir, {}, False, 0.0)

    monkeypatch.setattr(build, "build", fake_build)
    monkeypatch.setattr(build, "go_binary", lambda progress=None: "go")
    with pytest.raises(build.BuildError, match="compiling etcd failed"):
        build.build_all(build.components(), jobs=1)
    assert started == ["etcd"]  # nothing after the failure was started
