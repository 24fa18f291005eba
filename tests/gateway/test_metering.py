"""Every request writes exactly one usage record with the right numbers."""

from __future__ import annotations

import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from tests.support.api import eventually
from tests.support.gateway import GatewayEnv, unique

MESSAGES: list[ChatCompletionMessageParam] = [{"role": "user", "content": "count me"}]


async def test_usage_rows_match_requests_exactly(env: GatewayEnv) -> None:
    fake, url = await env.fake(models=["meter-m"])
    backend = unique("ext")
    await env.register(backend, url)
    sdk = env.sdk()
    expected_tokens = 0
    for _ in range(3):
        reply = await sdk.chat.completions.create(model="meter-m", messages=MESSAGES)
        assert reply.usage is not None
        expected_tokens += reply.usage.total_tokens
    for _ in range(2):
        stream = await sdk.chat.completions.create(
            model="meter-m",
            messages=MESSAGES,
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = [c async for c in stream]
        assert chunks[-1].usage is not None
        expected_tokens += chunks[-1].usage.total_tokens
    # A stream whose client did not ask for usage is still metered with real numbers.
    stream = await sdk.chat.completions.create(
        model="meter-m",
        messages=MESSAGES,
        stream=True,
    )
    [c async for c in stream]
    embedded = await sdk.embeddings.create(model="meter-m", input=["a", "b"])
    with pytest.raises(openai.NotFoundError):
        await sdk.chat.completions.create(model="nope", messages=MESSAGES)

    rows = await env.usage_rows()
    assert len(rows) == 8
    ok = [r for r in rows if r.status == 200]
    assert len(ok) == 7
    assert all(r.backend == backend and r.model_served == "meter-m" for r in ok)
    assert all(not r.estimated for r in ok)
    chat_streams = [r for r in ok if r.streamed]
    assert len(chat_streams) == 3
    assert all(r.ttft_ms is not None and r.ttft_ms >= 0 for r in chat_streams)
    assert (
        sum(r.total_tokens for r in ok if r.endpoint == "chat" and r.streamed is False)
        + sum(r.total_tokens for r in chat_streams[:2])
        == expected_tokens
    )
    assert chat_streams[2].total_tokens > 0
    (embedding_row,) = [r for r in ok if r.endpoint == "embeddings"]
    assert embedding_row.prompt_tokens == embedded.usage.prompt_tokens
    (missing,) = [r for r in rows if r.status != 200]
    assert missing.status == 404
    assert missing.error_code == "model_not_found"
    assert missing.backend is None
    assert missing.total_tokens == 0
    assert all(r.api_key_id is not None for r in rows)
    assert fake.stats.chats + fake.stats.streams >= 6


async def test_usage_is_estimated_when_the_upstream_reports_none(env: GatewayEnv) -> None:
    fake, url = await env.fake(models=["meter-est"])
    fake.control.report_usage = False
    await env.register(unique("ext"), url)
    sdk = env.sdk()
    await sdk.chat.completions.create(model="meter-est", messages=MESSAGES)
    stream = await sdk.chat.completions.create(
        model="meter-est",
        messages=MESSAGES,
        stream=True,
    )
    [c async for c in stream]
    rows = [r for r in await env.usage_rows() if r.model_requested == "meter-est"]
    assert len(rows) == 2
    assert all(r.estimated and r.prompt_tokens > 0 and r.completion_tokens > 0 for r in rows)


async def test_a_stream_that_fails_before_producing_anything_is_recorded_with_zero_tokens(
    env: GatewayEnv,
) -> None:
    fake, url = await env.fake(models=["meter-drop"])
    await env.register(unique("ext"), url)
    fake.control.drop_stream_after = 0
    async with env.http.stream(
        "POST",
        "/v1/chat/completions",
        json={"model": "meter-drop", "messages": MESSAGES, "stream": True},
        headers={"Authorization": f"Bearer {env.api_key}"},
    ) as response:
        body = b"".join([p async for p in response.aiter_bytes()])
    # Nothing was relayed yet: the client gets the failure as a status, not a 200.
    assert response.status_code == 502
    assert b'"bad_gateway"' in body
    rows = [r for r in await env.usage_rows() if r.model_requested == "meter-drop"]
    assert len(rows) == 1
    assert rows[0].total_tokens == 0
    assert rows[0].status == 502
    assert rows[0].error_code == "bad_gateway"


async def test_a_client_leaving_mid_stream_is_metered_and_frees_the_upstream(
    env: GatewayEnv,
) -> None:
    fake, url = await env.fake(models=["meter-leave"], chunks=50)
    fake.control.chunk_delay_seconds = 0.05
    name = unique("ext")
    await env.register(name, url)
    async with env.http.stream(
        "POST",
        "/v1/chat/completions",
        json={"model": "meter-leave", "messages": MESSAGES, "stream": True},
        headers={"Authorization": f"Bearer {env.api_key}"},
    ) as response:
        async for _ in response.aiter_bytes():
            break  # the client goes away after the first bytes

    async def settled() -> bool:
        state = env.resources.backend_registry.get(name)
        return state is not None and state.in_flight == 0 and fake.stats.in_flight == 0

    await eventually(settled, within=5)
    rows = [r for r in await env.usage_rows() if r.model_requested == "meter-leave"]
    assert len(rows) == 1
    assert rows[0].status == 499
    assert rows[0].error_code == "client_closed"
    assert rows[0].backend == name
    assert fake.stats.completed_streams == 0
    state = env.resources.backend_registry.get(name)
    assert state is not None
    assert state.breaker.consecutive_failures == 0
