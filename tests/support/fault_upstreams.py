"""Faulty upstreams for the fault-isolation tests, and the loads that measure them.

Three faults, each behind an OpenAI-compatible address the replicas can register:

- **hang**: a ``FakeOpenAI`` told to hold every API call (``FakeControl.hang``);
- **slow**: a ``FakeOpenAI`` that answers after ``delay_seconds`` (past the replica's
  upstream read timeout; its model listing too, so health probes fail as well);
- **reset**: a raw asyncio TCP server that answers the model listing (so health probes
  pass and routing keeps choosing it: only the breaker can stop it) and resets every
  other connection (``SO_LINGER`` 0, then close: the kernel sends RST) once it has read
  the request.

A slow upstream that still answers within the timeout is ``gated_upstream``: a
``FakeOpenAI`` whose chat calls wait at a gate the test opens once it has measured what
it wanted while they were held; they are then answered (200). Its model listing is
never held, so health probes pass however long a measurement takes.

``FaultyUpstream.reached()`` counts chat calls that got to the upstream, so a test can
prove later calls were refused by the gateway without touching it. The loads: paced
workers measuring a healthy model (``healthy_load``), workers kept calling another
model around a measurement (``hammering``), and interleaved rounds (``interleave``).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import statistics
import struct
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Literal

import msgspec
import openai

from app.fakes.asgi_io import Receive, Scope, Send
from app.fakes.openai_upstream import FakeOpenAI
from app.fakes.serve import serve_asgi

Fault = Literal["hang", "slow", "reset"]
MESSAGES: list[openai.types.chat.ChatCompletionMessageParam] = [
    {"role": "user", "content": "hello"}
]
CHAT_SUFFIX = "/chat/completions"
MAX_HEAD_BYTES = 64 * 1024


@dataclass
class FaultyUpstream:
    url: str
    begin: Callable[[], None]
    """Switch the fault on (after the backend was registered and found healthy)."""
    reached: Callable[[], int]
    """Chat calls that reached the upstream so far."""
    held: Callable[[], int]
    """Calls the upstream holds open right now (0 for one that resets at once)."""


class ChatCounter:
    """An ASGI wrapper that counts the chat calls reaching ``fake`` (the fake's own
    record keeps only the newest 256 and counts a hung call nowhere else)."""

    def __init__(self, fake: FakeOpenAI) -> None:
        self.fake = fake
        self.chats = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and str(scope["path"]).endswith(CHAT_SUFFIX):
            self.chats += 1
        await self.fake(scope, receive, send)

    def release(self) -> None:
        # serve_asgi frees held calls on shutdown through this hook.
        self.fake.release()


class GatedUpstream(ChatCounter):
    """Holds every chat call reaching ``fake`` while the gate is shut (``hold()``) and
    passes it on to the fake once the gate opens (``let_through()``). Other requests
    (the model listing the health probes read) pass at once."""

    def __init__(self, fake: FakeOpenAI) -> None:
        super().__init__(fake)
        self.waiting = 0
        """Chat calls held at the gate right now."""
        self._gate = asyncio.Event()
        self._gate.set()

    def hold(self) -> None:
        """Shut the gate: chat calls from now on wait at it."""
        self._gate.clear()

    def let_through(self) -> None:
        """Open the gate: every held chat call goes on to the fake, later ones too."""
        self._gate.set()

    def release(self) -> None:
        self.let_through()
        super().release()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and str(scope["path"]).endswith(CHAT_SUFFIX):
            self.waiting += 1
            try:
                await self._gate.wait()
            finally:
                self.waiting -= 1
        await super().__call__(scope, receive, send)


class ResettingUpstream:
    """Answers ``GET .../models`` with ``models``; resets every other request."""

    def __init__(self, models: list[str]) -> None:
        listing = [{"id": m, "object": "model", "owned_by": "resetter"} for m in models]
        self._listing = msgspec.json.encode({"object": "list", "data": listing})
        self.chats = 0
        self.resets = 0

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
            writer.transport.abort()
            return
        method, _, rest = head.partition(b" ")
        path = rest.partition(b" ")[0]
        if method == b"GET" and path.endswith(b"/models"):
            writer.write(
                b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                b"Content-Length: %d\r\nConnection: close\r\n\r\n"
                % len(self._listing)
                + self._listing
            )
            with contextlib.suppress(ConnectionError):
                await writer.drain()
            writer.close()
            return
        if path.endswith(CHAT_SUFFIX.encode()):
            self.chats += 1
        # Read the body first: the reset then hits a client waiting for its answer,
        # not one still sending.
        length = _content_length(head)
        with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
            if length:
                await reader.readexactly(length)
        sock = writer.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.resets += 1
        writer.transport.abort()


def _content_length(head: bytes) -> int:
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return int(value.strip() or b"0")
    return 0


@contextlib.asynccontextmanager
async def serve_resetting(models: list[str]) -> AsyncIterator[tuple[ResettingUpstream, str]]:
    upstream = ResettingUpstream(models)
    server = await asyncio.start_server(
        upstream.handle, "127.0.0.1", 0, limit=MAX_HEAD_BYTES, reuse_address=True
    )
    port = server.sockets[0].getsockname()[1]
    try:
        yield upstream, f"http://127.0.0.1:{port}"
    finally:
        server.close()
        await server.wait_closed()


@contextlib.asynccontextmanager
async def faulty_upstream(
    fault: Fault, name: str, model: str, slow_seconds: float
) -> AsyncIterator[FaultyUpstream]:
    """An upstream serving ``model`` that misbehaves as ``fault`` once ``begin()`` ran."""
    if fault == "reset":
        async with serve_resetting([model]) as (resetter, url):
            yield FaultyUpstream(url, lambda: None, lambda: resetter.chats, lambda: 0)
        return
    fake = FakeOpenAI(name, models=[model])
    fake.control.record_requests = False
    counter = ChatCounter(fake)

    def begin() -> None:
        if fault == "hang":
            fake.control.hang = True
        else:
            fake.control.delay_seconds = slow_seconds

    async with serve_asgi(counter) as url:
        yield FaultyUpstream(url, begin, lambda: counter.chats, lambda: fake.stats.in_flight)


@contextlib.asynccontextmanager
async def gated_upstream(name: str, model: str) -> AsyncIterator[tuple[GatedUpstream, str]]:
    """A healthy upstream serving ``model`` whose chat calls ``GatedUpstream`` can hold."""
    fake = FakeOpenAI(name, models=[model])
    fake.control.record_requests = False
    gated = GatedUpstream(fake)
    async with serve_asgi(gated) as url:
        yield gated, url


# -- loads ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Outcome:
    """One call to the faulty model: how long it took and what the gateway answered."""

    seconds: float
    status: int | None
    """200 for an answer; None when the call got no HTTP answer at all (a transport
    error or the client's own timeout), which isolation must never produce."""
    code: str | None
    message: str


async def faulty_call(client: openai.AsyncOpenAI, model: str, *, stream: bool) -> Outcome:
    started = time.perf_counter()
    try:
        if stream:
            chunks = await client.chat.completions.create(
                model=model, messages=MESSAGES, stream=True
            )
            async for _ in chunks:
                pass
        else:
            await client.chat.completions.create(model=model, messages=MESSAGES)
    except openai.APIStatusError as exc:
        body = exc.body if isinstance(exc.body, dict) else {}
        return Outcome(
            time.perf_counter() - started, exc.status_code, exc.code, str(body.get("message"))
        )
    except openai.APIError as exc:
        return Outcome(time.perf_counter() - started, None, None, repr(exc))
    return Outcome(time.perf_counter() - started, 200, None, "answered")


async def healthy_load(
    client: openai.AsyncOpenAI,
    model: str,
    expected: str,
    *,
    requests: int,
    workers: int,
    pause: float,
) -> list[float]:
    """``requests`` chat calls to ``model`` by ``workers`` paced workers (each pauses
    ``pause`` s between its calls, so the replica is measured, not saturated); the
    latency of each, in seconds. Every answer must be ``expected``."""
    latencies: list[float] = []
    tickets = iter(range(requests))

    async def worker(index: int) -> None:
        await asyncio.sleep(pause * index / workers)  # spread the workers' phases
        for _ in tickets:
            started = time.perf_counter()
            answer = await client.chat.completions.create(model=model, messages=MESSAGES)
            latencies.append(time.perf_counter() - started)
            assert answer.choices[0].message.content == expected
            await asyncio.sleep(pause)

    await asyncio.gather(*(worker(i) for i in range(workers)))
    return latencies


@dataclass
class FaultLoad:
    """Calls to the other model (faulty, or its healthy twin), kept up until the block
    ends."""

    outcomes: list[Outcome] = field(default_factory=list)
    sent: int = 0


@contextlib.asynccontextmanager
async def hammering(
    client: openai.AsyncOpenAI, model: str, *, workers: int, pause: float
) -> AsyncIterator[FaultLoad]:
    """``workers`` workers calling ``model`` (plain and streamed calls alternately), each
    pausing ``pause`` s between calls, from before the block starts (every worker has a
    call out) until it ends (each finishes the call it has out)."""
    load = FaultLoad()
    stop = asyncio.Event()
    all_out = asyncio.Event()

    async def worker(index: int) -> None:
        turn = index
        while not stop.is_set():
            load.sent += 1
            if load.sent >= workers:
                all_out.set()
            load.outcomes.append(await faulty_call(client, model, stream=turn % 2 == 1))
            turn += 1
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), pause)

    tasks = [asyncio.create_task(worker(i)) for i in range(workers)]
    try:
        await all_out.wait()
        yield load
    finally:
        stop.set()
        await asyncio.gather(*tasks)


