"""Project token limits and money budgets enforced on real calls, end to end: the
official ``openai`` SDK on ``/v1`` and the runtime chat against fake upstreams, the
limits set through the quota API, a key's own ``tpm`` and budget through its PATCH.

Every call holds its estimate while it runs (the prompt's estimate plus
``max_tokens``, at the model's price) and settles to what it used before the answer
goes out, so the arithmetic below is exact: with ``A`` tokens used and ``E``
estimated per call, a limit of ``N * A + E - 1`` admits ``N`` calls and refuses the
next. The test prices make a token cost exactly 1000 micro-units either way.
"""

from __future__ import annotations

import asyncio
import datetime
import time
from typing import Any

import msgspec
import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from app.routing.types import RawBody
from app.routing.usage import estimate_prompt_tokens
from tests.support.api import eventually
from tests.support.gateway import ADMIN, GatewayEnv, unique
from tests.support.runtime import runtime_env

HELLO: list[ChatCompletionMessageParam] = [{"role": "user", "content": "hi there"}]
MAX_TOKENS = 10
PER_MILLION = "1000"
"""Input and output price: 1000 per million tokens, 1000 micro-units per token."""
MICROS_PER_TOKEN = 1000


def estimated_tokens(model: str) -> int:
    """What admission holds for one ``HELLO`` call: the prompt's estimate (the meter's
    own rule, on the raw body as the gateway reads it) plus ``max_tokens``."""
    body = msgspec.json.encode({"model": model, "messages": HELLO, "max_tokens": MAX_TOKENS})
    raw = msgspec.json.decode(body, type=RawBody)
    return estimate_prompt_tokens(raw) + MAX_TOKENS


def text(micros: int) -> str:
    whole, fraction = divmod(micros, 1_000_000)
    return f"{whole}.{fraction:06d}".rstrip("0").rstrip(".")


def seconds_to_midnight() -> float:
    now = datetime.datetime.now(datetime.UTC)
    midnight = (now + datetime.timedelta(days=1)).replace(hour=0, minute=0, second=0, microsecond=0)
    return (midnight - now).total_seconds()


async def fresh_minute(margin: float = 15.0) -> None:
    """Wait for a new minute when this one has less than ``margin`` seconds left, so
    that a test's calls fall in one minute window."""
    left = 60 - time.time() % 60
    if left < margin:
        await asyncio.sleep(left + 0.05)


async def priced_model(env: GatewayEnv, tag: str) -> str:
    model = unique(tag)
    _, url = await env.fake(tag, models=[model])
    await env.register(unique(tag), url)
    response = await env.http.post(
        "/api/admin/prices",
        json={"model": model, "input": PER_MILLION, "output": PER_MILLION},
        headers=ADMIN,
    )
    assert response.status_code == 201, response.text
    return model


async def set_ceilings(env: GatewayEnv, **limits: Any) -> dict[str, Any]:
    response = await env.http.put(
        f"/api/admin/projects/{env.project_id}/quota", json=limits, headers=ADMIN
    )
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


async def quota(env: GatewayEnv) -> dict[str, Any]:
    response = await env.http.get(f"/api/projects/{env.project_id}/quota", headers=env.user_headers)
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


async def call(client: openai.AsyncOpenAI, model: str) -> int:
    """One chat; the tokens it used."""
    reply = await client.chat.completions.create(model=model, messages=HELLO, max_tokens=MAX_TOKENS)
    assert reply.usage is not None
    return reply.usage.total_tokens


def refusal(info: pytest.ExceptionInfo[openai.RateLimitError]) -> tuple[dict[str, Any], int]:
    """The 429's error body and its ``Retry-After``."""
    response = info.value.response
    error: dict[str, Any] = response.json()["error"]
    assert set(error) >= {"message", "type", "code", "param"}, error
    assert error["type"] == "rate_limit_error"
    return error, int(response.headers["retry-after"])


