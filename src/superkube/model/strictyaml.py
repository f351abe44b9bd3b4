"""YAML read strictly: a key written twice in one mapping is an error, not a silent last-wins.

Pulumi's CLI refuses a stack file with a duplicate key; PyYAML keeps the last value. Stack files and
the YAML documents held in their string values (`node_pools`, `teams`, ...) are read with this.
"""

from __future__ import annotations

from typing import Any

import yaml
from yaml.constructor import SafeConstructor

try:
    from yaml import CSafeLoader as FastSafeLoader
except ImportError:  # PyYAML built without libyaml
    from yaml import SafeLoader as FastSafeLoader  # type: ignore[assignment]

MERGE_TAG = "tag:yaml.org,2002:merge"


class DuplicateKeyError(ValueError):
    """A mapping that names one key twice: the key, and both lines (1-based, in the text read)."""

    def __init__(self, key: Any, first_line: int, line: int) -> None:
        self.key = key
        self.first_line = first_line
        self.line = line
        super().__init__(self.message())

    def message(self, offset: int = 0, of: str = "") -> str:
        """The one line, with the lines moved by `offset` (the text read began there) and named `of`."""
        first, line = self.first_line + offset, self.line + offset
        lines = f"line {line}" if first == line else f"lines {first} and {line}"
        return f"key {self.key!r} is written twice ({lines}{' of ' + of if of else ''})"


def _strict_mapping(self: SafeConstructor, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
    """SafeLoader's mapping, refusing a key written twice (merge keys `<<` may still be overridden)."""
    seen: dict[Any, int] = {}
    for key_node, _ in node.value:
        if key_node.tag == MERGE_TAG:
            continue
        key = self.construct_object(key_node, deep=True)
        try:
            if key in seen:
                raise DuplicateKeyError(key, seen[key], key_node.start_mark.line + 1)
            seen[key] = key_node.start_mark.line + 1
        except TypeError:
            continue  # an unhashable key: SafeLoader says so itself
    return SafeConstructor.construct_mapping(self, node, deep)


class StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate keys at any depth (merge keys `<<` may still be overridden)."""

    construct_mapping = _strict_mapping


class _FastStrictLoader(FastSafeLoader):
    """StrictLoader read by libyaml where PyYAML has it: the same documents, several times faster."""

    construct_mapping = _strict_mapping


def load(text: str) -> Any:
    """One YAML document, strictly (DuplicateKeyError; yaml.YAMLError for anything else)."""
    try:
        return yaml.load(text, Loader=_FastStrictLoader)  # a SafeLoader subclass: safe
    except yaml.YAMLError:
        # not YAML: read again by PyYAML's own reader, whose error names the problem and its place
        return yaml.load(text, Loader=StrictLoader)


def safe_load(text: str) -> Any:
    """`yaml.safe_load`, read by libyaml where PyYAML has it (for the package's own data files)."""
    return yaml.load(text, Loader=FastSafeLoader)  # safe: SafeLoader's constructor


def compose(text: str) -> yaml.Node | None:
    """The document's node tree, for the lines its values start on."""
    return yaml.compose(text, Loader=StrictLoader)
