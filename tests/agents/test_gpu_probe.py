"""The GPU probe's verdicts on readings of each failure kind, and its one-line errors.

The readings under readings/ are written in the probe's format, one per failure kind, with the
signals NVML reports for it (Xid events, ECC counters, remapped rows, the GPU count, NVLink and
PCIe state); they are not captures from failing hardware. The test that reads a real GPU through
NVML is in tests/gpu."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from superkube.agents import gpu_probe
from superkube.cli import app

READINGS = Path(__file__).parent / "readings"

CASES = [
    ("healthy", "healthy", None),
    ("healthy-corrected-ecc", "healthy", None),
    ("app-fault-xid-13", "warning", "Xid 13: graphics engine exception"),
    ("pcie-degraded", "warning", "PCIe link x8 gen5, below the GPU's x16 gen5"),
    ("xid-48-dbe", "fatal", "Xid 48: double-bit ECC error"),
    ("xid-63-remap-pending", "fatal", "a row remap is pending"),
    ("xid-64-remap-failure", "fatal", "row remapping failed"),
    (
        "xid-79-off-the-bus",
        "fatal",
        "7 of 8 GPUs a Standard_ND96isr_H100_v5 has are visible (missing index 6)",
    ),
    ("xid-94-contained", "fatal", "Xid 94: contained ECC error"),
    ("xid-95-uncontained", "fatal", "Xid 95: uncontained ECC error"),
    ("nvlink-down", "fatal", "2 of 18 NVLinks down"),
]


@pytest.mark.parametrize(("name", "level", "reason"), CASES, ids=[c[0] for c in CASES])
def test_each_failure_kind_gets_its_verdict(name: str, level: str, reason: str | None) -> None:
    result = gpu_probe.verdict(gpu_probe.load_reading(READINGS / f"{name}.json"))
    assert result.level == level
    if reason is None:
        assert result.findings == []
    else:
        assert any(reason in f.reason for f in result.findings if f.level == level), result.findings


def test_every_reading_on_file_has_a_case() -> None:
    # the burn's readings have theirs in test_gpu_burn
    assert {p.stem for p in READINGS.glob("*.json") if not p.stem.startswith("burn-")} == {
        c[0] for c in CASES
    }


def test_the_worst_finding_decides() -> None:
    reading = json.loads((READINGS / "pcie-degraded.json").read_text())
    reading["gpus"][3]["xid_errors"] = [79]
    result = gpu_probe.verdict(gpu_probe.parse_reading(reading))
    assert result.level == "fatal" and {f.level for f in result.findings} == {"warning", "fatal"}


def test_an_unknown_xid_is_a_warning_that_says_to_look_it_up() -> None:
    reading = json.loads((READINGS / "healthy.json").read_text())
    reading["gpus"][0]["xid_errors"] = [999]
    (finding,) = gpu_probe.verdict(gpu_probe.parse_reading(reading)).findings
    assert finding.level == "warning" and "not in src/superkube/data/gpu_health.yaml" in finding.reason


def test_thresholds_are_data(tmp_path: Path) -> None:
    """Moving Xid 13 from warning to fatal in the file changes the verdict; nothing is hard-coded."""
    doc = yaml.safe_load(gpu_probe.THRESHOLDS.read_text())
    doc["xid"]["fatal"][13] = doc["xid"]["warning"].pop(13)
    path = tmp_path / "gpu_health.yaml"
    path.write_text(yaml.safe_dump(doc))
    reading = gpu_probe.load_reading(READINGS / "app-fault-xid-13.json")
    assert gpu_probe.verdict(reading, gpu_probe.thresholds(path)).level == "fatal"


def test_a_malformed_thresholds_file_is_one_line_naming_the_field(tmp_path: Path) -> None:
    doc = yaml.safe_load(gpu_probe.THRESHOLDS.read_text())
    doc["ecc"]["volatile_double_bit_fatal"] = "one"
    path = tmp_path / "gpu_health.yaml"
    path.write_text(yaml.safe_dump(doc))
    with pytest.raises(gpu_probe.ReadingError) as err:
        gpu_probe.thresholds(path)
    assert str(err.value).startswith(f"{path}: ecc.volatile_double_bit_fatal: ")
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(
    ("change", "says"),
    [
        (lambda r: r["gpus"][2]["ecc"].update(volatile_double_bit=-1), "gpus.2.ecc.volatile_double_bit: "),
        (lambda r: r["gpus"][0].update(temperature=80), "gpus.0.temperature: Extra inputs are not permitted"),
        (lambda r: r.pop("expected_gpus"), "expected_gpus: Field required"),
    ],
    ids=["negative counter", "unknown field", "missing field"],
)
def test_a_malformed_reading_is_one_line_naming_the_field(change, says: str, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    reading = json.loads((READINGS / "healthy.json").read_text())
    change(reading)
    path = tmp_path / "reading.json"
    path.write_text(json.dumps(reading))
    result = CliRunner().invoke(app, ["health", "explain", str(path)])
    assert result.exit_code == 2
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith(f"error: {path}: {says}"), line


def test_explain_as_json_and_its_exit_status() -> None:
    result = CliRunner().invoke(
        app, ["health", "explain", str(READINGS / "xid-95-uncontained.json"), "-o", "json"]
    )
    assert result.exit_code == 1, "fatal exits 1, so scripts can act on it"
    doc = json.loads(result.stdout)
    assert doc["verdict"] == "fatal" and doc["findings"][0] == {
        "level": "fatal",
        "gpu": 1,
        "reason": "Xid 95: uncontained ECC error",
    }
    assert CliRunner().invoke(app, ["health", "explain", str(READINGS / "healthy.json")]).exit_code == 0


@pytest.mark.parametrize(
    ("reading", "clears"),
    [("xid-48-dbe", True), ("xid-63-remap-pending", True), ("xid-94-contained", True),
     ("xid-95-uncontained", True), ("xid-64-remap-failure", False), ("xid-79-off-the-bus", False),
     ("nvlink-down", False), ("app-fault-xid-13", False), ("healthy", False)],
)  # fmt: skip
def test_a_reset_is_tried_only_when_every_fatal_finding_is_one_it_may_clear(
    reading: str, clears: bool
) -> None:
    got = gpu_probe.verdict(gpu_probe.load_reading(READINGS / f"{reading}.json"))
    assert gpu_probe.reset_may_clear(got) is clears
    # one finding a reset does not clear beside them: the node is given up, not reset
    if clears:
        more = gpu_probe.Finding("fatal", 2, "Xid 79: GPU has fallen off the bus", 79)
        assert not gpu_probe.reset_may_clear(gpu_probe.Verdict(got.node, "fatal", [*got.findings, more]))


def test_forgiving_drops_exactly_that_xid_on_that_gpu() -> None:
    reading = gpu_probe.load_reading(READINGS / "xid-48-dbe.json")
    gpu = next(g for g in reading.gpus if 48 in g.xid_errors)
    plain = reading.model_copy(
        update={"gpus": [g.model_copy(update={"ecc": gpu_probe.Ecc()}) for g in reading.gpus]}
    )
    got = gpu_probe.verdict(plain)
    assert got.level == "fatal"
    assert gpu_probe.forgive(got, {gpu.index: 48}).level == "healthy"
    assert gpu_probe.forgive(got, {gpu.index: 94}).level == "fatal"  # another Xid: not this one
    assert gpu_probe.forgive(got, {gpu.index + 1: 48}).level == "fatal"  # another GPU: not this one


def test_a_reading_printed_by_the_probe_command_is_one_explain_reads(tmp_path: Path) -> None:
    """`python -m superkube.agents.gpu_probe` prints a reading as JSON: each sample reading written
    that way loads back the same. Without NVML (no driver, as here) the command says so in one line."""
    import subprocess
    import sys

    for sample in sorted(READINGS.glob("*.json")):
        reading = gpu_probe.load_reading(sample)
        again = tmp_path / sample.name
        again.write_text(json.dumps(reading.model_dump(mode="json", exclude_none=True)))
        assert gpu_probe.load_reading(again) == reading, sample.name
    proc = subprocess.run([sys.executable, "-m", "superkube.agents.gpu_probe", "--vm-size", "Standard_ND96isr_H100_v5"],
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    if proc.returncode == 0:  # a machine with a GPU and its driver
        printed = tmp_path / "printed.json"
        printed.write_text(proc.stdout)
        assert gpu_probe.load_reading(printed).gpus
    else:
        assert proc.returncode == 2 and proc.stdout == "", proc
        assert proc.stderr.startswith("error: NVML cannot be read (") and len(proc.stderr.splitlines()) == 1
