"""Shared fixtures: recorded plans of the shipped stacks, throwaway stack files, and the one real API
server (etcd and kube-apiserver at the pinned versions, on loopback) that the agents' and the
harness's tests share."""

from __future__ import annotations

import json
import os
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import yaml

from superkube.plan import engine as planning

if TYPE_CHECKING:
    from superkube.harness.apiserver import LocalApi

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE_KEY = (
    "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBJI1OHlZdU7SzG8JI0+n2QKOCb3fDHb+d3054AnmLY3 superkube-example"
)


@pytest.fixture(scope="session")
def root() -> Path:
    return ROOT


@pytest.fixture(scope="session")
def dev_plan() -> planning.Plan:
    return planning.run(ROOT, "dev")


@pytest.fixture(scope="session")
def flagship_plan() -> planning.Plan:
    return planning.run(ROOT, "flagship")


@pytest.fixture(params=["dev", "flagship"])
def any_plan(
    request: pytest.FixtureRequest, dev_plan: planning.Plan, flagship_plan: planning.Plan
) -> planning.Plan:
    return dev_plan if request.param == "dev" else flagship_plan


def dev_config() -> dict[str, Any]:
    """The dev stack's config mapping, to mutate in tests."""
    return dict(yaml.safe_load((ROOT / "stacks" / "Pulumi.dev.yaml").read_text())["config"])


@pytest.fixture
def write_stack(tmp_path: Path) -> Callable[..., Path]:
    """Write a stack file (config keys without the superkube: prefix are namespaced for you)."""

    def write(config: dict[str, Any], name: str = "test", raw: str | None = None) -> Path:
        path = tmp_path / f"Pulumi.{name}.yaml"
        if raw is not None:
            path.write_text(raw)
            return path
        namespaced = {k if ":" in k else f"superkube:{k}": v for k, v in config.items()}
        path.write_text(yaml.safe_dump({"config": namespaced}, sort_keys=False))
        return path

    return write


TIMES_ENV = "SUPERKUBE_TEST_TIMES"
"""A file to write every test's phases to (setup, call, teardown: start, seconds, outcome) at the end of
the run, for bench/ci_time.py's profile of where the suite's time goes."""
_times: list[dict[str, Any]] = []


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if os.environ.get(TIMES_ENV):
        _times.append(
            {
                "test": report.nodeid,
                "phase": report.when,
                "start": round(report.start, 3),
                "seconds": round(report.duration, 3),
                "outcome": report.outcome,
            }
        )


def _write_times() -> None:
    path = os.environ.get(TIMES_ENV)
    if path:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(_times) + "\n")


def _left_running(grace_s: float = 5.0) -> list[str]:
    """Threads a test started and never stopped, after a grace to finish: one line each, with where it
    waits. A daemon thread left running can take the interpreter down as it shuts down (a thread that
    wakes and writes to stderr then aborts the process after every test has passed)."""
    deadline = time.monotonic() + grace_s
    while True:
        left = [t for t in threading.enumerate() if t is not threading.main_thread() and t.is_alive()]
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    frames = sys._current_frames()
    lines = []
    for thread in left:
        frame = frames.get(thread.ident or -1)
        stack = [f for f in traceback.extract_stack(frame) if "threading" not in f.filename] if frame else []
        where = f"{stack[-1].filename}:{stack[-1].lineno} in {stack[-1].name}" if stack else "?"
        lines.append(f"{thread.name}: {where}")
    return lines


@pytest.hookimpl(trylast=True)  # after every plugin's own session end
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """On CI a skipped (or xfail-marked) test is a failure: whatever it needs must be installed, not
    skipped. And every thread a test started must have been stopped by the end."""
    _write_times()
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    left = _left_running()
    if left and session.exitstatus == 0:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    if left and reporter:
        reporter.write_line("")
    for line in left:
        if reporter:
            reporter.write_line(f"thread left running: {line}; stop and join it in the test", red=True)
    # an expected failure is a skip that says so: on CI it fails the run as a skip does
    skipped = (
        sum(len(reporter.stats.get(k, [])) for k in ("skipped", "xfailed", "xpassed")) if reporter else 0
    )
    if os.environ.get("CI") and skipped and session.exitstatus == 0:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
        if reporter:
            reporter.write_line(
                f"CI: {skipped} test(s) skipped or marked xfail; install what they need, or fix them, instead",
                red=True,
            )


@pytest.fixture(scope="session")
def api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalApi]:
    """One real API server per session (`superkube.harness.apiserver`), for every test that asks."""
    from superkube.harness import apiserver

    with apiserver.running(tmp_path_factory.mktemp("apiserver")) as running:
        yield running
