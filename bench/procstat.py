"""CPU time and memory of a process tree, and per-core busy time, from /proc.

CPU is utime + stime of the process and every live descendant, plus cutime + cstime
of the root (children it already reaped), so a server that forks (LiteLLM) is charged
for its workers. RSS is the sum of VmRSS over the same tree (shared pages of forked
workers are counted once per process, as ``ps`` would).
"""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass
from pathlib import Path

PROC = Path("/proc")
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def _stat_fields(pid: int) -> list[str] | None:
    try:
        raw = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    # The command name is in parentheses and may hold spaces: split after it.
    return raw[raw.rindex(")") + 2 :].split()


def descendants(root: int) -> list[int]:
    """``root`` and every live process below it."""
    children: dict[int, list[int]] = {}
    for entry in PROC.iterdir():
        if not entry.name.isdigit():
            continue
        fields = _stat_fields(int(entry.name))
        if fields is not None:
            children.setdefault(int(fields[1]), []).append(int(entry.name))
    found: list[int] = []
    pending = [root]
    while pending:
        pid = pending.pop()
        found.append(pid)
        pending.extend(children.get(pid, ()))
    return found


def cpu_seconds(root: int) -> float:
    """CPU time (user + system) consumed so far by the tree under ``root``."""
    ticks = 0
    for pid in descendants(root):
        fields = _stat_fields(pid)
        if fields is None:
            continue
        # Fields after the name, 0-based: 11 utime, 12 stime, 13 cutime, 14 cstime.
        ticks += int(fields[11]) + int(fields[12])
        if pid == root:
            ticks += int(fields[13]) + int(fields[14])
    return ticks / CLOCK_TICKS


def service_roots(names: tuple[str, ...] = ("postgres", "redis-server")) -> list[int]:
    """The top processes of the named services (PostgreSQL's postmaster, redis-server).

    Arona's database and Redis work is done there, outside its own process tree; the
    harness reports it separately (it may include other users' work on a shared box).
    """
    comm: dict[int, tuple[str, int]] = {}
    for entry in PROC.iterdir():
        if not entry.name.isdigit():
            continue
        fields = _stat_fields(int(entry.name))
        with contextlib.suppress(OSError):
            name = (entry / "comm").read_text().strip()
            if fields is not None:
                comm[int(entry.name)] = (name, int(fields[1]))
    return [
        pid
        for pid, (name, parent) in comm.items()
        if name in names and comm.get(parent, ("", 0))[0] != name
    ]


def rss_mb(root: int) -> float:
    total_kb = 0
    for pid in descendants(root):
        with contextlib.suppress(OSError, ValueError):
            for line in (PROC / str(pid) / "status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total_kb += int(line.split()[1])
                    break
    return total_kb / 1024


@dataclass(frozen=True, slots=True)
class CoreTimes:
    busy: dict[int, float]
    total: dict[int, float]

    @classmethod
    def read(cls) -> CoreTimes:
        busy: dict[int, float] = {}
        total: dict[int, float] = {}
        for line in (PROC / "stat").read_text().splitlines():
            name, *values = line.split()
            if not name.startswith("cpu") or name == "cpu":
                continue
            ticks = [int(v) for v in values]
            idle = ticks[3] + ticks[4]  # idle + iowait
            core = int(name[3:])
            total[core] = float(sum(ticks[:8]))
            busy[core] = total[core] - idle
        return cls(busy, total)

    def busy_percent_since(self, earlier: CoreTimes, core: int) -> float:
        spent = self.total.get(core, 0.0) - earlier.total.get(core, 0.0)
        if spent <= 0:
            return 0.0
        return 100.0 * (self.busy.get(core, 0.0) - earlier.busy.get(core, 0.0)) / spent


def wait_quiet(root: int, *, limit: float = 5.0, window: float = 0.25) -> None:
    """Wait until the tree is (nearly) idle, so leftovers of one run (a queue of requests
    the client already gave up on) do not run on the core during the next system's run."""
    deadline = time.monotonic() + limit
    previous = cpu_seconds(root)
    while time.monotonic() < deadline:
        time.sleep(window)
        now = cpu_seconds(root)
        if now - previous <= 0.02:  # at most two ticks of background work
            return
        previous = now
