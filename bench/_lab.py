"""A lab for one benchmark: up, converged with the roles it needs, and down again whatever happens."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from superkube.fleet import converge as fleet
from superkube.lab import hosts as lab
from superkube.lab.state import Lab


@contextmanager
def converged(hosts: str, tags: str) -> Iterator[Lab]:
    """Bring up a lab of `hosts` (lab --hosts syntax), converge the roles tagged `tags`, yield it,
    and take it down at the end; a failed converge or lab command exits with one line."""
    print(f"bringing up a lab of {hosts} ...", flush=True)
    the_lab = lab.up(hosts, lambda what, f: None)
    try:
        result = fleet.converge(the_lab.inventory, tags=tags)
        if not result.ok:
            raise SystemExit(f"converge failed on {', '.join(result.failed_hosts)}")
        yield the_lab
    except lab.LabError as e:
        raise SystemExit(str(e)) from None
    finally:
        lab.down()
