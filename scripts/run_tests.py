"""`make test`'s runner: the suite in lanes, so that what does not wait on something else does not.

Two sequences run side by side, each a chain of steps:

    lab:    build the lab hosts' components  ->  pytest tests/lab (the runs on a booted lab)
    units:  the linters (`make lint-quick`)  ->  pytest of the tests that need no built component
            ->  mypy  ->  build every other component  ->  pytest of the tests that run the built
            components on loopback (tests/agents, tests/fleet, tests/harness)

On a warm machine every build is found in the cache in seconds and the unit tests run beside the lab's
first modules; from cold, the unit tests and mypy run while the components build, and the lab starts
once its hosts' components are built, while the rest build beside it. The build itself takes two
components at a time, never two of one module (superkube.harness.build).

Each step writes its output to .ci/out/<step>.log; while the steps run, a line a minute says where
each is. At the end each step's verdict and time, the tail of each pytest run, and the whole log of a
step that failed. Exit 1 if any step failed. .ci/out also keeps what bench/ci_time.py profiles: each
test's phases (times-<lane>.json), each build (build-*.json) and each step's start and end
(steps.json).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from superkube.harness import build as build_components

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / ".ci" / "out"
BIN = ROOT / ".venv" / "bin"

OFFLINE = (
    "tests/model",
    "tests/plan",
    "tests/cluster",
    "tests/cli",
    "tests/modules",
    "tests/policies",
    "tests/playbooks",
    "tests/layout",
    "tests/lab_units",
    "tests/gpu",
    "tests/test_readme.py",
)
"""tests that need no built component (tests/gpu: deselected by its marker, collected all the same)"""
REAL = ("tests/agents", "tests/fleet", "tests/harness")
"""tests that run the built components on loopback: the API server, kwok, the gang controllers"""
LAB = ("tests/lab",)
"""the runs on a booted lab, in the order of their lab's shape (tests/lab/conftest.py)"""
LANES = {"offline": OFFLINE, "real": REAL, "lab": LAB}
LAB_COMPONENTS = build_components.LAB_COMPONENTS
"""what `lab up` gives the lab's hosts and makes its nodes' images of: the lab lane builds them first"""
TAIL_LINES = 40
MYPY_CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "superkube" / "mypy"
"""mypy's incremental cache, kept beside the build's and Go's caches rather than in the clone: a module
whose source has the same hash is not checked again (mypy compares hashes when paths or mtimes differ)"""


@dataclass
class Step:
    name: str
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    stdout: Path | None = None  # where the command's standard output goes (a build's JSON), if not the log
    niceness: int = 0  # `nice -n`: a step off the critical path yields the CPU to the one on it
    started: float | None = None
    ended: float | None = None
    code: int | None = None

    @property
    def log(self) -> Path:
        return OUT / f"{self.name}.log"

    @property
    def seconds(self) -> float:
        if self.started is None:
            return 0.0
        return (self.ended or time.time()) - self.started

    def state(self) -> str:
        if self.started is None:
            return "waiting"
        if self.code is None:
            return f"running {self.seconds / 60:.1f} min: {_last_line(self.log)}"
        return (
            f"{'passed' if self.code == 0 else f'FAILED (exit {self.code})'} in {self.seconds / 60:.1f} min"
        )


def _last_line(path: Path) -> str:
    try:
        lines = [line for line in path.read_text(errors="replace").splitlines() if line.strip()]
    except OSError:
        return ""
    return lines[-1][-100:] if lines else ""


def pytest(lane: str, paths: tuple[str, ...], niceness: int = 0) -> Step:
    return Step(
        lane,
        [str(BIN / "python"), "-m", "pytest", "--durations=15", "-p", "no:cacheprovider", *paths],
        env={"SUPERKUBE_TEST_TIMES": str(OUT / f"times-{lane}.json")},
        niceness=niceness,
    )


def build(name: str, only: tuple[str, ...] = (), niceness: int = 0) -> Step:
    argv = [str(BIN / "superkube"), "lab", "build", "--output", "json"]
    for component in only:
        argv += ["--only", component]
    return Step(name, argv, stdout=OUT / f"{name}.json", niceness=niceness)


