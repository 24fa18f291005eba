"""``BatchingEngineServer`` over real HTTP: uvicorn on a loopback port, httpx clients.

The engines here are made slow on purpose (tens of milliseconds per step) so what a
test looks at (a request running, another waiting) holds long enough to be seen.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import httpx
import msgspec
import pytest
from prometheus_client.parser import text_string_to_metric_families

from app.fakes.batching_engine import BatchingEngine, EngineShape
from app.fakes.batching_server import BatchingEngineServer
from app.fakes.serve import serve_asgi

MODEL = "batching-model"


@contextlib.asynccontextmanager
async def _serve(shape: EngineShape, time_scale: float = 1.0) -> AsyncIterator[Served]:
    server = BatchingEngineServer(BatchingEngine(shape), MODEL, time_scale=time_scale)
    async with (
        serve_asgi(server, lifespan=True) as url,
        httpx.AsyncClient(base_url=url, timeout=10.0, trust_env=False) as client,
    ):
        yield Served(server, client)


class Served:
    def __init__(self, server: BatchingEngineServer, client: httpx.AsyncClient) -> None:
        self.server = server
        self.client = client

    @property
    def engine(self) -> BatchingEngine:
        return self.server.engine

    async def metrics(self) -> dict[str, float]:
        response = await self.client.get("/metrics")
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/plain")
        values: dict[str, float] = {}
        for family in text_string_to_metric_families(response.text):
            for sample in family.samples:
                assert sample.labels["model_name"] == MODEL
                values[sample.name] = sample.value
        return values


@pytest.fixture
async def fast() -> AsyncIterator[Served]:
    """Two slots, 10 ms steps, run 5x faster than wall time."""
    shape = EngineShape("fast", slots=2, kv_tokens=10_000, step_base=0.01, step_per_seq=0.0)
    async with _serve(shape, time_scale=5.0) as served:
        yield served


@pytest.fixture
async def slow() -> AsyncIterator[Served]:
    """One slot, 40 ms per step in real time: a second request has to wait."""
    shape = EngineShape("slow", slots=1, kv_tokens=10_000, step_base=0.04, step_per_seq=0.0)
    async with _serve(shape) as served:
        yield served


def _chat(words: int, max_tokens: int, *, stream: bool = True) -> dict[str, Any]:
    return {
        "model": MODEL,
        "messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": " ".join(["w"] * (words - 2))},
        ],
        "max_tokens": max_tokens,
        "stream": stream,
    }


def _events(raw: str) -> tuple[list[dict[str, Any]], bool]:
    events: list[dict[str, Any]] = []
    done = False
    for block in raw.split("\n\n"):
        if not block.startswith("data: "):
            continue
        data = block.removeprefix("data: ")
        if data == "[DONE]":
            done = True
        else:
            events.append(msgspec.json.decode(data))
    return events, done


async def _eventually(check: Callable[[], Awaitable[bool]], within: float = 5.0) -> None:
    deadline = time.monotonic() + within
    while not await check():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.01)


async def test_streamed_chat_produces_max_tokens_with_usage(fast: Served) -> None:
    async with fast.client.stream("POST", "/v1/chat/completions", json=_chat(12, 20)) as response:
        assert response.status_code == 200
        assert response.headers["content-type"] == "text/event-stream"
        raw = (await response.aread()).decode()

    events, done = _events(raw)
    assert done
    chunks = [e for e in events if e["choices"]]
    assert all(e["object"] == "chat.completion.chunk" and e["model"] == MODEL for e in events)
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
    assert text.split() == ["x"] * 20
    assert chunks[0]["choices"][0]["delta"]["content"] == "x "  # the first token alone
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert events[-1]["usage"] == {"prompt_tokens": 12, "completion_tokens": 20, "total_tokens": 32}
    [record] = fast.engine.records
    assert record.prompt_tokens == 12
    assert record.generated == 20
    assert record.first_token is not None
    assert record.finished is not None
    assert not record.aborted
    # 20 steps of 10 ms in engine seconds (the first with a small prefill on top).
    assert 0.19 <= record.finished - record.arrived < 0.5


async def test_whole_answer_and_model_listing(fast: Served) -> None:
    response = await fast.client.post("/v1/chat/completions", json=_chat(5, 7, stream=False))
    assert response.status_code == 200
    body = response.json()
    assert body["object"] == "chat.completion"
    assert body["choices"][0]["message"]["content"].split() == ["x"] * 7
    assert body["choices"][0]["finish_reason"] == "length"
    assert body["usage"]["completion_tokens"] == 7
    assert body["usage"]["prompt_tokens"] == 5

    listing = await fast.client.get("/v1/models")
    assert [m["id"] for m in listing.json()["data"]] == [MODEL]
    missing = await fast.client.get("/v1/embeddings")
    assert missing.status_code == 404


async def test_time_scale_runs_engine_seconds_faster_than_wall_time(fast: Served) -> None:
    started = time.monotonic()
    response = await fast.client.post("/v1/chat/completions", json=_chat(3, 50, stream=False))
    wall = time.monotonic() - started
    assert response.status_code == 200
    [record] = fast.engine.records
    assert record.finished is not None
    engine_seconds = record.finished - record.arrived
    assert engine_seconds >= 0.5  # 50 steps of 10 ms
    assert wall < engine_seconds  # at 5x, ~0.1 s of wall time


async def test_metrics_show_running_and_waiting_requests(slow: Served) -> None:
    before = await slow.metrics()
    assert before["vllm:num_requests_running"] == 0
    assert before["vllm:num_requests_waiting"] == 0

    async def stream_one() -> None:
        async with slow.client.stream(
            "POST", "/v1/chat/completions", json=_chat(10, 40)
        ) as response:
            await response.aread()

    first = asyncio.create_task(stream_one())
    await _eventually(lambda: _has(slow, running=1, waiting=0))
    second = asyncio.create_task(stream_one())
    await _eventually(lambda: _has(slow, running=1, waiting=1))

    during = await slow.metrics()
    assert during["vllm:num_requests_running"] == 1
    assert during["vllm:num_requests_waiting"] == 1
    assert 0 < during["vllm:kv_cache_usage_perc"] < 1
    assert during["vllm:request_success_total"] == 0
    assert slow.server.scrapes >= 3

    await asyncio.wait_for(asyncio.gather(first, second), timeout=10)
    after = await slow.metrics()
    assert after["vllm:num_requests_running"] == 0
    assert after["vllm:num_requests_waiting"] == 0
    assert after["vllm:request_success_total"] == 2
    waits = [r.queue_wait for r in slow.engine.records]
    assert waits[0] is not None
    assert waits[0] < 0.05
    assert waits[1] is not None
    assert waits[1] > 0.5  # behind 40 steps of 40 ms, less its head start


async def _has(served: Served, *, running: int, waiting: int) -> bool:
    metrics = await served.metrics()
    return (
        metrics["vllm:num_requests_running"] == running
        and metrics["vllm:num_requests_waiting"] == waiting
    )


async def test_a_client_that_goes_away_aborts_its_request(slow: Served) -> None:
    async with slow.client.stream("POST", "/v1/chat/completions", json=_chat(10, 500)) as response:
        lines = response.aiter_lines()
        async for line in lines:
            if line.startswith("data: "):
                break  # the first token came: leave mid-stream

    await _eventually(lambda: _has(slow, running=0, waiting=0))
    [record] = slow.engine.records
    assert record.aborted
    assert record.first_token is not None
    assert record.generated < 500
    assert slow.engine.stats.aborted == 1
    assert slow.engine.stats.finished == 0


async def test_a_queued_request_whose_client_leaves_never_runs(slow: Served) -> None:
    async def long_one() -> None:
        async with slow.client.stream(
            "POST", "/v1/chat/completions", json=_chat(10, 60)
        ) as response:
            await response.aread()

    running = asyncio.create_task(long_one())
    await _eventually(lambda: _has(slow, running=1, waiting=0))
    with pytest.raises(httpx.ReadTimeout):
        await slow.client.post("/v1/chat/completions", json=_chat(10, 5, stream=False), timeout=0.3)
    await _eventually(lambda: _has(slow, running=1, waiting=0))
    queued = slow.engine.records[1]
    assert queued.aborted
    assert queued.admitted is None
    assert queued.first_token is None
    await asyncio.wait_for(running, timeout=10)
    assert slow.engine.records[0].generated == 60
