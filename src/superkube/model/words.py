"""Counts in words, as every message and report writes them: 1 scale set, 2 scale sets."""

from __future__ import annotations


def plural(n: int, word: str, many: str = "") -> str:
    """`n` and the word for that many (`many`, else the word with an s): 1 node, 7,500 nodes."""
    return f"{n:,} {word if n == 1 else many or word + 's'}"
