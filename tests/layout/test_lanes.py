"""`make test` runs the suite in lanes (scripts/run_tests.py): every test module is in exactly one, the
lab's runs are all ordered by their lab's shape, and the lab's lane builds what `lab up` needs."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

from superkube.harness import build
from tests.conftest import ROOT
from tests.lab.conftest import MODULES, ORDER


def runner() -> ModuleType:
    spec = importlib.util.spec_from_file_location("run_tests", ROOT / "scripts" / "run_tests.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def lane_of(path: Path, lanes: dict[str, tuple[str, ...]]) -> list[str]:
    relative = path.relative_to(ROOT).as_posix()
    return [
        lane for lane, paths in lanes.items() for p in paths if relative == p or relative.startswith(p + "/")
    ]


def test_every_test_module_is_in_exactly_one_lane() -> None:
    lanes = runner().LANES
    modules = sorted((ROOT / "tests").rglob("test_*.py"))
    assert modules
    wrong = {str(m.relative_to(ROOT)): lane_of(m, lanes) for m in modules if len(lane_of(m, lanes)) != 1}
    assert wrong == {}


def test_every_lane_path_exists_and_the_lab_lane_is_tests_lab() -> None:
    lanes = runner().LANES
    assert all((ROOT / p).exists() for paths in lanes.values() for p in paths)
    assert lanes["lab"] == ("tests/lab",)


def test_every_lab_module_runs_in_its_shapes_place() -> None:
    found = sorted(p.name for p in (ROOT / "tests" / "lab").glob("test_*.py"))
    assert sorted(MODULES) == found
    assert len(MODULES) == len(set(MODULES))  # one shape each
    assert len(ORDER) == 2


def test_the_lab_lane_builds_what_lab_up_boots() -> None:
    assert runner().LAB_COMPONENTS == build.HOST_COMPONENTS + build.IMAGE_COMPONENTS


def test_on_ci_a_skip_or_an_xfail_fails_the_run_and_elsewhere_does_not(tmp_path: Path) -> None:
    """The suite's own rule (tests/conftest.py), run on a throwaway test file: under CI=true a
    skipped test and an xfail-marked one each fail the run; without CI they pass."""
    import os
    import subprocess

    cases = {
        "skip": "import pytest\n\ndef test_a():\n    pytest.skip('needs a thing')\n",
        "xfail": "import pytest\n\n@pytest.mark.xfail(reason='later')\ndef test_a():\n    assert False\n",
        "xpass": "import pytest\n\n@pytest.mark.xfail(reason='later')\ndef test_a():\n    assert True\n",
    }
    env = {k: v for k, v in os.environ.items() if k not in ("CI", "PYTEST_ADDOPTS")}
    for name, text in cases.items():
        test = tmp_path / f"test_{name}.py"
        test.write_text(text)
        for ci, want in (("true", 1), ("", 0)):
            proc = subprocess.run(
                [sys.executable, "-m", "pytest", "-q", "-p", "tests.conftest", "-p", "no:cacheprovider",
                 "--rootdir", str(tmp_path), "-c", os.devnull, str(test)],
                cwd=ROOT, env={**env, "CI": ci}, capture_output=True, text=True, timeout=120,
            )  # fmt: skip
            assert proc.returncode == want, (name, ci, proc.stdout[-1500:])
            if want:
                assert "skipped or marked xfail" in proc.stdout, proc.stdout[-1500:]
