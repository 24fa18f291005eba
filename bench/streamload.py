"""Streaming load: a small raw-asyncio HTTP/1.1 client for SSE chat streams.

Raw sockets rather than httpx: the client shares its core with the fake upstream, and
a full HTTP client would spend more of that core than the streams themselves. Each
worker keeps one keep-alive connection and sends one streaming request after another;
the chunked body is decoded just enough to find its end, and the time to the first
body byte and to the end of the stream are recorded.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

STREAM_TIMEOUT_SECONDS = 60.0
DONE_MARK = b"data: [DONE]"
USAGE_MARK = b'"prompt_tokens"'


class ProtocolError(Exception):
    pass


@dataclass(frozen=True, slots=True)
class Target:
    host: str
    port: int
    path: str
    key: str
    body: bytes

    def request(self) -> bytes:
        head = (
            f"POST {self.path} HTTP/1.1\r\n"
            f"Host: {self.host}:{self.port}\r\n"
            "Content-Type: application/json\r\n"
            "Accept: text/event-stream\r\n"
            f"Authorization: Bearer {self.key}\r\n"
            f"Content-Length: {len(self.body)}\r\n\r\n"
        )
        return head.encode() + self.body


@dataclass(slots=True)
class StreamStats:
    ttfb: list[float] = field(default_factory=list)
    total: list[float] = field(default_factory=list)
    completed: int = 0
    """Streams that ended with ``data: [DONE]`` after a 200."""
    with_usage: int = 0
    errors: int = 0
    error_samples: list[str] = field(default_factory=list)

    def error(self, what: str) -> None:
        self.errors += 1
        if len(self.error_samples) < 5:
            self.error_samples.append(what)


@dataclass(slots=True)
class Response:
    status: int
    body: bytes
    keep_alive: bool


async def _read_head(reader: asyncio.StreamReader) -> tuple[int, dict[str, str]]:
    raw = await reader.readuntil(b"\r\n\r\n")
    lines = raw.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ", 2)
    if len(parts) < 2 or not parts[1].isdigit():
        raise ProtocolError(f"bad status line {lines[0]!r}")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if sep:
            headers[name.strip().lower()] = value.strip()
    return int(parts[1]), headers


async def _read_chunked(
    reader: asyncio.StreamReader, on_first: Callable[[float], None] | None
) -> bytes:
    body = bytearray()
    while True:
        size_line = await reader.readuntil(b"\r\n")
        size = int(size_line.split(b";", 1)[0], 16)
        if size == 0:
            # No trailers are sent by these servers; the empty line ends the body.
            while await reader.readuntil(b"\r\n") != b"\r\n":
                pass
            return bytes(body)
        chunk = await reader.readexactly(size + 2)
        if on_first is not None and not body:
            on_first(time.perf_counter())
        body += chunk[:-2]


async def exchange(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    request: bytes,
    on_first: Callable[[float], None] | None = None,
) -> Response:
    """One request on an open connection; ``on_first`` gets the time body bytes arrived."""
    writer.write(request)
    status, headers = await _read_head(reader)
    keep_alive = headers.get("connection", "").lower() != "close"
    if "chunked" in headers.get("transfer-encoding", "").lower():
        body = await _read_chunked(reader, on_first)
    elif "content-length" in headers:
        body = await reader.readexactly(int(headers["content-length"]))
    else:
        body = await reader.read()
        keep_alive = False
    return Response(status, body, keep_alive)


async def _worker(target: Target, deadline: float, stats: StreamStats) -> None:
    request = target.request()
    connection: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
    try:
        while time.monotonic() < deadline:
            if connection is None:
                try:
                    connection = await asyncio.open_connection(target.host, target.port)
                except OSError as exc:
                    stats.error(f"connect: {exc}")
                    await asyncio.sleep(0.1)
                    continue
            reader, writer = connection
            started = time.perf_counter()
            first: list[float] = []
            try:
                async with asyncio.timeout(STREAM_TIMEOUT_SECONDS):
                    response = await exchange(reader, writer, request, first.append)
            except (OSError, TimeoutError, asyncio.IncompleteReadError, ProtocolError) as exc:
                stats.error(f"{type(exc).__name__}: {exc}")
                writer.close()
                connection = None
                continue
            ended = time.perf_counter()
            if not response.keep_alive:
                writer.close()
                connection = None
            if response.status != 200 or DONE_MARK not in response.body:
                stats.error(f"status {response.status}: {response.body[:200]!r}")
                continue
            stats.completed += 1
            stats.with_usage += USAGE_MARK in response.body
            stats.ttfb.append((first[0] if first else ended) - started)
            stats.total.append(ended - started)
    finally:
        if connection is not None:
            connection[1].close()


async def run_streams(
    target: Target, concurrency: int, seconds: float
) -> tuple[StreamStats, float]:
    """Keep ``concurrency`` streams going for ``seconds``; the stats and the elapsed time."""
    stats = StreamStats()
    started = time.monotonic()
    deadline = started + seconds
    await asyncio.gather(*(_worker(target, deadline, stats) for _ in range(concurrency)))
    return stats, time.monotonic() - started


@dataclass(slots=True)
class HoldOutcome:
    started: int = 0
    """Streams whose first body bytes arrived."""
    open_now: int = 0
    ended: int = 0
    """Streams that finished or broke while they should have been held."""
    failed: int = 0
    """Streams that never started (connect or request failed)."""
    error_samples: list[str] = field(default_factory=list)

    def note(self, exc: BaseException) -> None:
        if len(self.error_samples) < 5:
            self.error_samples.append(f"{type(exc).__name__}: {exc}")


async def _hold_one(
    target: Target,
    outcome: HoldOutcome,
    all_started: asyncio.Event,
    wanted: int,
    gate: asyncio.Semaphore,
) -> None:
    writer: asyncio.StreamWriter | None = None
    started = False
    let_go = False

    def mark_started(_: float) -> None:
        nonlocal started
        started = True
        outcome.started += 1
        outcome.open_now += 1
        if outcome.started + outcome.failed >= wanted:
            all_started.set()

    try:
        async with gate:
            # The gate only spaces out connects; the stream is held after it is released.
            reader, writer = await asyncio.open_connection(target.host, target.port)
        await exchange(reader, writer, target.request(), mark_started)
    except asyncio.CancelledError:
        let_go = True  # the harness is done holding: not an early end
        raise
    except (OSError, asyncio.IncompleteReadError, ProtocolError) as exc:
        outcome.note(exc)
        if not started:
            outcome.failed += 1
            if outcome.started + outcome.failed >= wanted:
                all_started.set()
    finally:
        if started and not let_go:
            outcome.open_now -= 1
            outcome.ended += 1
        if writer is not None:
            writer.transport.abort()


async def hold_streams(
    target: Target,
    count: int,
    *,
    open_timeout: float,
    hold_seconds: float,
    sample: Callable[[HoldOutcome], None],
) -> HoldOutcome:
    """Open ``count`` slow streams; once all have started (or ``open_timeout`` passed),
    call ``sample`` once a second for ``hold_seconds``; then drop every connection."""
    outcome = HoldOutcome()
    all_started = asyncio.Event()
    gate = asyncio.Semaphore(100)
    tasks = [
        asyncio.create_task(_hold_one(target, outcome, all_started, count, gate))
        for _ in range(count)
    ]
    try:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(open_timeout):
                await all_started.wait()
        for _ in range(max(round(hold_seconds), 1)):
            await asyncio.sleep(1.0)
            sample(outcome)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return outcome


def percentile(values: list[float], share: float) -> float:
    """Nearest-rank percentile (``share`` in 0..100) of unsorted values; 0 when empty."""
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = max(math.ceil(share / 100 * len(ordered)) - 1, 0)
    return ordered[min(rank, len(ordered) - 1)]
