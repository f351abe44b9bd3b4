"""Python's cycle collector, paused over bounded work that allocates much and frees little."""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator


@contextlib.contextmanager
def paused() -> Iterator[None]:
    """Pause the cycle collector for the work inside; it runs again as before afterwards.

    A plan imports the cloud provider's typed classes and registers every resource; a check renders
    the roles' variables through Ansible's templating. Both allocate a few hundred thousand
    long-lived objects, and the collector scans them again and again as they pile up: a quarter of
    the flagship's plan time (bench/plan.py). The work is bounded and leaves little cyclic garbage
    (about 2 MB for the flagship's plan), which the collector takes once it runs again."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