async def lowest_while(probe: Callable[[], int], task: asyncio.Future[list[float]]) -> int:
    """The lowest ``probe()`` seen every few milliseconds until ``task`` is done."""
    lowest = probe()
    while not task.done():
        lowest = min(lowest, probe())
        await asyncio.sleep(0.005)
    return lowest


Measurement = Callable[[], Awaitable[list[float]]]


class Latencies:
    """Latencies of the healthy model's calls, per condition (a name)."""

    def __init__(self) -> None:
        self.samples: dict[str, list[float]] = {}

    def add(self, condition: str, latencies: list[float]) -> None:
        self.samples.setdefault(condition, []).extend(latencies)

    def p50(self, condition: str) -> float:
        return p50(self.samples[condition])

    def ratio(self, condition: str, reference: str) -> float:
        return self.p50(condition) / self.p50(reference)

    def summary(self) -> str:
        return ", ".join(
            f"{name} {p50(values) * 1000:.1f} ms ({len(values)} calls)"
            for name, values in self.samples.items()
        )


async def interleave(latencies: Latencies, conditions: dict[str, Measurement], rounds: int) -> None:
    """``rounds`` rounds of one measurement per condition, in order and then in reverse
    (A B C C B A A B C ...), so the drifts of a shared machine hit all of them alike."""
    order = list(conditions)
    for index in range(rounds):
        for name in order if index % 2 == 0 else order[::-1]:
            latencies.add(name, await conditions[name]())


def p50(samples: list[float]) -> float:
    return statistics.median(samples)