async def new_key(env: GatewayEnv) -> dict[str, Any]:
    response = await env.http.post(
        f"/api/projects/{env.project_id}/api-keys",
        json={"name": unique("k")},
        headers=env.user_headers,
    )
    assert response.status_code == 201, response.text
    body: dict[str, Any] = response.json()
    return body


async def patch_key(env: GatewayEnv, key_id: str, **fields: Any) -> dict[str, Any]:
    response = await env.http.patch(
        f"/api/projects/{env.project_id}/api-keys/{key_id}",
        json=fields,
        headers=env.user_headers,
    )
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


# ----------------------------------------------------------------- the project


async def test_a_tokens_per_day_limit_admits_n_calls_then_429(env: GatewayEnv) -> None:
    model = await priced_model(env, "tok")
    sdk = env.sdk()
    estimate = estimated_tokens(model)
    # One call unlimited, to learn what a call uses (the fake's count is fixed).
    used = await call(sdk, model)
    calls = 3
    await set_ceilings(env, tokensPerDay=calls * used + estimate - 1)
    for _ in range(calls):
        assert await call(sdk, model) == used
    with pytest.raises(openai.RateLimitError) as info:
        await call(sdk, model)
    error, retry_after = refusal(info)
    assert error["code"] == "token_limit_exceeded"
    assert "tokens per day" in error["message"]
    # The day window: retry at the next UTC midnight.
    assert abs(retry_after - seconds_to_midnight()) <= 5
    # Counted from when the limit was set: the first call is not in the window.
    tokens = (await quota(env))["usage"]["tokens"]
    assert tokens["day"]["used"] == calls * used
    assert tokens["day"]["limit"] == calls * used + estimate - 1
    assert tokens["minute"]["limit"] is None
    assert tokens["minute"]["used"] is not None  # counted: the project limits tokens

    # An owner lowering it below what was used refuses even the smallest call.
    lowered = await env.http.put(
        f"/api/projects/{env.project_id}/quota",
        json={"tokensPerDay": 1},
        headers=env.user_headers,
    )
    assert lowered.status_code == 200, lowered.text
    with pytest.raises(openai.RateLimitError):
        await call(sdk, model)
    rows = [r for r in await env.usage_rows() if r.model_requested == model]
    assert [r.error_code for r in rows if r.status == 429] == ["token_limit_exceeded"] * 2


async def test_a_budget_per_day_admits_calls_until_spent_then_429(env: GatewayEnv) -> None:
    model = await priced_model(env, "bud")
    sdk = env.sdk()
    estimate = estimated_tokens(model) * MICROS_PER_TOKEN
    used = await call(sdk, model) * MICROS_PER_TOKEN
    calls = 2
    budget = calls * used + estimate - 1
    body = await set_ceilings(env, budgetPerDay=text(budget))
    assert body["limits"]["budgetPerDay"] == text(budget)
    for _ in range(calls):
        await call(sdk, model)
    with pytest.raises(openai.RateLimitError) as info:
        await call(sdk, model)
    error, retry_after = refusal(info)
    assert error["code"] == "budget_exceeded"
    assert "budget of" in error["message"]
    assert "per day" in error["message"]
    assert abs(retry_after - seconds_to_midnight()) <= 5

    # What the window counted is what the records cost (the calls since the budget).
    rows = [r for r in await env.usage_rows() if r.model_requested == model]
    assert [r.status for r in rows] == [200] * (calls + 1) + [429]
    assert rows[-1].error_code == "budget_exceeded"
    assert rows[-1].cost_micros is None  # refused before any upstream: no cost
    spent = sum(r.cost_micros or 0 for r in rows[1:])
    assert spent == calls * used
    spend = (await quota(env))["usage"]["spend"]
    assert spend["day"] == {**spend["day"], "used": text(spent), "limit": text(budget)}
    assert spend["month"] == {**spend["month"], "used": text(spent), "limit": None}

    # Raising the budget lets calls through again at once.
    await set_ceilings(env, budgetPerDay=text(budget + estimate))
    await call(sdk, model)


