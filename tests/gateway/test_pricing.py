"""Every metered call carries its exact cost, priced at settle from the price book in
memory: chat, streamed chat, embeddings, a backend's own price, a price taking effect
at its time, estimated usage, and custom LLMs priced only by their project's prices."""

from __future__ import annotations

import datetime
import uuid
from typing import Any

import pytest
from openai.types.chat import ChatCompletionMessageParam

from app.db.models.usage import UsageRecord
from app.domain.prices.book import PLATFORM
from app.lib.settings import Settings
from tests.gateway.test_tenancy_calls import custom_llm, post
from tests.support.gateway import ADMIN, GatewayEnv, unique
from tests.support.runtime import runtime_env
from tests.support.settings import with_settings

MESSAGES: list[ChatCompletionMessageParam] = [{"role": "user", "content": "price me please"}]
# Per million tokens; large enough that every token shows in micro-units, with a
# half-micro to round: 1 token at "1000.5" costs 1000.5 micros.
INPUT, CACHED, OUTPUT, EMBEDDING = "1000.5", "250", "3000", "20"
INPUT_M, CACHED_M, OUTPUT_M, EMBEDDING_M = 1_000_500_000, 250_000_000, 3_000_000_000, 20_000_000


@pytest.fixture(scope="module")
def gateway_settings(gateway_settings: Settings) -> Settings:
    # The custom LLM fakes listen on loopback, which the SSRF guard refuses by default.
    return with_settings(gateway_settings, custom_llm_allow_private=True)


def chat_cost(row: UsageRecord, *, cached: int = 0) -> int:
    """The cost of ``row`` at the test prices, computed independently of the app."""
    numerator = (
        (row.prompt_tokens - cached) * INPUT_M
        + cached * CACHED_M
        + row.completion_tokens * OUTPUT_M
    )
    return (numerator + 500_000) // 1_000_000


async def add_price(
    env: GatewayEnv,
    path: str = "/api/admin/prices",
    headers: dict[str, str] | None = None,
    **body: Any,
) -> dict[str, Any]:
    response = await env.http.post(path, json=body, headers=headers or ADMIN)
    assert response.status_code == 201, response.text
    created: dict[str, Any] = response.json()
    return created


async def rows_for(env: GatewayEnv, model: str) -> list[UsageRecord]:
    return [r for r in await env.usage_rows() if r.model_requested == model]


async def test_chat_stream_and_embeddings_are_priced_exactly(env: GatewayEnv) -> None:
    model = unique("priced")
    fake, url = await env.fake(models=[model])
    await env.register(unique("ext"), url)
    await add_price(
        env, model=model, input=INPUT, cachedInput=CACHED, output=OUTPUT, embedding=EMBEDDING
    )
    sdk = env.sdk()
    await sdk.chat.completions.create(model=model, messages=MESSAGES)
    stream = await sdk.chat.completions.create(
        model=model, messages=MESSAGES, stream=True, stream_options={"include_usage": True}
    )
    [c async for c in stream]
    fake.control.cached_tokens = 3
    cached_reply = await sdk.chat.completions.create(model=model, messages=MESSAGES)
    assert cached_reply.usage is not None
    assert cached_reply.usage.prompt_tokens_details is not None
    assert cached_reply.usage.prompt_tokens_details.cached_tokens == 3
    await sdk.embeddings.create(model=model, input=["one", "two words"])

    plain, streamed, cached, embedded = await rows_for(env, model)
    for row in (plain, streamed):
        assert row.cost_micros == chat_cost(row)
        assert row.cost_micros > 0
    assert streamed.streamed
    assert cached.cost_micros == chat_cost(cached, cached=3)
    # The same call, three tokens cheaper.
    assert chat_cost(cached, cached=3) < chat_cost(cached)
    assert embedded.endpoint == "embeddings"
    assert embedded.cost_micros == (embedded.prompt_tokens * EMBEDDING_M + 500_000) // 1_000_000
    for row in (plain, streamed, cached, embedded):
        assert row.currency == "USD"
        assert row.cost_estimated is False
        assert row.cost_micros is not None
        assert row.cost == pytest.approx(row.cost_micros / 1_000_000)


async def test_estimated_usage_is_flagged_and_an_unpriced_model_costs_nothing(
    env: GatewayEnv,
) -> None:
    priced, unpriced = unique("est"), unique("free")
    fake, url = await env.fake(models=[priced, unpriced])
    fake.control.report_usage = False
    await env.register(unique("ext"), url)
    await add_price(env, model=priced, input=INPUT, output=OUTPUT, currency="EUR")
    sdk = env.sdk()
    await sdk.chat.completions.create(model=priced, messages=MESSAGES)
    await sdk.chat.completions.create(model=unpriced, messages=MESSAGES)

    (estimated,) = await rows_for(env, priced)
    assert estimated.estimated is True
    assert estimated.cost_estimated is True
    assert estimated.cost_micros == chat_cost(estimated)
    assert estimated.currency == "EUR"
    (free,) = await rows_for(env, unpriced)
    assert (free.cost_micros, free.cost, free.currency, free.cost_estimated) == (
        None,
        None,
        None,
        False,
    )


