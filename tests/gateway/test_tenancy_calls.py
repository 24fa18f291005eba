"""What project owners control, seen from the calls: custom LLMs (`custom:<name>`),
BYO override keys and quotas, through the official SDK on `/v1` and the runtime chat."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from typing import Any

import openai
import pytest

from app.db.models.usage import UsageRecord
from app.lib.settings import Settings
from tests.support.gateway import ADMIN, GatewayEnv, unique
from tests.support.runtime import RuntimeEnv, runtime_env
from tests.support.settings import with_settings


@pytest.fixture(scope="module")
def gateway_settings(gateway_settings: Settings) -> Settings:
    # The fakes listen on loopback, which the SSRF guard refuses by default.
    return with_settings(gateway_settings, custom_llm_allow_private=True)


@pytest.fixture
async def rt(env: GatewayEnv) -> AsyncIterator[RuntimeEnv]:
    runtime = await runtime_env(env)
    yield runtime
    await runtime.cleanup()


async def post(env: GatewayEnv, path: str, payload: dict[str, Any]) -> dict[str, Any]:
    response = await env.http.post(
        f"/api/projects/{env.project_id}/{path}", json=payload, headers=env.user_headers
    )
    assert response.status_code == 201, response.text
    body: dict[str, Any] = response.json()
    return body


async def secret(env: GatewayEnv, value: str) -> str:
    return str((await post(env, "secrets", {"name": unique("s"), "value": value}))["id"])


async def custom_llm(env: GatewayEnv, url: str, **fields: Any) -> str:
    name = unique("mine")
    payload = {
        "template": "custom",
        "name": name,
        "baseUrl": f"{url}/v1",
        "model": "their-model",
        "authScheme": "api-key",
        "provider": "acme",
        "maxInputTokens": 8000,
        "maxOutputTokens": 1000,
        **fields,
    }
    await post(env, "custom-llms", payload)
    return f"custom:{name}"


async def set_quota(env: GatewayEnv, **limits: int | None) -> None:
    response = await env.http.put(
        f"/api/admin/projects/{env.project_id}/quota",
        json={"perMinute": None, "perDay": None, "perMonth": None, **limits},
        headers=ADMIN,
    )
    assert response.status_code == 200, response.text


def received_key(fake: Any) -> str | None:
    headers = fake.requests_for("/chat/completions")[-1].headers
    value = headers.get("api-key") or headers.get("authorization")
    return str(value) if value is not None else None


async def rows(env: GatewayEnv) -> list[UsageRecord]:
    return await env.usage_rows()


# ----------------------------------------------------------------------- custom LLMs


async def test_a_custom_llm_is_served_alone_with_the_projects_secret(env: GatewayEnv) -> None:
    fake, url = await env.fake("theirs", models=["their-model"])
    await env.fake("shared", models=["their-model"])  # same model in the pool: never used
    secret_id = await secret(env, "first-key")
    model = await custom_llm(env, url, secretId=secret_id)

    reply = await env.sdk().chat.completions.create(
        model=model, messages=[{"role": "user", "content": "hi"}]
    )

    assert reply.choices[0].message.content == fake.reply_text()
    assert received_key(fake) == "first-key"
    assert fake.requests_for("/chat/completions")[-1].body["model"] == "their-model"

    rotated = await env.http.put(
        f"/api/projects/{env.project_id}/secrets/{secret_id}/value",
        json={"value": "second-key"},
        headers=env.user_headers,
    )
    assert rotated.status_code == 200, rotated.text
    stream = await env.sdk().chat.completions.create(
        model=model, messages=[{"role": "user", "content": "hi"}], stream=True
    )
    text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
    assert text == fake.reply_text()
    assert received_key(fake) == "second-key"  # the rotation applies at once

    [first, second] = [r for r in await rows(env) if r.model_requested == model]
    assert first.is_custom
    assert second.is_custom
    assert first.backend == model


async def test_models_lists_the_projects_custom_llms_with_their_limits(env: GatewayEnv) -> None:
    _, url = await env.fake("listed", models=["their-model"])
    model = await custom_llm(env, url, apiKey="k")
    listed = await env.sdk().models.list()
    [entry] = [m for m in listed.data if m.id == model]
    assert entry.owned_by == "custom"
    assert entry.model_extra is not None
    assert entry.model_extra["max_output_tokens"] == 1000


async def test_only_network_errors_are_retried_and_never_elsewhere(env: GatewayEnv) -> None:
    fake, url = await env.fake("flaky", models=["their-model"])
    shared, _ = await env.fake("pool", models=["their-model"])
    model = await custom_llm(env, url, apiKey="k")
    fake.control.fail_status = 500

    with pytest.raises(openai.InternalServerError):
        await env.sdk().chat.completions.create(
            model=model, messages=[{"role": "user", "content": "hi"}]
        )
    assert fake.stats.failures == 1  # an HTTP error is the endpoint's answer: not retried
    assert shared.stats.requests == 0

    closed = await custom_llm(env, "http://127.0.0.1:9", apiKey="k")  # nothing listens
    with pytest.raises(openai.APIStatusError) as info:
        await env.sdk().chat.completions.create(
            model=closed, messages=[{"role": "user", "content": "hi"}]
        )
    assert info.value.status_code == 502
    assert shared.stats.requests == 0


async def test_unknown_disabled_or_foreign_custom_llms_are_not_found(env: GatewayEnv) -> None:
    _, url = await env.fake("off", models=["their-model"])
    model = await custom_llm(env, url, apiKey="k", enabled=False)
    for name in (model, "custom:nobody", "custom:"):
        with pytest.raises(openai.NotFoundError):
            await env.sdk().chat.completions.create(
                model=name, messages=[{"role": "user", "content": "hi"}]
            )


async def test_custom_llm_calls_are_outside_the_quota(env: GatewayEnv) -> None:
    _, url = await env.fake("free", models=["their-model"])
    model = await custom_llm(env, url, apiKey="k")
    await set_quota(env, perMinute=0)
    try:
        for _ in range(3):
            await env.sdk().chat.completions.create(
                model=model, messages=[{"role": "user", "content": "hi"}]
            )
    finally:
        await set_quota(env)


# ---------------------------------------------------------------------- override keys


async def test_an_override_key_replaces_the_backend_key_and_skips_the_quota(
    env: GatewayEnv,
) -> None:
    fake, url = await env.fake("keyed", models=["qwen-qwq-32b-high", "other-model"])
    await env.register(unique("keyed"), url, api_key="platform-key")
    await post(
        env,
        "overrides",
        {"conversationId": "conv-1", "modelId": "qwen-qwq-32b", "apiKey": "short-prefix"},
    )
    await post(
        env,
        "overrides",
        {"conversationId": "conv-1", "modelId": "qwen-qwq-32b-h", "apiKey": "longest-prefix"},
    )
    await set_quota(env, perMinute=1)
    try:
        sdk = env.sdk()
        for _ in range(3):  # three calls against a limit of one: none of them counted
            await sdk.chat.completions.create(
                model="qwen-qwq-32b-high",
                messages=[{"role": "user", "content": "hi"}],
                extra_body={"conversation_id": "conv-1"},
            )
            assert received_key(fake) == "Bearer longest-prefix"

        # Another conversation, or a model the prefix does not cover: the platform key.
        await sdk.chat.completions.create(
            model="other-model",
            messages=[{"role": "user", "content": "hi"}],
            extra_body={"conversation_id": "conv-1"},
        )
        assert received_key(fake) == "Bearer platform-key"
        with pytest.raises(openai.RateLimitError):  # ... and it counts against the quota
            await sdk.chat.completions.create(
                model="qwen-qwq-32b-high",
                messages=[{"role": "user", "content": "hi"}],
                extra_body={"conversation_id": "conv-2"},
            )
    finally:
        await set_quota(env)
    flagged = [r.is_override_key for r in await rows(env) if r.conversation_id == "conv-1"]
    assert flagged == [True, True, True, False]


# ----------------------------------------------------------------------------- quotas


async def test_the_quota_refuses_with_429_and_retry_after(env: GatewayEnv) -> None:
    _, url = await env.fake("quota", models=["quota-model"])
    await env.register(unique("quota"), url)
    await set_quota(env, perMinute=2)
    try:
        sdk = env.sdk()
        for _ in range(2):
            await sdk.chat.completions.create(
                model="quota-model", messages=[{"role": "user", "content": "hi"}]
            )
        with pytest.raises(openai.RateLimitError) as info:
            await sdk.chat.completions.create(
                model="quota-model", messages=[{"role": "user", "content": "hi"}], stream=True
            )
        assert info.value.code == "rate_limit_exceeded"
        assert 1 <= int(info.value.response.headers["retry-after"]) <= 60
    finally:
        await set_quota(env)
    refused = [r for r in await rows(env) if r.status == 429]
    assert refused
    assert refused[-1].error_code == "rate_limit_exceeded"


async def test_parallel_calls_never_overshoot_the_quota(env: GatewayEnv) -> None:
    _, url = await env.fake("parallel", models=["parallel-model"])
    await env.register(unique("parallel"), url)
    await set_quota(env, perDay=10)
    try:
        sdk = env.sdk()

        async def one() -> bool:
            try:
                await sdk.chat.completions.create(
                    model="parallel-model", messages=[{"role": "user", "content": "hi"}]
                )
            except openai.RateLimitError:
                return False
            return True

        admitted = await asyncio.gather(*(one() for _ in range(30)))
    finally:
        await set_quota(env)
    assert sum(admitted) == 10


# ---------------------------------------------------------------- the runtime chat


async def test_the_runtime_chat_reaches_a_custom_llm_and_honours_overrides_and_quota(
    rt: RuntimeEnv,
) -> None:
    env = rt.gw
    fake, url = await env.fake("rt-custom", models=["their-model"])
    model = await custom_llm(env, url, apiKey="custom-key")
    conversation = await rt.conversation(modelProfileId=model)

    custom = await rt.chat(conversation)
    assert custom.status == 200, custom.body
    assert custom.headers["x-arona-profile"] == model
    assert custom.headers["x-arona-backend"] == model
    assert custom.text == fake.reply_text()
    assert received_key(fake) == "custom-key"

    [(_, pooled)] = await rt.pool("rt-model", [[]])
    profile = await rt.profile("rt-model")
    keyed = await rt.conversation(modelProfileId=profile)
    await post(env, "overrides", {"conversationId": keyed, "modelId": profile, "apiKey": "mine"})
    await set_quota(env, perMinute=0)
    try:
        served = await rt.chat(keyed)
        assert served.status == 200
        assert pooled.requests_for("/chat/completions")[-1].headers["authorization"] == (
            "Bearer mine"
        )
        refused = await rt.chat(await rt.conversation(modelProfileId=profile))
        assert refused.status == 429
        assert refused.body["error"]["code"] == "rate_limit_exceeded"
        assert int(refused.headers["retry-after"]) >= 1
    finally:
        await set_quota(env)


async def test_a_conversation_naming_an_unknown_custom_llm_fails_at_chat_time(
    rt: RuntimeEnv,
) -> None:
    conversation = await rt.conversation(modelProfileId=f"custom:{uuid.uuid4().hex[:8]}")
    result = await rt.chat(conversation)
    assert result.status == 404
    assert result.body["error"]["code"] == "model_not_found"


async def test_a_refused_runtime_chat_is_metered_like_a_refused_v1_call(rt: RuntimeEnv) -> None:
    env = rt.gw
    await rt.pool("rt-refused-model", [[]])
    profile = await rt.profile("rt-refused-model")
    conversation = await rt.conversation(modelProfileId=profile)
    await set_quota(env, perMinute=0)
    try:
        refused = await rt.chat(conversation)
        with pytest.raises(openai.RateLimitError):
            await env.sdk().chat.completions.create(
                model="rt-refused-model", messages=[{"role": "user", "content": "hi"}]
            )
    finally:
        await set_quota(env)
    assert refused.status == 429
    recorded = await rows(env)
    [runtime_row] = [r for r in recorded if r.conversation_id == conversation]
    [v1_row] = [
        r for r in recorded if r.endpoint == "chat" and r.model_requested == "rt-refused-model"
    ]
    for row in (runtime_row, v1_row):
        assert (row.status, row.error_code) == (429, "rate_limit_exceeded")
        assert str(row.project_id) == env.project_id
        assert (row.total_tokens, row.backend) == (0, None)
    assert runtime_row.endpoint == "runtime_chat"
    assert runtime_row.model_profile_id == profile
    assert runtime_row.model_requested == profile

    # An unknown custom LLM is refused (404) and metered as such too.
    unknown = f"custom:{uuid.uuid4().hex[:8]}"
    missing = await rt.conversation(modelProfileId=unknown)
    assert (await rt.chat(missing)).status == 404
    [missing_row] = [r for r in await rows(env) if r.conversation_id == missing]
    assert (missing_row.status, missing_row.error_code) == (404, "model_not_found")
    assert missing_row.model_requested == unknown
    assert missing_row.is_custom
