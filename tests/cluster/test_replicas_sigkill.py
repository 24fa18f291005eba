"""SIGKILL of one replica under load: the others keep serving, and the usage of the
killed replica's completed calls is measured against the database.

Each replica gets its own API key, so ``usage_records.api_key_id`` tells which
replica served a call, and every call its own ``conversation_id``, so each completed
call (a 200 answer read whole, or a stream read through ``[DONE]``) is looked up one
by one. Two clusters, one per way of metering:

- without the write-ahead stream (``ARONA_USAGE_WAL=false``): the killed replica's
  in-memory buffer (up to one flush interval, 1 s) is lost; the figure is printed;
- with it (the default with Redis): nothing completed is lost. The killed replica
  may leave a few more rows than calls its clients saw complete (calls recorded
  before their answer, whose answer the kill cut off); never fewer.
"""

from __future__ import annotations

import asyncio
import itertools
import signal
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from app.fakes.openai_upstream import FakeOpenAI
from app.fakes.serve import serve_asgi
from tests.support.cluster import (
    Cluster,
    create_api_key,
    eventually,
    new_tenant,
    register_backend,
    running_cluster,
    unique,
    wait_healthy_everywhere,
)

pytestmark = pytest.mark.cluster

FLUSH_SECONDS = "1"
"""The production default: the window the in-memory buffer can lose."""
WORKERS_PER_REPLICA = 4
SERVED_BY_VICTIM_BEFORE_KILL = 120
SERVED_BY_EACH_SURVIVOR_AFTER_KILL = 60
STREAM_CHUNKS = 8
STREAM_CHUNK_DELAY_SECONDS = 0.01
ROWS_WITHIN_SECONDS = 45.0
"""Taking over a dead consumer's entries waits 5 s of idleness, then a drain."""


@dataclass
class Traffic:
    """What the clients of one replica saw."""

    completed: set[str] = field(default_factory=set)
    """Conversation ids of calls answered 200 and read to the end."""
    failed: set[str] = field(default_factory=set)
    completed_after_kill: int = 0

    @property
    def sent(self) -> set[str]:
        return self.completed | self.failed


@dataclass
class KillRun:
    traffic: list[Traffic]
    victim_exit: int | None
    key_ids: list[str]
    victim_rate: float
    """Calls per second the killed replica completed before the kill."""
    killed_at: float
    """``time.monotonic()`` at the kill."""


async def one_call(sdk: openai.AsyncOpenAI, model: str, conversation: str, stream: bool) -> None:
    """Returns once the answer was read whole; raises otherwise."""
    messages: list[ChatCompletionMessageParam] = [
        {"role": "user", "content": f"hello {conversation}"}
    ]
    extra = {"conversation_id": conversation}
    if not stream:
        reply = await sdk.chat.completions.create(model=model, messages=messages, extra_body=extra)
        assert reply.choices[0].message.content
        return
    done = False
    async with sdk.chat.completions.with_streaming_response.create(
        model=model, messages=messages, stream=True, extra_body=extra
    ) as response:
        assert response.status_code == 200
        async for line in response.iter_lines():
            if line == "data: [DONE]":
                done = True
    assert done, "the stream ended without [DONE]"


async def drive(
    sdk: openai.AsyncOpenAI,
    model: str,
    name: str,
    traffic: Traffic,
    stop: asyncio.Event,
    killed: asyncio.Event,
    worker: int,
) -> None:
    for n in itertools.count():
        if stop.is_set():
            return
        conversation = f"{name}-{worker}-{n}-{uuid.uuid4().hex[:6]}"
        after_kill = killed.is_set()
        try:
            await one_call(sdk, model, conversation, stream=n % 2 == 1)
        except Exception:
            traffic.failed.add(conversation)
            if killed.is_set():
                return  # this replica is the one that died: nothing more to send it
            raise
        traffic.completed.add(conversation)
        if after_kill:
            traffic.completed_after_kill += 1


async def kill_under_load(cluster: Cluster, tmp_model: str) -> KillRun:
    tenant = await new_tenant(cluster.a)
    keys = [(tenant.api_key, tenant.api_key_id)]
    for client in (cluster.b, cluster.c):
        key = await create_api_key(client, tenant.project_id, tenant.user_headers)
        keys.append((key["key"], key["id"]))
    sdks = [cluster.sdk(i, key) for i, (key, _) in enumerate(keys)]
    traffic = [Traffic() for _ in cluster.replicas]
    stop, killed = asyncio.Event(), asyncio.Event()
    workers = [
        asyncio.create_task(drive(sdks[i], tmp_model, "abc"[i], traffic[i], stop, killed, worker))
        for i in range(len(cluster.replicas))
        for worker in range(WORKERS_PER_REPLICA)
    ]
    victim = cluster.replicas[0]
    try:

        def count(
            index: int, wanted: int, after_kill: bool = False
        ) -> Callable[[], Awaitable[bool]]:
            async def enough() -> bool:
                if any(task.done() and task.exception() for task in workers):
                    raise AssertionError("a client failed on a live replica")
                seen = traffic[index]
                return (seen.completed_after_kill if after_kill else len(seen.completed)) >= wanted

            return enough

        loaded = await eventually(count(0, SERVED_BY_VICTIM_BEFORE_KILL), within=120)
        victim_rate = len(traffic[0].completed) / loaded
        killed.set()
        killed_at = time.monotonic()
        victim.process.kill()  # SIGKILL: no drain, no shutdown flush
        for index in (1, 2):
            await eventually(count(index, SERVED_BY_EACH_SURVIVOR_AFTER_KILL, True), within=120)
    finally:
        stop.set()
        results = await asyncio.gather(*workers, return_exceptions=True)
        for sdk in sdks:
            await sdk.close()
    errors = [r for r in results if isinstance(r, BaseException)]
    assert not errors, f"calls failed on a surviving replica: {errors[:3]}"
    victim_exit = await asyncio.to_thread(victim.process.wait, 10)
    return KillRun(traffic, victim_exit, [key_id for _, key_id in keys], victim_rate, killed_at)


