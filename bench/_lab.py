"""A lab for one benchmark: up, converged with the roles it needs, and down again whatever happens."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from contextlib import contextmanager

from superkube.fleet import converge as fleet
from superkube.lab import hosts as lab
from superkube.lab import layer
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


def kubectl(fleet: Lab, *args: str, stdin: str | None = None, timeout: float = 300) -> str:
    """The lab's kubectl as its admin; a refusal exits with kubectl's own words."""
    proc = subprocess.run(
        [*layer.kubectl(fleet), *args], input=stdin, capture_output=True, text=True, timeout=timeout
    )
    if proc.returncode != 0:
        raise SystemExit(f"kubectl {' '.join(args)}: {proc.stderr.strip()}")
    return proc.stdout
