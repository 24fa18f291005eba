"""Upstream failures as clients see them, on ``/v1`` (read by the official SDK) and on
the runtime API: a 502 that carries the upstream's status, an upstream 429's
``Retry-After``, ``x-should-retry: false`` for client errors (so the SDKs do not
repeat a request that cannot succeed), and messages in plain words."""

from __future__ import annotations

import contextlib
import gc
import re
import types
from collections.abc import AsyncIterator
from typing import Any

import httpx
import openai
import pytest
import structlog.testing
from openai.types.chat import ChatCompletionMessageParam

from app.fakes.openai_upstream import FakeOpenAI
from app.fakes.serve import serve_asgi
from app.lib.settings import Settings
from tests.support.gateway import GatewayEnv, open_env, unique
from tests.support.helpers import bearer
from tests.support.runtime import RuntimeEnv, parse_sse, runtime_env
from tests.support.settings import AppFactory, with_settings

MESSAGES: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Say hello"}]
LIBRARY_WORDS = re.compile(
    r"[A-Z][a-z]+(?:[A-Z][a-z]+)*(?:Error|Exception)|aiohttp|ClientConnector"
)


def assert_plain(message: str) -> None:
    """No exception class, library name or repr in a client-visible message."""
    assert not LIBRARY_WORDS.search(message), message
    assert "<" not in message, message


def retrying_sdk(env: GatewayEnv) -> openai.AsyncOpenAI:
    """The SDK as applications use it: it retries what it believes may succeed."""
    return openai.AsyncOpenAI(base_url=f"{env.url}/v1", api_key=env.api_key, max_retries=2)


def chats(fake: FakeOpenAI) -> int:
    return len(fake.requests_for("/chat/completions"))


def error_of(raised: openai.APIStatusError) -> dict[str, Any]:
    body = raised.body
    assert isinstance(body, dict), body
    return body


# -- the status, and whether to retry ---------------------------------------------------


async def test_an_upstream_400_is_a_502_the_sdk_does_not_retry(env: GatewayEnv) -> None:
    fake, url = await env.fake(models=["chat-400"])
    await env.register(unique("ext"), url)
    fake.control.fail_status = 400
    fake.control.fail_message = "'temperature' must be at most 2"
    sdk = retrying_sdk(env)
    for stream in (False, True):
        before = chats(fake)
        with pytest.raises(openai.APIStatusError) as info:
            await sdk.chat.completions.create(model="chat-400", messages=MESSAGES, stream=stream)
        assert info.value.status_code == 502
        assert info.value.response.headers["x-should-retry"] == "false"
        error = error_of(info.value)
        assert error["code"] == "bad_gateway"
        assert error["upstream_status"] == 400
        assert "'temperature' must be at most 2" in error["message"]
        assert chats(fake) == before + 1  # one request: neither Arona nor the SDK repeated it
    await sdk.close()


async def test_an_upstream_503_carries_its_status_and_the_sdk_may_retry(env: GatewayEnv) -> None:
    fake, url = await env.fake(models=["chat-503"])
    await env.register(unique("ext"), url)
    fake.control.fail_status = 503
    sdk = retrying_sdk(env)
    with pytest.raises(openai.APIStatusError) as info:
        await sdk.chat.completions.create(model="chat-503", messages=MESSAGES)
    await sdk.close()
    assert info.value.status_code == 502
    assert "x-should-retry" not in info.value.response.headers
    assert "retry-after" not in info.value.response.headers
    assert error_of(info.value)["upstream_status"] == 503
    assert chats(fake) == 3  # the SDK's own two retries, as for any 502


async def test_embeddings_carry_the_status_and_the_retry_hint(env: GatewayEnv) -> None:
    fake, url = await env.fake(models=["embed-400"])
    await env.register(unique("ext"), url)
    fake.control.fail_status = 422
    sdk = retrying_sdk(env)
    with pytest.raises(openai.APIStatusError) as info:
        await sdk.embeddings.create(model="embed-400", input="hello")
    await sdk.close()
    assert info.value.status_code == 502
    assert info.value.response.headers["x-should-retry"] == "false"
    assert error_of(info.value)["upstream_status"] == 422
    assert len(fake.requests_for("/embeddings")) == 1


