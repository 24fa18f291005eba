"""``python -m bench.gc``: collector pauses and CPU on the success and error paths.

Arona runs as in production (``arona serve``, PostgreSQL, Redis, one pinned core) in
front of the fake upstream, once per collector setting under test, interleaved. For
each setting it drives three loads with wrk (c=64): successful chats, an upstream
that answers 500, and one that answers 429 with ``Retry-After``. The breaker threshold
is raised out of reach so every failing call really goes upstream (the relay's error
path, not the breaker's short answer). The cooldown keeps its default: the one backend
cools after the first failure and is still used (every candidate cooling), so the
verdict is shared with the other replicas once per cooldown, as in production; a
cooldown shorter than the interval between calls would share one per request. A probe
loaded into the Arona process (``probe/sitecustomize.py``) records every collection's
pause. Reported per setting and load: requests/s, upstream calls per request (1: no
short answers), CPU per request, collections, and the pauses over 20 and 50 ms.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from bench.arona_sut import AronaDeployment, start_arona
from bench.procs import BenchError, Supervisor
from bench.procstat import cpu_seconds
from bench.scenarios import CHAT_BODY, CHAT_PATH
from bench.systems import start_fake
from bench.wrkload import ensure_wrk, run_wrk, write_script

PROBE_DIR = Path(__file__).parent / "probe"
DEFAULT_SETTINGS = "700,10,10;10000,20,100;50000,20,100"
"""CPython's default, and young collections every 10k and every 50k allocations."""
LOADS: dict[str, dict[str, object]] = {
    "success": {"fail_status": None},
    "upstream 500": {"fail_status": 500},
    "upstream 429": {"fail_status": 429, "retry_after": "1"},
}
CONNECTIONS = 64


@dataclass(frozen=True, slots=True)
class Pause:
    at: float
    generation: int
    seconds: float


@dataclass(slots=True)
class LoadFigures:
    setting: str
    load: str
    requests: int
    errors: int
    seconds: float
    cpu_seconds: float
    started: float
    ended: float
    upstream_calls: int
    """Calls the fake answered during the measured run (the breaker and the health
    probe must not turn the error loads into short answers that never go upstream)."""
    pauses: list[Pause]

    def row(self) -> str:
        cpu_ms = 1000 * self.cpu_seconds / max(self.requests, 1)
        longest = max((p.seconds for p in self.pauses), default=0.0) * 1000
        over_20 = sum(p.seconds > 0.020 for p in self.pauses)
        over_50 = sum(p.seconds > 0.050 for p in self.pauses)
        return (
            f"| ({self.setting}) | {self.load} | {self.requests / self.seconds:,.0f} | "
            f"{self.errors:,} | {self.upstream_calls / max(self.requests, 1):.2f} | "
            f"{cpu_ms:.2f} | {len(self.pauses)} | {longest:.1f} | "
            f"{over_20} | {over_50} |"
        )


class ProbedDeployment(AronaDeployment):
    """Arona with the collector probe loaded and the breaker out of reach."""

    def __init__(self, run_id: str, log: Path, thresholds: str) -> None:
        super().__init__(run_id)
        self._extra = {
            "PYTHONPATH": os.pathsep.join([str(PROBE_DIR), os.environ.get("PYTHONPATH", "")]),
            "ARONA_BENCH_GC_LOG": str(log),
            "ARONA_BENCH_GC_THRESHOLDS": thresholds,
            "ARONA_BREAKER_FAILURE_THRESHOLD": str(10**9),
            # The fake fails its model listing too: a health round during an error
            # load would take the backend out and turn every call into a short answer
            # (the "upstream calls/req" column shows it). Only the start-up probe runs.
            "ARONA_HEALTH_INTERVAL_SECONDS": "86400",
        }

    def environment(self, port: int) -> dict[str, str]:
        return {**super().environment(port), **self._extra}


def _read_pauses(log: Path) -> list[Pause]:
    if not log.exists():
        raise BenchError(f"the Arona process wrote no collector log at {log}")
    pauses = []
    for line in log.read_text().splitlines():
        raw = json.loads(line)
        pauses.append(Pause(raw["at"], raw["gen"], raw["s"]))
    return pauses


def measure_setting(
    setting: str, seconds: float, run_dir: Path, wrk: str, passes: int
) -> list[LoadFigures]:
    supervisor = Supervisor()
    log = run_dir / "gc.jsonl"
    deployment = ProbedDeployment(secrets.token_hex(4), log, setting)
    figures: list[LoadFigures] = []
    try:
        fake = start_fake(supervisor, run_dir)
        arona = start_arona(supervisor, deployment, fake, run_dir)
        script = write_script(run_dir, "chat", CHAT_BODY, arona.api_key)
        url = arona.base_url + CHAT_PATH
        # The loads alternate within one process, their order flipped every pass, so
        # a drift of the machine or of the process (warm caches, heap growth) lands on
        # every load alike instead of on the last one.
        order = [
            load
            for number in range(passes)
            for load in (list(LOADS) if number % 2 == 0 else list(LOADS)[::-1])
        ]
        for load in order:
            switches = LOADS[load]
            fake.control(reset=True, record_requests=False, **switches)
            run_wrk(wrk, url, script, connections=CONNECTIONS, seconds=2)  # warm-up
            fake.control(reset=True, record_requests=False, **switches)  # counters from 0
            cpu_before = cpu_seconds(arona.pid)
            started = time.time()
            result = run_wrk(wrk, url, script, connections=CONNECTIONS, seconds=seconds)
            ended = time.time()
            cpu = cpu_seconds(arona.pid) - cpu_before
            stats = fake.stats()
            upstream_calls = int(stats["chats"]) + int(stats["failures"])
            figures.append(
                LoadFigures(
                    setting,
                    load,
                    result.requests,
                    result.errors,
                    result.seconds,
                    cpu,
                    started,
                    ended,
                    upstream_calls,
                    [],
                )
            )
        assert arona.child is not None
        supervisor.stop(arona.child)
        pauses = _read_pauses(log)
        for figure in figures:
            figure.pauses = [p for p in pauses if figure.started <= p.at <= figure.ended]
    finally:
        supervisor.stop_all()
        deployment.close()
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.gc", description=__doc__)
    parser.add_argument("--seconds", type=float, default=15.0, help="per load (default 15)")
    parser.add_argument("--rounds", type=int, default=2, help="A/B rounds (default 2)")
    parser.add_argument(
        "--passes", type=int, default=2, help="passes over the loads per process (default 2)"
    )
    parser.add_argument(
        "--settings",
        default=DEFAULT_SETTINGS,
        help=f"';'-separated gc.set_threshold arguments (default {DEFAULT_SETTINGS})",
    )
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    settings = [s.strip() for s in args.settings.split(";") if s.strip()]
    wrk = ensure_wrk()
    rows = []
    tmp = Path(tempfile.mkdtemp(prefix="arona-bench-gc-"))
    try:
        for round_number in range(args.rounds):
            # Interleaved, the order flipped every round: drift on a shared machine
            # then lands on every setting alike.
            order = settings if round_number % 2 == 0 else settings[::-1]
            for index, setting in enumerate(order):
                run_dir = tmp / f"{round_number}-{index}"
                for figure in measure_setting(setting, args.seconds, run_dir, wrk, args.passes):
                    rows.append(figure.row())
                    print(rows[-1], flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print()
    print(
        "| thresholds | load | req/s | errors | upstream calls/req | CPU ms/req | collections |"
        " longest ms | >20 ms | >50 ms |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