async def rows_by_key(cluster: Cluster, key_id: str) -> set[str]:
    rows = await cluster.fetch(
        "SELECT conversation_id, status FROM usage_records WHERE api_key_id = $1",
        uuid.UUID(key_id),
    )
    assert all(row["status"] == 200 for row in rows), [r["status"] for r in rows]
    conversations = [row["conversation_id"] for row in rows]
    assert len(conversations) == len(set(conversations)), "a call was metered twice"
    return set(conversations)


def report(label: str, run: KillRun, rows: list[set[str]]) -> None:
    victim_lost = len(run.traffic[0].completed - rows[0])
    print(
        f"[sigkill {label}] killed replica served {run.victim_rate:.0f} calls/s; lost "
        f"{victim_lost} completed calls = {victim_lost / run.victim_rate:.2f} s of its traffic"
    )
    for name, seen, stored in zip("abc", run.traffic, rows, strict=True):
        lost = seen.completed - stored
        extra = stored - seen.completed
        print(
            f"[sigkill {label}] replica {name}: completed {len(seen.completed)}, "
            f"failed {len(seen.failed)}, rows {len(stored)}, lost {len(lost)}, "
            f"rows without a completed answer {len(extra)}"
        )


async def settle_survivors(cluster: Cluster, run: KillRun) -> list[set[str]]:
    """Waits until both survivors metered exactly what their clients saw complete."""
    for index in (1, 2):

        async def complete(i: int = index) -> bool:
            return await rows_by_key(cluster, run.key_ids[i]) == run.traffic[i].completed

        await eventually(complete, within=ROWS_WITHIN_SECONDS)
    return [await rows_by_key(cluster, key_id) for key_id in run.key_ids]


@pytest.fixture
async def upstream_model() -> AsyncIterator[tuple[FakeOpenAI, str]]:
    fake = FakeOpenAI(unique("up"), models=[unique("model")], chunks=STREAM_CHUNKS)
    fake.control.chunk_delay_seconds = STREAM_CHUNK_DELAY_SECONDS
    async with serve_asgi(fake) as url:
        yield fake, url


async def start_backend(cluster: Cluster, url: str) -> None:
    name = unique("backend")
    await register_backend(cluster.a, name, url)
    await wait_healthy_everywhere(cluster, name)


async def test_without_the_stream_a_killed_replica_loses_its_buffer(
    tmp_path: Path, upstream_model: tuple[FakeOpenAI, str]
) -> None:
    fake, url = upstream_model
    env = {"ARONA_USAGE_WAL": "false", "ARONA_USAGE_FLUSH_SECONDS": FLUSH_SECONDS}
    async with running_cluster(tmp_path, extra_env=env) as cluster:
        await start_backend(cluster, url)
        run = await kill_under_load(cluster, fake.control.models[0])
        assert run.victim_exit == -signal.SIGKILL
        rows = await settle_survivors(cluster, run)
        # Whatever the killed replica had flushed before it died, and nothing else.
        await asyncio.sleep(2 * float(FLUSH_SECONDS))
        rows[0] = await rows_by_key(cluster, run.key_ids[0])
        report("memory buffer", run, rows)
        assert rows[0] <= run.traffic[0].sent


async def test_with_the_stream_a_killed_replica_loses_nothing(
    tmp_path: Path, upstream_model: tuple[FakeOpenAI, str]
) -> None:
    fake, url = upstream_model
    env = {"ARONA_USAGE_FLUSH_SECONDS": FLUSH_SECONDS}
    async with running_cluster(tmp_path, extra_env=env) as cluster:
        await start_backend(cluster, url)
        run = await kill_under_load(cluster, fake.control.models[0])
        assert run.victim_exit == -signal.SIGKILL
        victim = run.traffic[0]

        async def all_metered() -> bool:
            return victim.completed <= await rows_by_key(cluster, run.key_ids[0])

        # The survivors write what the dead replica left in the stream, pending on
        # it (taken over after 5 s) or never read.
        await eventually(all_metered, within=ROWS_WITHIN_SECONDS)
        took = time.monotonic() - run.killed_at
        rows = await settle_survivors(cluster, run)
        rows[0] = await rows_by_key(cluster, run.key_ids[0])
        report("write-ahead stream", run, rows)
        print(
            f"[sigkill write-ahead stream] the killed replica's rows were all in the "
            f"database at most {took:.1f} s after the kill (the survivors' load included)"
        )
        assert victim.completed <= rows[0]
        # Extra rows can only be calls the kill cut off after they were recorded.
        assert rows[0] - victim.completed <= victim.failed
