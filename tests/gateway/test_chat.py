"""Chat completions through the gateway with the official SDK, both modes."""

from __future__ import annotations

import asyncio

import httpx
import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam, ChatCompletionToolParam

from app.fakes.openai_upstream import FakeOpenAI
from app.fakes.serve import serve_asgi
from tests.support.gateway import GatewayEnv, unique
from tests.support.helpers import assert_error, bearer

MESSAGES: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Say hello"}]


async def test_register_becomes_healthy_and_routes(env: GatewayEnv) -> None:
    fake, url = await env.fake(models=["chat-a"])
    name = unique("ext")
    created = await env.register(name, url, healthy=False)
    assert created["health"]["status"] in ("unknown", "healthy")
    took = await env.wait_health(name, "healthy", within=10.0)
    print(f"healthy {took:.2f}s after registration")
    reply = await env.sdk().chat.completions.create(model="chat-a", messages=MESSAGES)
    assert fake.name in (reply.choices[0].message.content or "")
    assert reply.usage is not None
    assert reply.usage.total_tokens > 0


async def test_stream_relays_chunks_and_honours_include_usage(env: GatewayEnv) -> None:
    fake, url = await env.fake(models=["chat-s"], chunks=4)
    await env.register(unique("ext"), url)
    sdk = env.sdk()
    stream = await sdk.chat.completions.create(
        model="chat-s",
        messages=MESSAGES,
        stream=True,
    )
    chunks = [chunk async for chunk in stream]
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert fake.name in text
    assert all(c.usage is None for c in chunks), "usage chunk must be dropped when not asked"

    stream = await sdk.chat.completions.create(
        model="chat-s",
        messages=MESSAGES,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = [chunk async for chunk in stream]
    assert chunks[-1].choices == []
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.total_tokens > 0


async def test_raw_stream_is_sse_ending_with_done(env: GatewayEnv) -> None:
    _, url = await env.fake(models=["chat-raw"])
    await env.register(unique("ext"), url)
    async with env.http.stream(
        "POST",
        "/v1/chat/completions",
        json={"model": "chat-raw", "messages": MESSAGES, "stream": True},
        headers=bearer(env.api_key),
    ) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        body = b"".join([part async for part in response.aiter_bytes()])
    frames = [f for f in body.split(b"\n\n") if f]
    assert all(f.startswith(b"data: ") for f in frames)
    assert frames[-1] == b"data: [DONE]"


async def test_passthrough_fields_are_forwarded_and_routing_fields_consumed(
    env: GatewayEnv,
) -> None:
    fake, url = await env.fake(models=["chat-p"], api_key="sk-upstream-secret")
    name = unique("ext")
    await env.register(name, url, api_key="sk-upstream-secret")
    tools: list[ChatCompletionToolParam] = [
        {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    ]
    await env.sdk().chat.completions.create(
        model="chat-p",
        messages=MESSAGES,
        tools=tools,
        tool_choice="auto",
        response_format={"type": "json_object"},
        temperature=0.2,
        max_tokens=17,
        stop=["END"],
        n=1,
        seed=7,
        extra_body={"provider": name, "conversation_id": "conv-1", "extra": {"top_k": 5}},
    )
    (recorded,) = fake.requests_for("/chat/completions")
    sent = recorded.body
    for key, value in {
        "tool_choice": "auto",
        "response_format": {"type": "json_object"},
        "temperature": 0.2,
        "max_tokens": 17,
        "stop": ["END"],
        "n": 1,
        "seed": 7,
        "top_k": 5,
    }.items():
        assert sent[key] == value, key
    assert sent["tools"] == tools
    assert "provider" not in sent
    assert "conversation_id" not in sent
    assert "extra" not in sent
    assert recorded.headers["authorization"] == "Bearer sk-upstream-secret"
    assert env.api_key not in str(recorded.headers)


async def test_unknown_model_is_404_model_not_found(env: GatewayEnv) -> None:
    with pytest.raises(openai.NotFoundError) as info:
        await env.sdk().chat.completions.create(model="no-such-model", messages=MESSAGES)
    assert info.value.code == "model_not_found"
    assert "model 'no-such-model' not found" in str(info.value)


async def test_upstream_that_stops_turns_unhealthy_and_calls_get_500(env: GatewayEnv) -> None:
    fake, url = await env.fake(models=["chat-gone"])
    name = unique("ext")
    await env.register(name, url)
    fake.control.fail_status = 503
    await env.probe_all()
    health = (await env.backend(name))["health"]
    assert health["status"] == "unhealthy"
    assert "503" in health["reason"]
    response = await env.http.post(
        "/v1/chat/completions",
        json={"model": "chat-gone", "messages": MESSAGES},
        headers=bearer(env.api_key),
    )
    error = assert_error(response, 500)
    assert "chat-gone" in error["message"]


async def test_listing_404_backend_is_healthy_and_routed_by_static_list(env: GatewayEnv) -> None:
    fake, url = await env.fake(models=["hidden"])
    fake.control.listing_404 = True
    name = unique("ext")
    await env.register(name, url, models=["static-only"])
    detail = await env.backend(name)
    assert detail["advertised_models"] == ["static-only"]
    reply = await env.sdk().chat.completions.create(model="static-only", messages=MESSAGES)
    assert reply.choices[0].message.content


async def test_upstream_non_2xx_is_502_with_bounded_detail(env: GatewayEnv) -> None:
    fake, url = await env.fake(models=["chat-bad"])
    await env.register(unique("ext"), url)
    fake.control.fail_status = 400
    fake.control.fail_message = "x" * 10_000
    response = await env.http.post(
        "/v1/chat/completions",
        json={"model": "chat-bad", "messages": MESSAGES},
        headers=bearer(env.api_key),
    )
    error = assert_error(response, 502, "bad_gateway")
    assert error["message"].startswith("upstream 400: ")
    assert len(error["message"]) < 4096 + 100
    assert fake.stats.failures == 1  # a 4xx is the request's fault: not retried


async def test_retry_moves_a_failed_call_to_another_backend(env: GatewayEnv) -> None:
    bad, bad_url = await env.fake("bad", models=["chat-r"])
    good, good_url = await env.fake("good", models=["chat-r"])
    await env.register(unique("a"), bad_url)
    await env.register(unique("b"), good_url)
    bad.control.fail_status = 500
    for _ in range(4):
        reply = await env.sdk().chat.completions.create(model="chat-r", messages=MESSAGES)
        assert good.name in (reply.choices[0].message.content or "")
    assert bad.stats.failures >= 1


async def test_breaker_opens_after_three_failures_then_half_open_trial_closes_it(
    env: GatewayEnv,
) -> None:
    fake, url = await env.fake(models=["chat-cb"])
    name = unique("cb")
    await env.register(name, url)
    fake.control.fail_status = 500
    for _ in range(3):
        response = await env.http.post(
            "/v1/chat/completions",
            json={"model": "chat-cb", "messages": MESSAGES},
            headers=bearer(env.api_key),
        )
        assert_error(response, 502, "bad_gateway")
    assert (await env.backend(name))["breaker"]["state"] == "open"
    calls = fake.stats.failures
    response = await env.http.post(
        "/v1/chat/completions",
        json={"model": "chat-cb", "messages": MESSAGES},
        headers=bearer(env.api_key),
    )
    assert_error(response, 500)
    assert fake.stats.failures == calls, "an open breaker keeps calls away from the upstream"
    fake.control.fail_status = None
    await asyncio.sleep(env.settings.breaker_open_seconds + 0.05)
    assert (await env.backend(name))["breaker"]["state"] == "half_open"
    reply = await env.sdk().chat.completions.create(model="chat-cb", messages=MESSAGES)
    assert reply.choices[0].message.content
    assert (await env.backend(name))["breaker"]["state"] == "closed"


async def test_mid_stream_failure_ends_with_error_event_then_done(env: GatewayEnv) -> None:
    fake, url = await env.fake(models=["chat-drop"], chunks=6)
    await env.register(unique("ext"), url)
    fake.control.drop_stream_after = 2
    async with env.http.stream(
        "POST",
        "/v1/chat/completions",
        json={"model": "chat-drop", "messages": MESSAGES, "stream": True},
        headers=bearer(env.api_key),
    ) as response:
        assert response.status_code == 200
        body = b"".join([part async for part in response.aiter_bytes()])
    frames = [f for f in body.split(b"\n\n") if f]
    assert frames[-1] == b"data: [DONE]"
    assert frames[-2].startswith(b"event: error\ndata: ")
    assert b'"bad_gateway"' in frames[-2]
    assert sum(1 for f in frames if f.startswith(b"data: {")) >= 1

    stream = await env.sdk().chat.completions.create(
        model="chat-drop",
        messages=MESSAGES,
        stream=True,
    )
    received: list[object] = []

    async def consume() -> None:
        async for chunk in stream:
            received.append(chunk)

    with pytest.raises(openai.APIError):
        await consume()
    assert len(received) >= 1


async def test_a_hung_upstream_holds_only_its_own_requests(env: GatewayEnv) -> None:
    slow, slow_url = await env.fake("slow", models=["chat-hang"])
    _, fast_url = await env.fake("fast", models=["chat-fast"])
    await env.register(unique("slow"), slow_url)
    await env.register(unique("fast"), fast_url)
    slow.control.hang = True
    hung = asyncio.create_task(
        env.http.post(
            "/v1/chat/completions",
            json={"model": "chat-hang", "messages": MESSAGES},
            headers=bearer(env.api_key),
        )
    )
    await asyncio.sleep(0.1)
    replies = await asyncio.gather(
        *(
            env.sdk().chat.completions.create(model="chat-fast", messages=MESSAGES)
            for _ in range(10)
        )
    )
    assert len(replies) == 10
    assert not hung.done()
    hung.cancel()
    slow.release()
    with pytest.raises((asyncio.CancelledError, httpx.HTTPError)):
        await hung


@pytest.mark.parametrize(
    ("payload", "param"),
    [
        ({"messages": MESSAGES}, "model"),
        ({"model": "", "messages": MESSAGES}, "model"),
        ({"model": 3, "messages": MESSAGES}, "model"),
        ({"model": "m"}, "messages"),
        ({"model": "m", "messages": []}, "messages"),
        ({"model": "m", "messages": "hi"}, "messages"),
        ({"model": "m", "messages": MESSAGES, "stream": "yes"}, "stream"),
        ({"model": "m", "messages": MESSAGES, "extra": [1]}, "extra"),
    ],
)
async def test_bad_bodies_are_400_naming_the_field(
    env: GatewayEnv, payload: dict[str, object], param: str
) -> None:
    response = await env.http.post(
        "/v1/chat/completions", json=payload, headers=bearer(env.api_key)
    )
    assert assert_error(response, 400)["param"] == param


async def test_body_that_is_not_an_object_is_invalid_json(env: GatewayEnv) -> None:
    for raw in (b"", b"[1,2]", b"{not json"):
        response = await env.http.post(
            "/v1/chat/completions",
            content=raw,
            headers={**bearer(env.api_key), "content-type": "application/json"},
        )
        assert_error(response, 400, "invalid_json")


async def test_credentials_are_required(env: GatewayEnv) -> None:
    response = await env.http.post("/v1/chat/completions", json={"model": "m"})
    assert_error(response, 401)
    with pytest.raises(openai.AuthenticationError):
        await env.sdk(api_key="ak_wrong").models.list()


async def test_an_upstream_that_goes_away_turns_unhealthy_and_calls_get_500(
    env: GatewayEnv,
) -> None:
    fake = FakeOpenAI(unique("gone"), models=["chat-vanish"])
    name = unique("ext")
    async with serve_asgi(fake) as url:
        await env.register(name, url)
        assert (await env.sdk().chat.completions.create(model="chat-vanish", messages=MESSAGES)).id
    await env.probe_all()  # the server is closed now: connection refused
    health = (await env.backend(name))["health"]
    assert health["status"] == "unhealthy"
    assert health["checked_at"] is not None
    with pytest.raises(openai.InternalServerError) as info:
        await env.sdk().chat.completions.create(model="chat-vanish", messages=MESSAGES)
    assert info.value.status_code == 500
    assert info.value.code == "backend_unavailable"


async def test_a_user_access_token_works_for_its_project_and_runtime_tokens_are_refused(
    env: GatewayEnv,
) -> None:
    _, url = await env.fake(models=["chat-user"])
    await env.register(unique("ext"), url)
    response = await env.http.post(
        "/v1/chat/completions",
        json={"model": "chat-user", "messages": MESSAGES},
        headers={**env.user_headers, "X-Arona-Project": env.project_id},
    )
    assert response.status_code == 200, response.text
    unattributed = await env.http.post(
        "/v1/chat/completions",
        json={"model": "chat-user", "messages": MESSAGES},
        headers=env.user_headers,
    )
    assert_error(unattributed, 400, "project_required")
    token = await env.http.post(
        f"/api/projects/{env.project_id}/runtime-tokens", json={}, headers=env.user_headers
    )
    assert token.status_code == 201, token.text
    refused = await env.http.post(
        "/v1/chat/completions",
        json={"model": "chat-user", "messages": MESSAGES},
        headers=bearer(token.json()["token"]),
    )
    assert_error(refused, 403, "principal_not_allowed")
