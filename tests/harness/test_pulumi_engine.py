"""What scripts/build_pulumi.py records about the Pulumi build: the SDK pins it is measured against,
and how far each built version is from them. Nothing here builds or needs the built binaries."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from superkube.harness import pulumi_engine
from tests.conftest import ROOT


def test_the_pins_are_constraints_txts() -> None:
    pins = pulumi_engine.pins(ROOT / "constraints.txt")
    assert set(pins) == {"pulumi", "pulumi_kubernetes", "pulumi_policy"}
    assert all(v[0].isdigit() for v in pins.values())


def test_distance_says_how_far_and_which_way() -> None:
    assert pulumi_engine.distance("v3.274.0", "3.272.0") == "2 minor newer than the pin 3.272.0"
    assert pulumi_engine.distance("v3.259.0", "3.272.0") == "13 minor older than the pin 3.272.0"
    assert pulumi_engine.distance("v3.272.0", "3.272.0") == "same"
    assert pulumi_engine.distance("v3.272.1", "3.272.0") == "1 patch newer than the pin 3.272.0"
    pseudo = pulumi_engine.distance("v4.0.0-20260115033456-f47bc2d6f199", "4.34.2")
    assert pseudo.startswith("a pseudo-version") and "4.34.2" in pseudo
    assert "not comparable" in pulumi_engine.distance("main", "3.272.0")


def test_a_missing_or_partial_build_has_no_manifest(tmp_path: Path) -> None:
    assert pulumi_engine.manifest(tmp_path) is None
    entry = pulumi_engine.entry(tmp_path)
    (entry / "bin").mkdir(parents=True)
    (entry / "manifest.json").write_text(json.dumps({"built": {}}))
    assert pulumi_engine.manifest(tmp_path) is None, "no binaries: not built"
    for name in pulumi_engine.BINARIES:
        (entry / "bin" / name).write_text("")
    assert pulumi_engine.manifest(tmp_path) == {"built": {}}


def test_bad_input_to_the_build_and_the_bench_is_one_line_and_exit_2(tmp_path: Path) -> None:
    runs = [
        [sys.executable, str(ROOT / "scripts" / "build_pulumi.py"), "--pulumi", str(tmp_path / "none")],
        [
            sys.executable,
            str(ROOT / "scripts" / "build_pulumi.py"),
            "--pulumi",
            str(tmp_path),
            "--cli-version",
            "3.1",
        ],
        [sys.executable, str(ROOT / "bench" / "pulumi_up.py"), "--cache", str(tmp_path)],
    ]
    for argv in runs:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
        assert done.returncode == 2, done.stderr
        assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr
