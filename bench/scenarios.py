"""The scenarios, and one measured run of a scenario against one system.

Every run reads the system's CPU time (process tree) just before the load starts and
just after it stops, so CPU per request is the work done while the requests it is
divided by were served; RSS is read right after the run.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from bench.procs import LOAD_CPU, SUT_CPU
from bench.procstat import CoreTimes, cpu_seconds, rss_mb, service_roots, wait_quiet
from bench.streamload import HoldOutcome, Target, hold_streams, percentile, run_streams
from bench.systems import CHAT_MODEL, EMBED_MODEL, STREAM_CHUNKS, FakeUpstream, System
from bench.wrkload import run_wrk, write_script

Kind = Literal["wrk", "stream", "hold"]
CHAT_PATH = "/v1/chat/completions"
EMBED_PATH = "/v1/embeddings"
SLOW_STREAMS = 1000
SLOW_CHUNK_DELAY_SECONDS = 1.0
SLOW_CHUNKS = 90
"""90 s per slow stream: longer than opening them all (60 s at most) plus the hold."""
OPEN_TIMEOUT_SECONDS = 60.0
CONTENTION_PERCENT = 15.0
"""A run is flagged when the SUT's core was busier than the SUT by more than this."""


def _body(payload: dict[str, object]) -> bytes:
    return json.dumps(payload, separators=(",", ":")).encode()


