"""Keep PostgreSQL and Redis off the core the system under test runs on.

In production the database and Redis run on other machines: their CPU is not the
gateway's. On a bench box they are local services that float over every core, so
when a run makes them work harder (Step 13's reservations double Redis's work per
call) they preempt the gateway on its own core, and the gateway's CPU per request
rises with context switches and caches they evicted, not with its own work. Measured
on the 2-core bench machine (docs/performance.md, "Services off the gateway's
core"): with one token limit on, the gateway's CPU per call was 1.20x the request
quota's with the services floating and 1.01x with them on the load core.

Every thread of the services' live processes is moved to the cores other than the
SUT's while a run lasts; PostgreSQL's backends forked meanwhile inherit it from the
postmaster. The original affinities come back at the end. Their CPU is still
measured and reported (``PostgreSQL + Redis CPU ms per request``).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

from bench.procs import SUT_CPU, USABLE_CPUS
from bench.procstat import PROC, descendants


def _threads(pid: int) -> list[int]:
    try:
        return [int(t.name) for t in (PROC / str(pid) / "task").iterdir()]
    except OSError:
        return []


@contextlib.contextmanager
def services_off_sut_core(roots: list[int]) -> Iterator[str]:
    """Pin every thread under ``roots`` to the cores other than ``SUT_CPU``; yields a
    note for the report saying what was done (or why it could not be)."""
    others = set(USABLE_CPUS) - {SUT_CPU}
    if SUT_CPU not in USABLE_CPUS or not others:
        yield "services not pinned: the SUT core is not usable, or no other core is"
        return
    saved: dict[int, set[int]] = {}
    refused: list[str] = []
    for root in roots:
        for pid in descendants(root):
            for tid in _threads(pid):
                try:
                    before = os.sched_getaffinity(tid)
                    os.sched_setaffinity(tid, others)
                except ProcessLookupError:
                    continue
                except OSError as exc:
                    refused.append(f"{tid}: {exc.strerror}")
                    continue
                saved[tid] = before
    cores = ",".join(str(c) for c in sorted(others))
    note = (
        f"PostgreSQL and Redis ({len(saved)} threads) pinned to core(s) {cores}, off the "
        f"SUT's core {SUT_CPU}, for the run (as on separate machines in production)"
    )
    if refused:
        note += f"; {len(refused)} threads could not be moved ({refused[0]})"
    try:
        yield note
    finally:
        for tid, cpus in saved.items():
            with contextlib.suppress(OSError):
                os.sched_setaffinity(tid, cpus)
