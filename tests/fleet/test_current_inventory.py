"""The inventory `converge` and `etcd status` use when given none: $SUPERKUBE_INVENTORY, else the one
named by the file whoever stood the fleet up wrote (`lab up` writes it, `lab down` removes it). The
fleet never asks the lab."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from superkube.cli import app
from superkube.fleet import converge as fleet


def test_the_environment_names_it_first(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    inventory = tmp_path / "mine.yml"
    inventory.write_text("all: {}\n")
    other = tmp_path / "lab.yml"
    other.write_text("all: {}\n")
    current = tmp_path / "current"
    fleet.set_current_inventory(other, current)
    monkeypatch.setenv(fleet.INVENTORY_ENV, str(inventory))
    assert fleet.default_inventory(current) == inventory
    monkeypatch.delenv(fleet.INVENTORY_ENV)
    assert fleet.default_inventory(current) == other.resolve()


def test_the_file_is_written_whole_and_cleared_only_by_whoever_it_names(tmp_path: Path) -> None:
    current = tmp_path / "state" / "current"
    first, second = tmp_path / "a.yml", tmp_path / "b.yml"
    for path in (first, second):
        path.write_text("all: {}\n")
    fleet.set_current_inventory(first, current)
    assert current.read_text() == f"{first.resolve()}\n"
    assert [p.name for p in current.parent.iterdir()] == ["current"]  # no partial file left
    assert fleet.clear_current_inventory(second, current) is False  # another fleet's: kept
    assert current.exists()
    assert fleet.clear_current_inventory(first, current) is True
    assert not current.exists()
    assert fleet.clear_current_inventory(first, current) is False


@pytest.mark.parametrize(
    ("setup", "said"),
    [
        (
            "nothing",
            "no --inventory given, no SUPERKUBE_INVENTORY, and no fleet is up; pass --inventory FILE",
        ),
        ("gone", "names {gone}, which is gone; pass --inventory FILE or start a lab again"),
        ("bad-env", "SUPERKUBE_INVENTORY={missing}: no such file; point it at an inventory or unset it"),
    ],
)
def test_without_one_it_says_what_to_do_in_one_line(
    setup: str, said: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    current = tmp_path / "current"
    gone, missing = tmp_path / "gone.yml", tmp_path / "missing.yml"
    monkeypatch.delenv(fleet.INVENTORY_ENV, raising=False)
    if setup == "gone":
        current.write_text(f"{gone}\n")
    if setup == "bad-env":
        monkeypatch.setenv(fleet.INVENTORY_ENV, str(missing))
    with pytest.raises(fleet.FleetError) as raised:
        fleet.default_inventory(current)
    assert said.format(gone=gone, missing=missing) in str(raised.value)
    assert "\n" not in str(raised.value)


@pytest.mark.parametrize("command", [["converge"], ["etcd", "status"]])
def test_the_commands_take_it_from_the_environment(
    command: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    missing = tmp_path / "missing.yml"
    monkeypatch.setenv(fleet.INVENTORY_ENV, str(missing))
    result = CliRunner().invoke(app, command)
    assert result.exit_code == 2
    assert result.stderr.strip().splitlines() == [
        f"error: SUPERKUBE_INVENTORY={missing}: no such file; point it at an inventory or unset it"
    ]