async def test_a_backends_own_price_beats_the_model_wide_one(env: GatewayEnv) -> None:
    model = unique("shared")
    _, url_a = await env.fake("a", models=[model])
    _, url_b = await env.fake("b", models=[model])
    cheap, dear = unique("cheap"), unique("dear")
    await env.register(cheap, url_a)
    await env.register(dear, url_b)
    await add_price(env, model=model, input=INPUT, output=OUTPUT)
    await add_price(env, model=model, backend=dear, input="9000", output="9000")
    sdk = env.sdk()
    for backend in (cheap, dear):
        await sdk.chat.completions.create(
            model=model, messages=MESSAGES, extra_body={"provider": backend}
        )

    by_backend = {r.backend: r for r in await rows_for(env, model)}
    assert by_backend[cheap].cost_micros == chat_cost(by_backend[cheap])
    dear_row = by_backend[dear]
    tokens = dear_row.prompt_tokens + dear_row.completion_tokens
    assert dear_row.cost_micros == (tokens * 9_000_000_000 + 500_000) // 1_000_000


async def test_a_price_change_takes_effect_at_its_time(env: GatewayEnv) -> None:
    model = unique("change")
    _, url = await env.fake(models=[model])
    await env.register(unique("ext"), url)
    first = await add_price(env, model=model, input=INPUT, output=OUTPUT)
    later = datetime.datetime.now(datetime.UTC) + datetime.timedelta(hours=1)
    second = await add_price(
        env, model=model, input="1", output="1", effectiveFrom=later.isoformat()
    )
    assert first["inForce"] is True
    assert second["inForce"] is False

    await env.sdk().chat.completions.create(model=model, messages=MESSAGES)
    (row,) = await rows_for(env, model)
    assert row.cost_micros == chat_cost(row)  # the later price is not in force yet

    # The same book, asked about a moment after the change: the new price, with no
    # write or event in between (the table holds future rows).
    book = env.resources.price_book
    loads = book.loads

    async def at(moment: datetime.datetime) -> Any:
        return await book.price_for(model, model, None, row.backend, None, False, moment)

    assert (await at(later - datetime.timedelta(seconds=1))).id == uuid.UUID(first["id"])
    assert (await at(later)).id == uuid.UUID(second["id"])
    assert book.loads == loads
    assert (await book.table(PLATFORM)).size >= 2


async def test_custom_llm_calls_are_priced_only_by_the_projects_own_prices(
    env: GatewayEnv,
) -> None:
    _, url = await env.fake("theirs", models=["their-model"])
    model = await custom_llm(env, url, apiKey="sk-own-" + "k" * 20)
    # Platform prices for both the name the call used and the model served: not used.
    await add_price(env, model=model, input="5000", output="5000")
    await add_price(env, model="their-model", input="5000", output="5000")
    sdk = env.sdk()
    await sdk.chat.completions.create(model=model, messages=MESSAGES)
    (unpriced,) = await rows_for(env, model)
    assert unpriced.is_custom is True
    assert unpriced.cost_micros is None

    await add_price(
        env,
        path=f"/api/projects/{env.project_id}/prices",
        headers=env.user_headers,
        model=model,
        input=INPUT,
        output=OUTPUT,
        currency="GBP",
    )
    await sdk.chat.completions.create(model=model, messages=MESSAGES)
    _, priced = await rows_for(env, model)
    assert priced.cost_micros == chat_cost(priced)
    assert priced.currency == "GBP"


async def test_runtime_chat_is_priced_by_its_profile_from_memory(env: GatewayEnv) -> None:
    runtime = await runtime_env(env)
    try:
        base_model = unique("rt-base")
        await runtime.pool(base_model, [[]])
        profile = await runtime.profile(base_model)
        # The profile's price wins over the base model's (the request names the profile).
        await add_price(env, model=base_model, input="1", output="1")
        await add_price(env, model=profile, input=INPUT, output=OUTPUT)
        conversation = await runtime.conversation(provider=profile)
        book = env.resources.price_book
        await runtime.chat(conversation)
        loads = book.loads
        await runtime.chat(conversation)
        # Settling read no price from the database: the book answered from memory.
        assert book.loads == loads
    finally:
        await runtime.cleanup()
    rows = [r for r in await env.usage_rows() if r.conversation_id == conversation]
    assert len(rows) == 2
    for row in rows:
        assert row.endpoint == "runtime_chat"
        assert row.model_profile_id == profile
        assert row.completion_tokens > 0
        assert row.cost_micros == chat_cost(row)


async def test_override_key_calls_are_priced_by_the_projects_price_and_others_by_the_platforms(
    env: GatewayEnv,
) -> None:
    model = unique("byo")
    _, url = await env.fake(models=[model])
    await env.register(unique("keyed"), url, api_key="platform-key")
    conversation = unique("conv")
    await post(
        env, "overrides", {"conversationId": conversation, "modelId": model, "apiKey": "mine"}
    )
    await add_price(env, model=model, input="1", output="1")
    await add_price(
        env,
        path=f"/api/projects/{env.project_id}/prices",
        headers=env.user_headers,
        model=model,
        input=INPUT,
        output=OUTPUT,
        currency="EUR",
    )
    sdk = env.sdk()
    # With the project's own key: the project's price; without it: the platform's.
    await sdk.chat.completions.create(
        model=model, messages=MESSAGES, extra_body={"conversation_id": conversation}
    )
    await sdk.chat.completions.create(model=model, messages=MESSAGES)
    byo, platform = await rows_for(env, model)
    assert byo.is_override_key is True
    assert (byo.cost_micros, byo.currency) == (chat_cost(byo), "EUR")
    assert platform.is_override_key is False
    tokens = platform.prompt_tokens + platform.completion_tokens
    assert (platform.cost_micros, platform.currency) == (tokens, "USD")