async def test_no_upstream_status_when_nothing_answered(env: GatewayEnv) -> None:
    fake = FakeOpenAI(unique("gone"), models=["chat-closed"])
    async with serve_asgi(fake) as url:
        await env.register(unique("ext"), url)
    # The server is closed now; no health round ran, so the backend is still routed.
    for stream in (False, True):
        with pytest.raises(openai.APIStatusError) as info:
            await env.sdk().chat.completions.create(
                model="chat-closed", messages=MESSAGES, stream=stream
            )
        assert info.value.status_code == 502
        error = error_of(info.value)
        assert "upstream_status" not in error
        assert error["message"] == "could not connect to the upstream: connection refused"
        assert_plain(error["message"])
        assert "x-should-retry" not in info.value.response.headers
    await env.probe_all()  # now it is known to be down
    with pytest.raises(openai.InternalServerError) as down:
        await env.sdk().chat.completions.create(model="chat-closed", messages=MESSAGES)
    assert down.value.status_code == 500
    assert "all backends for model 'chat-closed' are unhealthy" in error_of(down.value)["message"]


# -- Retry-After ------------------------------------------------------------------------


async def test_an_upstream_429s_retry_after_reaches_the_client(env: GatewayEnv) -> None:
    chat_fake, chat_url = await env.fake("chat", models=["chat-429"])
    embed_fake, embed_url = await env.fake("embed", models=["embed-429"])
    await env.register(unique("ext"), chat_url)
    await env.register(unique("ext"), embed_url)
    for fake in (chat_fake, embed_fake):
        fake.control.fail_status, fake.control.retry_after = 429, "7"
    sdk = env.sdk()
    raised: list[openai.APIStatusError] = []
    for stream in (False, True):
        with pytest.raises(openai.APIStatusError) as info:
            await sdk.chat.completions.create(model="chat-429", messages=MESSAGES, stream=stream)
        raised.append(info.value)
    with pytest.raises(openai.APIStatusError) as embedded:
        await sdk.embeddings.create(model="embed-429", input="hello")
    raised.append(embedded.value)
    for error in raised:
        assert error.status_code == 502
        assert error.response.headers["retry-after"] == "7"
        assert "x-should-retry" not in error.response.headers
        assert error_of(error)["upstream_status"] == 429


async def test_only_the_final_answers_retry_after_is_forwarded(env: GatewayEnv) -> None:
    """A 429 is retried on another backend first; the client gets the headers of the
    answer that ended the call. A backend that failed is passed over while it cools
    down, which orders the attempts."""
    throttled, throttled_url = await env.fake("throttled", models=["chat-ra"])
    other, other_url = await env.fake("other", models=["chat-ra"])
    throttled_name, other_name = unique("t"), unique("o")
    await env.register(throttled_name, throttled_url)
    await env.register(other_name, other_url)
    throttled.control.fail_status, throttled.control.retry_after = 429, "7"

    async def call(provider: str | None = None) -> httpx.Response:
        body: dict[str, Any] = {"model": "chat-ra", "messages": MESSAGES}
        if provider:
            body["provider"] = provider
        return await env.http.post("/v1/chat/completions", json=body, headers=bearer(env.api_key))

    # The other backend fails once (it cools), then recovers.
    other.control.fail_status = 503
    first = await call(other_name)
    assert first.status_code == 502
    assert first.json()["error"]["upstream_status"] == 503
    assert "retry-after" not in first.headers
    other.control.fail_status = None
    # The throttled one goes first, answers 429, the other one serves: no Retry-After.
    served = await call()
    assert served.status_code == 200
    assert "retry-after" not in served.headers
    assert throttled.stats.failures == 1
    # Now the throttled one cools; the other goes first and fails, the 429 ends the call.
    other.control.fail_status = 503
    last_429 = await call()
    assert last_429.status_code == 502
    assert last_429.json()["error"]["upstream_status"] == 429
    assert last_429.headers["retry-after"] == "7"
    assert (throttled.stats.failures, other.stats.failures) == (2, 2)