MESSAGES = [{"role": "user", "content": "Hello! Please tell me a short story."}]
CHAT_BODY = _body({"model": CHAT_MODEL, "messages": MESSAGES})
STREAM_BODY = _body(
    {
        "model": CHAT_MODEL,
        "messages": MESSAGES,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
)
EMBED_BODY = _body({"model": EMBED_MODEL, "input": "The quick brown fox jumps over the lazy dog"})


@dataclass(frozen=True, slots=True)
class Scenario:
    key: str
    title: str
    kind: Kind
    path: str
    body: bytes
    concurrency: int


SCENARIOS = (
    Scenario("chat-c1", "Non-streaming chat, concurrency 1", "wrk", CHAT_PATH, CHAT_BODY, 1),
    Scenario("chat-c16", "Non-streaming chat, concurrency 16", "wrk", CHAT_PATH, CHAT_BODY, 16),
    Scenario("chat-c64", "Non-streaming chat, concurrency 64", "wrk", CHAT_PATH, CHAT_BODY, 64),
    Scenario(
        "stream-c1", "Streaming chat (20 chunks + usage), concurrency 1", "stream", CHAT_PATH,
        STREAM_BODY, 1,
    ),
    Scenario(
        "stream-c16", "Streaming chat (20 chunks + usage), concurrency 16", "stream", CHAT_PATH,
        STREAM_BODY, 16,
    ),
    Scenario("embed-c16", "Embeddings, concurrency 16", "wrk", EMBED_PATH, EMBED_BODY, 16),
    Scenario(
        "slow-1000", f"{SLOW_STREAMS:,} concurrent slow streams (1 chunk/s), held open",
        "hold", CHAT_PATH, STREAM_BODY, SLOW_STREAMS,
    ),
)  # fmt: skip


@dataclass(slots=True)
class Sample:
    """One measured run: named figures, the error count and what went wrong."""

    metrics: dict[str, float]
    errors: int = 0
    notes: list[str] = field(default_factory=list)


@dataclass(slots=True)
class Measurer:
    wrk: str
    fake: FakeUpstream
    scripts: Path
    hold_seconds: float
    services: list[int] = field(default_factory=service_roots)

    def run(self, scenario: Scenario, system: System, seconds: float) -> Sample:
        system.check_alive()
        if scenario.kind == "wrk":
            sample = self._wrk(scenario, system, seconds)
        elif scenario.kind == "stream":
            sample = self._stream(scenario, system, seconds)
        else:
            sample = self._hold(scenario, system)
        if system.key != "direct":  # the fake runs on the load core, not on CPU 0
            _flag_contention(sample)
        # A server that died mid-run leaves figures that mean nothing: stop here.
        system.check_alive()
        self.fake.child.check_alive()
        # Let a queue of abandoned requests drain before the next system is measured.
        wait_quiet(system.pid)
        return sample

    def _wrk(self, scenario: Scenario, system: System, seconds: float) -> Sample:
        script = self.scripts / f"{system.key}-{scenario.key}.lua"
        if not script.exists():
            write_script(self.scripts, script.stem, scenario.body, system.api_key)
        window = _Window.start(system.pid, self.services)
        result = run_wrk(
            self.wrk,
            system.base_url + scenario.path,
            script,
            connections=scenario.concurrency,
            seconds=seconds,
        )
        metrics = window.finish(result.ok, result.seconds)
        metrics.update(
            rps=result.ok / result.seconds,
            p50_ms=result.p50_ms,
            p90_ms=result.p90_ms,
            p99_ms=result.p99_ms,
        )
        notes = [f"{result.errors} errors ({result.breakdown})"]
        return Sample(metrics, result.errors, notes if result.errors else [])

    def _target(self, scenario: Scenario, system: System) -> Target:
        host, port = system.host_port
        return Target(host, port, scenario.path, system.api_key, scenario.body)

    def _stream(self, scenario: Scenario, system: System, seconds: float) -> Sample:
        target = self._target(scenario, system)
        window = _Window.start(system.pid, self.services)
        stats, elapsed = asyncio.run(run_streams(target, scenario.concurrency, seconds))
        metrics = window.finish(stats.completed, elapsed)
        metrics.update(
            rps=stats.completed / elapsed,
            p50_ms=percentile(stats.total, 50) * 1000,
            p90_ms=percentile(stats.total, 90) * 1000,
            p99_ms=percentile(stats.total, 99) * 1000,
            ttfb_p50_ms=percentile(stats.ttfb, 50) * 1000,
            ttfb_p99_ms=percentile(stats.ttfb, 99) * 1000,
            usage_pct=100.0 * stats.with_usage / max(stats.completed, 1),
        )
        notes = [f"{stats.errors} failed streams: " + "; ".join(stats.error_samples)]
        if stats.completed and stats.with_usage < stats.completed:
            notes.append(f"{stats.completed - stats.with_usage} streams without a usage chunk")
        return Sample(metrics, stats.errors, notes if stats.errors else notes[1:])

    def _hold(self, scenario: Scenario, system: System) -> Sample:
        target = self._target(scenario, system)
        # Longer streams than usual, so that none ends on its own while a slow system is
        # still opening the last ones: all of them are open together during the hold.
        self.fake.control(chunk_delay_seconds=SLOW_CHUNK_DELAY_SECONDS, chunks=SLOW_CHUNKS)
        try:
            before = rss_mb(system.pid)
            window = _Window.start(system.pid, self.services)
            rss: list[float] = []
            open_now: list[float] = []

            def sample(outcome: HoldOutcome) -> None:
                rss.append(rss_mb(system.pid))
                open_now.append(float(outcome.open_now))

            outcome = asyncio.run(
                hold_streams(
                    target,
                    scenario.concurrency,
                    open_timeout=OPEN_TIMEOUT_SECONDS,
                    hold_seconds=self.hold_seconds,
                    sample=sample,
                )
            )
            metrics = window.finish(outcome.started, window.elapsed())
        finally:
            self.fake.control(chunk_delay_seconds=0.0, chunks=STREAM_CHUNKS)
        during = percentile(rss, 50)
        held = percentile(open_now, 50)
        metrics.update(
            opened=held,
            rss_before_mb=before,
            rss_open_mb=during,
            kb_per_stream=(during - before) * 1024 / max(held, 1),
        )
        errors = scenario.concurrency - outcome.started + outcome.ended
        notes = []
        if scenario.concurrency - outcome.started:
            notes.append(
                f"{scenario.concurrency - outcome.started} of {scenario.concurrency} streams "
                f"did not start within {OPEN_TIMEOUT_SECONDS:.0f} s"
                + (f" ({outcome.failed} failed)" if outcome.failed else "")
            )
        if outcome.ended:
            notes.append(f"{outcome.ended} streams ended while they were held")
        if outcome.error_samples:
            notes.append("errors seen: " + "; ".join(outcome.error_samples))
        return Sample(metrics, errors, notes)


def _flag_contention(sample: Sample) -> None:
    core = sample.metrics.get("sut_core_busy_pct", 0.0)
    own = sample.metrics.get("sut_cpu_pct", 0.0)
    if core - own > CONTENTION_PERCENT:
        sample.notes.append(
            f"CPU {SUT_CPU} was {core:.0f}% busy but the SUT used {own:.0f}%: other "
            "processes (PostgreSQL, Redis, another user's) competed for its core"
        )


@dataclass(slots=True)
class _Window:
    """CPU of the SUT and busy time of both cores between start and finish."""

    pid: int
    cpu: float
    services: list[int]
    services_cpu: float
    cores: CoreTimes
    started: float

    @classmethod
    def start(cls, pid: int, services: list[int]) -> _Window:
        services_cpu = sum(cpu_seconds(p) for p in services)
        return cls(
            pid, cpu_seconds(pid), services, services_cpu, CoreTimes.read(), time.monotonic()
        )

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def finish(self, completed: int, seconds: float) -> dict[str, float]:
        spent = cpu_seconds(self.pid) - self.cpu
        services = sum(cpu_seconds(p) for p in self.services) - self.services_cpu
        cores = CoreTimes.read()
        return {
            "completed": float(completed),
            "cpu_ms_per_req": 1000 * spent / completed if completed else 0.0,
            "services_cpu_ms_per_req": 1000 * services / completed if completed else 0.0,
            "sut_cpu_pct": 100 * spent / seconds if seconds > 0 else 0.0,
            "sut_core_busy_pct": cores.busy_percent_since(self.cores, SUT_CPU),
            "load_core_busy_pct": cores.busy_percent_since(self.cores, LOAD_CPU),
            "rss_mb": rss_mb(self.pid),
        }
