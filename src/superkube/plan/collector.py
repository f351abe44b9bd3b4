"""Python's cycle collector, paused over bounded work that allocates much and frees little."""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator

_ENDS_WITH_COMMAND = False


def process_ends_with_command() -> None:
    """Said by the command line's entry point: this process ends when its one command does."""
    global _ENDS_WITH_COMMAND
    _ENDS_WITH_COMMAND = True


@contextlib.contextmanager
def paused(*, for_the_command: bool = False) -> Iterator[None]:
    """Pause the cycle collector for the work inside; it runs again as before afterwards.

    A plan imports the cloud provider's typed classes and registers every resource; a check renders
    the roles' variables through Ansible's templating. Both allocate a few hundred thousand
    long-lived objects, and the collector scans them again and again as they pile up: a quarter of
    the flagship's plan time (bench/plan.py). The work is bounded and leaves little cyclic garbage
    (about 2 MB for the flagship's plan), which the collector takes once it runs again.

    `for_the_command`: the work is the rest of a command, and where the process ends with it
    (`process_ends_with_command`) the collector stays paused: resuming would first scan all that
    the work left (0.2 s after the flagship's plan), which the process's exit frees at once."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled and not (for_the_command and _ENDS_WITH_COMMAND):
            gc.enable()


@contextlib.contextmanager
def set_aside() -> Iterator[None]:
    """Pause the cycle collector over work whose objects live as long as the process (the command
    line's imports: its framework, the spec's validators), then set them aside (`gc.freeze`), so that
    no later collection scans them again: the collector runs as before on what comes after."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        if was_enabled:
            gc.enable()