# -- streams that fail after they started ---------------------------------------------


async def test_a_stream_cut_midway_ends_with_a_plain_error_carrying_the_status(
    env: GatewayEnv,
) -> None:
    fake, url = await env.fake(models=["chat-cut"], chunks=6)
    await env.register(unique("ext"), url)
    fake.control.drop_stream_after = 2
    async with env.http.stream(
        "POST",
        "/v1/chat/completions",
        json={"model": "chat-cut", "messages": MESSAGES, "stream": True},
        headers=bearer(env.api_key),
    ) as response:
        assert response.status_code == 200
        raw = b"".join([part async for part in response.aiter_bytes()])
    events, done = parse_sse(raw)
    assert done
    [error] = [e["error"] for e in events if e.get("event") == "error"]
    assert error["code"] == "bad_gateway"
    assert error["upstream_status"] == 200  # it had answered 200, then broke off
    assert error["message"] == (
        "upstream stream interrupted: the upstream closed the stream before it ended"
    )
    assert_plain(error["message"])

    stream = await env.sdk().chat.completions.create(
        model="chat-cut", messages=MESSAGES, stream=True
    )
    with pytest.raises(openai.APIError) as info:
        async for _ in stream:
            pass
    assert_plain(info.value.message)


@pytest.fixture
async def slow_env(gateway_settings: Settings, make_app: AppFactory) -> AsyncIterator[GatewayEnv]:
    settings = with_settings(gateway_settings, upstream_read_timeout_seconds=0.5)
    async with contextlib.AsyncExitStack() as stack:
        yield await open_env(settings, make_app, stack)


async def test_a_read_timeout_says_how_long_arona_waited(slow_env: GatewayEnv) -> None:
    fake, url = await slow_env.fake(models=["chat-hung"])
    await slow_env.register(unique("ext"), url)
    fake.control.hang = True
    try:
        for stream in (False, True):
            with pytest.raises(openai.APIStatusError) as info:
                await slow_env.sdk().chat.completions.create(
                    model="chat-hung", messages=MESSAGES, stream=stream
                )
            error = error_of(info.value)
            assert info.value.status_code == 502
            assert error["message"] == "the upstream did not answer within 0.5s"
            assert "upstream_status" not in error
    finally:
        fake.release()


# -- the runtime API --------------------------------------------------------------------


@pytest.fixture
async def rt(env: GatewayEnv) -> AsyncIterator[RuntimeEnv]:
    runtime = await runtime_env(env)
    yield runtime
    await runtime.cleanup()


async def test_the_runtime_chat_carries_the_same(rt: RuntimeEnv) -> None:
    [(_, fake)] = await rt.pool("rt-errors", [[]])
    profile = await rt.profile("rt-errors")

    fake.control.fail_status = 400
    refused = await rt.chat(await rt.conversation(modelProfileId=profile))
    assert refused.status == 502
    assert refused.body["error"]["upstream_status"] == 400
    assert refused.headers["x-should-retry"] == "false"
    assert len(fake.requests_for("/chat/completions")) == 1

    fake.control.fail_status, fake.control.retry_after = 429, "11"
    throttled = await rt.chat(await rt.conversation(modelProfileId=profile), stream=False)
    assert throttled.status == 502
    assert throttled.body["error"]["upstream_status"] == 429
    assert throttled.headers["retry-after"] == "11"
    assert "x-should-retry" not in throttled.headers

    fake.control.fail_status, fake.control.retry_after = None, None
    fake.control.drop_stream_after = 2
    cut = await rt.chat(await rt.conversation(modelProfileId=profile))
    assert cut.status == 200
    assert cut.done
    [error] = [e["error"] for e in cut.errors]
    assert error["upstream_status"] == 200
    assert "the upstream closed the stream before it ended" in error["message"]
    assert_plain(error["message"])


