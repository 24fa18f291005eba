"""Graceful shutdown of one replica under streaming load.

SIGTERM to replica A while it relays slow streams: A stops accepting connections at
once, lets every started stream finish with ``[DONE]``, flushes its usage and exits 0;
every completed call is metered exactly once; calls on B meanwhile are unaffected.
This module stops A, so it has its cluster to itself.
"""

from __future__ import annotations

import asyncio
import signal
import socket
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import asyncpg
import openai
import pytest

from app.fakes.openai_upstream import FakeOpenAI
from app.fakes.serve import serve_asgi
from tests.support.cluster import (
    Cluster,
    eventually,
    new_tenant,
    register_backend,
    stop_replica,
    unique,
    wait_healthy_everywhere,
)

pytestmark = pytest.mark.cluster

CLUSTER_ENV = {"ARONA_USAGE_FLUSH_SECONDS": "600"}
"""No timed flush during the test: a usage row can only come from a shutdown's flush."""

STREAMS_ON_A = 20
STREAMS_ON_B = 8
CHUNKS = 20
CHUNK_DELAY_SECONDS = 0.15
"""About 3 s a stream: long enough that A stops accepting while they all still run."""


class StreamOutcome:
    def __init__(self) -> None:
        self.started = asyncio.Event()
        self.finished = False
        self.content = ""
        self.done = False


async def stream_chat(
    sdk: openai.AsyncOpenAI, model: str, conversation_id: str, outcome: StreamOutcome
) -> None:
    """A streamed chat read line by line, so the final ``data: [DONE]`` is seen itself
    (the SDK's parsed iterator would end the same way on a cut stream)."""
    async with sdk.chat.completions.with_streaming_response.create(
        model=model,
        messages=[{"role": "user", "content": "tell me slowly"}],
        stream=True,
        extra_body={"conversation_id": conversation_id},
    ) as response:
        assert response.status_code == 200
        async for line in response.iter_lines():
            if not line.startswith("data: "):
                continue
            data = line[len("data: ") :]
            if data == "[DONE]":
                outcome.done = True
                continue
            assert not outcome.done, "a frame after [DONE]"
            if '"content"' in data:
                outcome.started.set()
                outcome.content += data
    outcome.finished = True


