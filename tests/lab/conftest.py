"""One real lab for the lab tests: up once per session, down at the end, nothing left behind."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from superkube import lab


@pytest.fixture(scope="session")
def fleet() -> Iterator[lab.Lab]:
    lab.down()  # a lab left by an interrupted run must not fail this one
    started = lab.up(8, lambda what, fraction: None)
    yield started
    in_lab = [pid for name in lab._lab_namespaces() for pid in lab._namespace_pids(name)]
    clients = lab._lab_clients(lab.STATE_DIR)
    lab.down()
    assert lab._leftovers() == []
    still = [pid for pid in in_lab + clients if lab.running(pid)]
    assert still == [], f"processes of the lab outlived lab down: {still}"


def sh(fleet: lab.Lab, host: str, command: str) -> str:
    proc = lab.ssh(fleet, fleet.host(host), command)
    assert proc.returncode == 0, f"{host}: {command}: {proc.stderr}"
    return proc.stdout
