"""Test modules need unique basenames: pytest imports them by basename (its prepend import mode), so
a second tests/**/test_x.py stops the whole collection on a clean clone, as it did twice."""

from __future__ import annotations

from collections import defaultdict

from tests.conftest import ROOT


def test_every_test_module_has_a_basename_of_its_own() -> None:
    seen: dict[str, list[str]] = defaultdict(list)
    for path in sorted((ROOT / "tests").rglob("test_*.py")):
        seen[path.name].append(str(path.relative_to(ROOT)))
    assert {name: paths for name, paths in seen.items() if len(paths) > 1} == {}