def accepts_connections(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(1.0)
        try:
            sock.connect(("127.0.0.1", port))
        except OSError:
            return False
        return True


@dataclass
class Drain:
    """What one SIGTERM under load showed; the tests below each judge one part."""

    backend: str
    on_a: dict[str, StreamOutcome]
    on_b: dict[str, StreamOutcome]
    running_when_refused: int
    late_call_error: BaseException | None
    exit_code: int
    output_a: str
    rows_after_a: list[asyncpg.Record]
    """Usage rows of the project once A exited (B still running)."""
    b_exit_code: int
    rows: list[asyncpg.Record] = field(default_factory=list)
    """Usage rows of the project once B stopped as well."""


@pytest.fixture(scope="module")
async def drain(cluster: Cluster) -> AsyncIterator[Drain]:
    tenant = await new_tenant(cluster.a)
    fake = FakeOpenAI(unique("slow"), models=[unique("model")])
    model = fake.control.models[0]
    async with serve_asgi(fake) as url:
        name = unique("backend")
        await register_backend(cluster.a, name, url)
        await wait_healthy_everywhere(cluster, name)
        fake.control.chunks = CHUNKS
        fake.control.chunk_delay_seconds = CHUNK_DELAY_SECONDS
        replica_a = cluster.replicas[0]
        sdk_a, sdk_b = cluster.sdk(0, tenant.api_key), cluster.sdk(1, tenant.api_key)
        run = uuid.uuid4().hex[:8]

        on_a = {f"a-{run}-{i}": StreamOutcome() for i in range(STREAMS_ON_A)}
        tasks_a = [
            asyncio.create_task(stream_chat(sdk_a, model, conv, outcome))
            for conv, outcome in on_a.items()
        ]
        async with asyncio.timeout(15):
            await asyncio.gather(*(o.started.wait() for o in on_a.values()))
        assert not any(o.finished for o in on_a.values())

        replica_a.process.send_signal(signal.SIGTERM)

        on_b = {f"b-{run}-{i}": StreamOutcome() for i in range(STREAMS_ON_B)}
        tasks_b = [
            asyncio.create_task(stream_chat(sdk_b, model, conv, outcome))
            for conv, outcome in on_b.items()
        ]

        async def refused() -> bool:
            return not await asyncio.to_thread(accepts_connections, replica_a.port)

        await eventually(refused, within=5.0)
        running_when_refused = sum(not o.finished for o in on_a.values())
        late_call_error: BaseException | None = None
        try:
            await sdk_a.chat.completions.create(
                model=model, messages=[{"role": "user", "content": "too late"}]
            )
        except openai.APIError as exc:
            late_call_error = exc

        async with asyncio.timeout(30):
            await asyncio.gather(*tasks_a, *tasks_b, return_exceptions=True)
        exit_code = await asyncio.to_thread(stop_replica, replica_a, 35.0)

        project = uuid.UUID(tenant.project_id)
        rows_after_a = await cluster.fetch(USAGE_QUERY, project)
        # B meters its calls when it stops, too (its timed flush is off).
        b_exit_code = await asyncio.to_thread(stop_replica, cluster.replicas[1], 35.0)
        result = Drain(
            backend=name,
            on_a=on_a,
            on_b=on_b,
            running_when_refused=running_when_refused,
            late_call_error=late_call_error,
            exit_code=exit_code,
            output_a=replica_a.output(),
            rows_after_a=rows_after_a,
            b_exit_code=b_exit_code,
            rows=await cluster.fetch(USAGE_QUERY, project),
        )
        await sdk_a.close()
        await sdk_b.close()
        yield result


USAGE_QUERY = (
    "SELECT conversation_id, status, streamed, backend FROM usage_records "
    "WHERE project_id = $1 ORDER BY conversation_id"
)


def test_every_stream_started_on_a_finishes_with_done(drain: Drain) -> None:
    for conv, outcome in drain.on_a.items():
        assert outcome.finished, conv
        assert outcome.done, conv
        assert outcome.content.count('"content"') >= CHUNKS, conv


def test_a_stops_accepting_while_its_streams_still_run(drain: Drain) -> None:
    assert drain.running_when_refused > 0, "every stream ended before A stopped accepting"
    assert isinstance(drain.late_call_error, openai.APIConnectionError), drain.late_call_error


def test_a_flushes_its_usage_on_the_way_out(drain: Drain) -> None:
    # The timed flush is off, so these rows were written by A's shutdown.
    assert sorted(r["conversation_id"] for r in drain.rows_after_a) == sorted(drain.on_a)


def test_every_completed_call_is_metered_exactly_once(drain: Drain) -> None:
    assert drain.b_exit_code in (0, -signal.SIGTERM)
    conversations = [r["conversation_id"] for r in drain.rows]
    assert sorted(conversations) == sorted([*drain.on_a, *drain.on_b])
    for row in drain.rows:
        assert (row["status"], row["streamed"], row["backend"]) == (200, True, drain.backend)


def test_calls_on_b_during_the_drain_are_unaffected(drain: Drain) -> None:
    for conv, outcome in drain.on_b.items():
        assert outcome.finished, conv
        assert outcome.done, conv
        assert outcome.content.count('"content"') >= CHUNKS, conv


def test_a_shut_down_without_errors(drain: Drain) -> None:
    # uvicorn drains, then re-raises the SIGTERM it caught, so the process reports
    # "terminated by SIGTERM" (143 in a shell) as Unix tools expect; systemd and
    # Kubernetes count that as a clean stop.
    assert drain.exit_code == -signal.SIGTERM, drain.output_a
    assert "Traceback" not in drain.output_a, drain.output_a
