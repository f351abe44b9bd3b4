"""The one Go every component is built with: the installed go when it is the pinned version, else the
pinned toolchain fetched as a module through the module proxy (by whatever go is installed) into the
checkout's .tools/; with no go at all, one line saying what to install."""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path

import pytest

from superkube.harness import build

REAL_GO = shutil.which("go")


def _old_go(folder: Path) -> Path:
    """A go that says it is Go 1.19 (as Debian 12's does) and otherwise is the installed one."""
    assert REAL_GO is not None
    fake = folder / "go"
    fake.write_text(
        "#!/bin/sh\n"
        'if [ "$1" = env ] && [ "$2" = GOVERSION ]; then echo go1.19.8; exit 0; fi\n'
        f'exec {REAL_GO} "$@"\n'
    )
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    return fake


def test_the_installed_go_is_used_when_it_is_the_pinned_version() -> None:
    go = build.go_binary()
    assert build._version_of(go) == build.GO_VERSION
    assert build.go_version() == build.GO_VERSION
    # the build's environment runs that go first and never lets it fetch another
    env = build.go_env(go)
    assert env["PATH"].split(os.pathsep)[0] == str(Path(go).parent) and env["GOTOOLCHAIN"] == "local"


def test_another_installed_version_fetches_the_pinned_toolchain_as_a_module(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    _old_go(bin_dir)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    said: list[str] = []
    toolchain = tmp_path / "tools" / f"go{build.GO_VERSION}"
    go = build.go_binary(said.append, toolchain=toolchain)
    assert go == str(toolchain / "bin" / "go")
    assert said == [f"fetching Go {build.GO_VERSION} as a module (the installed go is 1.19.8)"]
    assert build._version_of(go) == build.GO_VERSION
    assert (toolchain / "src" / "runtime").is_dir()  # a whole toolchain, not just its command
    assert not [p for p in toolchain.parent.iterdir() if p.name.startswith(".")]  # nothing half-unpacked
    # a second call finds it unpacked and fetches nothing
    said.clear()
    assert build.go_binary(said.append, toolchain=toolchain) == go and said == []


def test_no_go_at_all_is_one_line_saying_what_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(build.BuildError) as raised:
        build.go_binary(toolchain=tmp_path / "none")
    message = str(raised.value)
    assert "\n" not in message
    assert "apt-get install golang-go" in message and build.GO_VERSION in message