async def test_a_flood_of_failures_logs_one_line_with_the_count_held_back(
    env: GatewayEnv,
) -> None:
    """A failing upstream makes every call a 502; the log says so once per interval
    with how many were not logged, not once per request (the metrics count them all),
    and the error shape the client reads is unchanged."""
    fake, url = await env.fake(models=["flood-model"])
    await env.register(unique("flood"), url)
    fake.control.fail_status = 500
    body = {"model": "flood-model", "messages": [{"role": "user", "content": "hi"}]}
    headers = {"Authorization": f"Bearer {env.api_key}"}
    statuses = []
    with structlog.testing.capture_logs() as logged:
        for _ in range(6):
            response = await env.http.post("/v1/chat/completions", json=body, headers=headers)
            # 502 while the upstream is tried, 500 "all backends unhealthy" once the
            # breaker opens: both are failures of the same route.
            statuses.append(response.status_code)
            assert response.headers["content-type"] == "application/json"
            assert response.headers["x-request-id"]
            assert set(response.json()["error"]) >= {"message", "type", "code", "param"}
    assert statuses[0] == 502, statuses
    assert set(statuses) <= {500, 502}, statuses
    lines = [
        event
        for event in logged
        if event["event"] == "request failed" and event["route"] == "/v1/chat/completions"
    ]
    # One line for each status the route failed with, the first of each.
    assert sorted(line["status"] for line in lines) == sorted(set(statuses)), lines
    assert all(line["similar_not_logged"] == 0 for line in lines)
    metrics = (await env.http.get("/metrics")).text
    counted = sum(
        float(value)
        for value in re.findall(
            r'arona_http_requests_total\{method="POST",route="/v1/chat/completions",'
            r'status="50[02]"\} (\S+)',
            metrics,
        )
    )
    assert counted >= 6


async def test_a_failing_upstream_leaves_no_reference_cycle_in_the_gateway(
    env: GatewayEnv,
) -> None:
    # Cycles on the error path feed the cyclic collector, whose pauses stall every
    # stream in flight; the gateway's own objects (app, Litestar, aiohttp) must be
    # freed by reference counting. The test's httpx client makes cycles of its own,
    # so only the server side is looked at.
    fake, url = await env.fake(models=["cycle-model"])
    name = unique("cycle")
    await env.register(name, url)
    fake.control.fail_status = 500
    body = {"model": "cycle-model", "messages": [{"role": "user", "content": "hi"}]}
    headers = {"Authorization": f"Bearer {env.api_key}"}
    state = env.resources.backend_registry.get(name)
    assert state is not None

    async def fail(stream: bool) -> None:
        state.breaker.record_success()
        env.resources.routing.router.clear_cooldown(state)
        response = await env.http.post(
            "/v1/chat/completions", json={**body, "stream": stream}, headers=headers
        )
        assert response.status_code == 502

    for stream in (False, True):
        await fail(stream)  # what lives on (connections, caches) exists now
    gc.collect()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        for _ in range(20):
            for stream in (False, True):
                await fail(stream)
        gc.collect()
        ours = [o for o in gc.garbage if _server_side(o)]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()
    assert ours == []


REQUEST_PATH = (
    "app/routing/",
    "app/domain/calls/",
    "app/domain/gateway/",
    "app/server/",
    "litestar/",
    "aiohttp/",
)
"""Where a call's objects come from (background tasks of the app, which may fail on
their own while the suite runs, are not the error path of a call)."""


def _server_side(thing: object) -> bool:
    if isinstance(thing, types.FrameType):
        path = thing.f_code.co_filename
        return any(f"/{part}" in path for part in REQUEST_PATH)
    module = (type(thing).__module__ or "").replace(".", "/") + "/"
    return any(module.startswith(part) for part in REQUEST_PATH)