async def test_the_runtime_chat_is_refused_once_the_budget_is_spent(env: GatewayEnv) -> None:
    rt = await runtime_env(env)
    try:
        model = unique("rtbud")
        await rt.pool(model, [[]])
        price = await env.http.post(
            "/api/admin/prices",
            json={"model": model, "input": PER_MILLION, "output": PER_MILLION},
            headers=ADMIN,
        )
        assert price.status_code == 201, price.text
        # Output capped at 16 tokens by the profile: each chat holds a little more
        # than it uses, and about a dozen fit in the budget.
        profile = await rt.profile(model, maxOutputTokens=16)
        await set_ceilings(env, budgetPerDay="0.3")
        conversation = await rt.conversation()
        statuses = []
        for _ in range(60):
            result = await rt.chat(conversation, modelProfileId=profile, stream=False)
            statuses.append(result.status)
            if result.status != 200:
                break
        assert statuses.count(200) >= 2
        assert statuses[-1] == 429
        assert result.body["error"]["code"] == "budget_exceeded"
        assert abs(int(result.headers["retry-after"]) - seconds_to_midnight()) <= 5
        # A streamed chat is refused before its stream starts, the same way.
        streamed = await rt.chat(conversation, modelProfileId=profile)
        assert streamed.status == 429
        assert streamed.body["error"]["code"] == "budget_exceeded"
        assert "retry-after" in streamed.headers

        async def spend_is_the_records_cost() -> bool:
            rows = await env.usage_rows()
            spent = sum(r.cost_micros or 0 for r in rows)
            return bool((await quota(env))["usage"]["spend"]["day"]["used"] == text(spent))

        await eventually(spend_is_the_records_cost, within=5.0)
        assert (await quota(env))["usage"]["spend"]["day"]["used"] != "0"
        # A larger budget admits the next chat at once.
        await set_ceilings(env, budgetPerDay="1")
        result = await rt.chat(conversation, modelProfileId=profile, stream=False)
        assert result.status == 200, result.body
    finally:
        await rt.cleanup()


# ---------------------------------------------------------------------- the key


async def test_a_key_tpm_refuses_that_key_only(env: GatewayEnv) -> None:
    model = await priced_model(env, "ktpm")
    estimate = estimated_tokens(model)
    used = await call(env.sdk(), model)
    key = await new_key(env)
    patched = await patch_key(env, key["id"], tpm=used + estimate - 1)
    assert patched["tpm"] == used + estimate - 1
    limited = env.sdk(key["key"])
    await fresh_minute()
    await call(limited, model)
    with pytest.raises(openai.RateLimitError) as info:
        await call(limited, model)
    error, retry_after = refusal(info)
    assert error["code"] == "token_limit_exceeded"
    assert "this credential" in error["message"]
    assert 1 <= retry_after <= 60
    # The project's other key is not held back, and the project counts no tokens.
    for _ in range(3):
        await call(env.sdk(), model)
    assert (await quota(env))["usage"]["tokens"]["minute"]["used"] is None


async def test_a_key_budget_refuses_that_key_only(env: GatewayEnv) -> None:
    model = await priced_model(env, "kbud")
    estimate = estimated_tokens(model) * MICROS_PER_TOKEN
    used = await call(env.sdk(), model) * MICROS_PER_TOKEN
    key = await new_key(env)
    patched = await patch_key(env, key["id"], budget=text(used + estimate - 1), budgetPeriod="day")
    assert (patched["budget"], patched["budgetPeriod"]) == (text(used + estimate - 1), "day")
    limited = env.sdk(key["key"])
    await call(limited, model)
    with pytest.raises(openai.RateLimitError) as info:
        await call(limited, model)
    error, retry_after = refusal(info)
    assert error["code"] == "budget_exceeded"
    assert "this credential" in error["message"]
    assert abs(retry_after - seconds_to_midnight()) <= 5
    for _ in range(3):
        await call(env.sdk(), model)
    rows = [r for r in await env.usage_rows() if str(r.api_key_id) == key["id"]]
    assert [r.status for r in rows] == [200, 429]
