"""The mock engine's calls run in the plan's own thread, and come back as they would from a worker."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import pytest

from superkube.plan import engine


def test_the_monitor_answers_in_the_plans_thread(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    threads: set[threading.Thread] = set()
    register = engine._RecordingMonitor.RegisterResource

    def registering(self: engine._RecordingMonitor, request: Any) -> Any:
        threads.add(threading.current_thread())
        return register(self, request)

    monkeypatch.setattr(engine._RecordingMonitor, "RegisterResource", registering)
    before = set(threading.enumerate())
    plan = engine.run(root, "dev")
    assert plan.resources
    assert threads == {threading.current_thread()}
    # no thread of the plan's outlives it (one an earlier test left may end meanwhile: not the plan's)
    assert set(threading.enumerate()) - before == set()


def test_a_call_handed_to_the_executor_runs_at_once_and_keeps_its_failure() -> None:
    loop = engine._PlanLoop()
    try:
        answered = loop.run_in_executor(None, lambda a, b: a + b, 1, 2)
        assert answered.done() and answered.result() == 3

        def refuse() -> None:
            raise engine.PlanError("no such invoke")

        refused = loop.run_in_executor(None, refuse)
        assert refused.done()
        with pytest.raises(engine.PlanError, match="no such invoke"):
            refused.result()
    finally:
        loop.close()


def test_serializing_runs_in_one_go_and_waits_on_the_loop_only_when_it_must() -> None:
    async def plain() -> str:
        return "state"

    assert engine._at_once(plain()) == "state"

    async def program() -> tuple[str, str]:
        later = asyncio.get_running_loop().create_future()
        asyncio.get_running_loop().call_soon(later.set_result, "resolved by the loop")

        async def waits() -> str:
            return await later

        # inside the running loop, as the monitor is under the plan's engine
        return engine._at_once(plain()), engine._at_once(waits())

    loop = engine._PlanLoop()
    try:
        assert loop.run_until_complete(program()) == ("state", "resolved by the loop")
    finally:
        loop.close()
