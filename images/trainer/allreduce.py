"""A small MPI program for the lab's trainer image: every rank adds its number into one sum with
MPI_Allreduce, for `--seconds` (rounds of one allreduce each), and rank 0 prints what it got, what it
should have got, and where every rank ran. Exit 1 on a wrong sum: a job that ran is not one that
computed right.

    mpirun python3 /opt/superkube/allreduce.py [--seconds S]
"""

from __future__ import annotations

import argparse
import json
import socket
import sys
import time

from mpi4py import MPI


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=0.0, help="keep reducing for this long")
    args = parser.parse_args()
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    host = socket.gethostname()
    where = comm.gather({"rank": rank, "host": host, "ip": socket.gethostbyname(host)}, root=0)
    expected = size * (size + 1) // 2
    rounds, total = 0, 0
    deadline = time.monotonic() + args.seconds
    while True:
        total = comm.allreduce(rank + 1, op=MPI.SUM)
        rounds += 1
        done = comm.bcast(time.monotonic() >= deadline if rank == 0 else None, root=0)
        if total != expected or done:
            break
        time.sleep(0.5)
    if rank == 0:
        hosts = sorted({w["host"] for w in where})
        report = {
            "ranks": size,
            "hosts": hosts,
            "where": where,
            "rounds": rounds,
            "sum": total,
            "expected": expected,
        }
        print("allreduce " + json.dumps(report), flush=True)
        print(
            f"allreduce over {size} ranks on {len(hosts)} hosts: sum {total}, expected {expected}: "
            f"{'OK' if total == expected else 'WRONG'}",
            flush=True,
        )
    return 0 if total == expected else 1


if __name__ == "__main__":
    sys.exit(main())