UNITS_NICENESS = 5
"""The units sequence ends in a third of the lab's time: it yields the CPU to the lab, whose converges
and boots are the critical path (at nice 5 a process gets about a third of the share of one at nice 0
while both want the CPU, and all of it while the lab waits)"""


SEQUENCES = {
    "lab": [build("build-hosts", LAB_COMPONENTS), pytest("lab", LAB)],
    "units": [
        Step("lint", ["make", "--no-print-directory", "lint-quick"], niceness=UNITS_NICENESS),
        pytest("offline", OFFLINE, niceness=UNITS_NICENESS),
        Step("mypy", [str(BIN / "mypy")], env={"MYPY_CACHE_DIR": str(MYPY_CACHE)}, niceness=UNITS_NICENESS),
        # behind the lab's own build, which the lab waits on: from cold the two build side by side
        # (a lock per component keeps them from building one twice), and the lab's gets the CPU first
        build("build-rest", niceness=10),
        pytest("real", REAL, niceness=UNITS_NICENESS),
    ],
}

_children: set[subprocess.Popen[bytes]] = set()
_lock = threading.Lock()


def run_step(step: Step) -> int:
    step.started = time.time()
    with step.log.open("wb") as log:
        stdout = step.stdout.open("wb") if step.stdout else log
        try:
            proc = subprocess.Popen(
                ["nice", "-n", str(step.niceness), *step.argv] if step.niceness else step.argv,
                cwd=ROOT,
                env={**os.environ, **step.env},
                stdout=stdout,
                stderr=log,
                start_new_session=True,  # its own process group: ended whole on an interrupt
            )
            with _lock:
                _children.add(proc)
            step.code = proc.wait()
            with _lock:
                _children.discard(proc)
        finally:
            if step.stdout:
                stdout.close()
    step.ended = time.time()
    return step.code


def run_sequence(steps: list[Step]) -> None:
    """The steps one after another; a failed step stops its sequence (what follows depends on it)."""
    for step in steps:
        if run_step(step) != 0:
            return


def report(every: float, stop: threading.Event) -> None:
    started = time.time()
    while not stop.wait(every):
        minutes = (time.time() - started) / 60
        states = "; ".join(f"{s.name}: {s.state()}" for steps in SEQUENCES.values() for s in steps)
        print(f"[{minutes:5.1f} min] {states}", flush=True)


def end_all(signum: int, frame: object) -> None:
    with _lock:
        for proc in _children:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
    sys.exit(128 + signum)


def main() -> int:
    OUT.mkdir(parents=True, exist_ok=True)
    for old in OUT.iterdir():
        old.unlink()
    signal.signal(signal.SIGINT, end_all)
    signal.signal(signal.SIGTERM, end_all)
    began = time.time()
    threads = [threading.Thread(target=run_sequence, args=(steps,)) for steps in SEQUENCES.values()]
    stop = threading.Event()
    reporter = threading.Thread(target=report, args=(60.0, stop), daemon=True)
    for thread in threads:
        thread.start()
    reporter.start()
    for thread in threads:
        thread.join()
    stop.set()
    steps = [s for sequence in SEQUENCES.values() for s in sequence]
    (OUT / "steps.json").write_text(
        json.dumps(
            {
                "began": began,
                "ended": time.time(),
                "steps": [
                    {"step": s.name, "started": s.started, "ended": s.ended, "code": s.code} for s in steps
                ],
            },
            indent=2,
        )
        + "\n"
    )
    for step in steps:
        if step.started is None:
            continue
        lines = step.log.read_text(errors="replace").splitlines()
        failed = step.code != 0
        shown = lines if failed else lines[-TAIL_LINES:] if step.name in LANES else lines[-3:]
        print(f"\n===== {step.name}: {step.state()} =====", flush=True)
        print("\n".join(shown), flush=True)
    print()
    for step in steps:
        print(f"{step.name:12} {step.state()}")
    print(f"all steps: {(time.time() - began) / 60:.1f} min")
    return 0 if all(s.code == 0 for s in steps) else 1


if __name__ == "__main__":
    sys.exit(main())
