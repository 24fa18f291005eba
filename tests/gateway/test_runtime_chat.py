"""``POST /api/runtime/chat`` end to end: a live Arona, fake vLLM servers on loopback
ports, conversations stored in PostgreSQL, SSE read event by event."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import pytest
from sqlalchemy import select
from sqlalchemy.ext.asyncio import create_async_engine

from app.db.models.usage import UsageRecord
from tests.support.api import eventually
from tests.support.gateway import ADMIN, GatewayEnv, unique
from tests.support.helpers import assert_error, bearer
from tests.support.runtime import RuntimeEnv, runtime_env

MODEL = "qwen3-8b"


@pytest.fixture
async def rt(env: GatewayEnv) -> AsyncIterator[RuntimeEnv]:
    runtime = await runtime_env(env)
    yield runtime
    await runtime.cleanup()


async def test_streams_openai_chunks_with_usage_and_stores_both_turns(rt: RuntimeEnv) -> None:
    [(backend, fake)] = await rt.pool(MODEL, [["general"]])
    profile = await rt.profile(MODEL)
    conversation = await rt.conversation(modelProfileId=profile)

    result = await rt.chat(conversation, "What is Arona?")

    assert result.status == 200
    assert result.headers["x-arona-profile"] == profile
    assert result.headers["x-arona-backend"] == backend
    assert result.headers["x-arona-failover"] == "none"
    assert result.done
    assert result.text == fake.reply_text()
    chunks = [e for e in result.events if e.get("object") == "chat.completion.chunk"]
    assert chunks
    assert all("choices" in c for c in chunks)
    usage = result.usage
    assert usage is not None
    assert usage["total_tokens"] > 0
    assert result.events[-1]["usage"] == usage  # the usage chunk comes last
    stored = await rt.messages(conversation)
    assert [(m["role"], m["content"]) for m in stored] == [
        ("user", "What is Arona?"),
        ("assistant", fake.reply_text()),
    ]
    assert stored[1]["modelProfileId"] == profile
    assert stored[1]["backend"] == backend


async def test_history_goes_upstream_before_the_new_turn(rt: RuntimeEnv) -> None:
    [(_, fake)] = await rt.pool(MODEL, [[]])
    profile = await rt.profile(MODEL)
    conversation = await rt.conversation(
        modelProfileId=profile, messages=[{"role": "system", "content": "Be brief."}]
    )
    await rt.chat(conversation, "first")
    await rt.chat(conversation, "second")

    sent = fake.requests_for("/chat/completions")[-1].body
    assert sent["model"] == MODEL
    assert [m["role"] for m in sent["messages"]] == ["system", "user", "assistant", "user"]
    assert sent["messages"][-1]["content"] == "second"
    assert sent["stream"] is True


async def test_non_streamed_reply_is_a_completion_with_the_same_headers(rt: RuntimeEnv) -> None:
    [(backend, fake)] = await rt.pool(MODEL, [[]])
    profile = await rt.profile(MODEL)
    conversation = await rt.conversation(llmId=profile)

    result = await rt.chat(conversation, "hi", stream=False)

    assert result.status == 200, result.body
    assert result.headers["x-arona-backend"] == backend
    assert result.body["choices"][0]["message"]["content"] == fake.reply_text()
    assert [m["role"] for m in await rt.messages(conversation)] == ["user", "assistant"]


async def test_usage_record_names_profile_conversation_and_backend(rt: RuntimeEnv) -> None:
    [(backend, _)] = await rt.pool(MODEL, [[]])
    profile = await rt.profile(MODEL)
    conversation = await rt.conversation(provider=profile)
    await rt.chat(conversation)

    await rt.gw.resources.usage_writer.flush()
    engine = create_async_engine(rt.gw.settings.database_url)
    try:
        async with engine.connect() as conn:
            rows = (
                await conn.execute(
                    select(UsageRecord).where(UsageRecord.conversation_id == conversation)
                )
            ).all()
    finally:
        await engine.dispose()
    [row] = rows
    assert row.endpoint == "runtime_chat"
    assert row.model_profile_id == profile
    assert row.backend == backend
    assert row.status == 200
    assert row.total_tokens > 0
    assert row.ttft_ms is not None
    assert row.latency_ms >= row.ttft_ms
    assert row.project_id == uuid.UUID(rt.gw.project_id)


async def test_profile_comes_from_request_then_conversation_then_project_default(
    rt: RuntimeEnv,
) -> None:
    [(_, _fake_a)] = await rt.pool("model-a", [[]])
    [(_, _fake_b)] = await rt.pool("model-b", [[]])
    first = await rt.profile("model-a", id=f"a-{uuid.uuid4().hex[:6]}")
    second = await rt.profile("model-b", id=f"b-{uuid.uuid4().hex[:6]}")
    conversation = await rt.conversation(modelProfileId=second)

    assert (await rt.chat(conversation)).headers["x-arona-profile"] == second
    explicit = await rt.chat(conversation, modelProfileId=first)
    assert explicit.headers["x-arona-profile"] == first

    response = await rt.http.put(
        f"/api/projects/{rt.gw.project_id}/models",
        json={"defaultProfileId": second, "enabledProfileIds": None},
        headers=rt.gw.user_headers,
    )
    assert response.status_code == 200, response.text
    plain = await rt.conversation()
    assert (await rt.chat(plain)).headers["x-arona-profile"] == second


async def test_unknown_or_disabled_profile_is_refused_before_any_upstream_call(
    rt: RuntimeEnv,
) -> None:
    [(_, fake)] = await rt.pool(MODEL, [[]])
    conversation = await rt.conversation()
    unknown = await rt.chat(conversation, modelProfileId="no-such-profile")
    assert unknown.status == 404
    assert unknown.body["error"]["code"] == "profile_not_found"

    disabled = await rt.profile(MODEL, enabled=False)
    refused = await rt.chat(conversation, modelProfileId=disabled)
    assert refused.status == 400
    assert refused.body["error"]["code"] == "profile_disabled"
    assert fake.stats.chats == 0
    assert await rt.messages(conversation) == []


async def test_bad_requests_get_precise_errors(rt: RuntimeEnv) -> None:
    profile = await rt.profile(MODEL)
    conversation = await rt.conversation(modelProfileId=profile)
    http = rt.http

    no_messages = await http.post(
        "/api/runtime/chat", json={"conversationId": conversation}, headers=rt.headers
    )
    assert_error(no_messages, 400)
    conflict = await rt.chat(conversation, llmId=profile, provider="other")
    assert conflict.status == 400
    assert conflict.body["error"]["code"] == "conflicting_profile_fields"
    tools = await rt.chat(conversation, tools=[{"type": "function", "function": {"name": "f"}}])
    assert tools.status == 400
    assert tools.body["error"]["code"] == "tools_not_supported"
    too_long = await rt.chat(conversation, maxTokens=100_000)
    assert too_long.status == 400
    assert too_long.body["error"]["param"] == "maxTokens"
    missing = await rt.chat(str(uuid.uuid4()))
    assert missing.status == 404
    api_key = await http.post(
        "/api/runtime/chat",
        json={"conversationId": conversation, "messages": [{"role": "user", "content": "x"}]},
        headers=bearer(rt.gw.api_key),
    )
    assert_error(api_key, 403, "runtime_token_required")


async def test_another_projects_conversation_is_not_found(rt: RuntimeEnv) -> None:
    await rt.pool(MODEL, [[]])
    profile = await rt.profile(MODEL)
    conversation = await rt.conversation(modelProfileId=profile)
    other_project = await rt.http.post(
        "/api/projects",
        json={"name": "Other", "slug": f"o-{uuid.uuid4().hex[:10]}"},
        headers=rt.gw.user_headers,
    )
    token = await rt.http.post(
        f"/api/projects/{other_project.json()['id']}/runtime-tokens",
        json={},
        headers=rt.gw.user_headers,
    )
    stranger = bearer(token.json()["token"])

    result = await rt.chat(conversation, headers=stranger)

    assert result.status == 404
    assert result.body["error"]["code"] == "conversation_not_found"
    assert await rt.messages(conversation) == []


async def test_tagged_profile_only_reaches_backends_with_every_tag(rt: RuntimeEnv) -> None:
    pool = await rt.pool("tagged-model", [["general"], ["general", "smart"], ["smart"]])
    smart = await rt.profile("tagged-model", tags=["smart", "general"])
    conversation = await rt.conversation(modelProfileId=smart)

    for _ in range(4):
        result = await rt.chat(conversation)
        assert result.headers["x-arona-backend"] == pool[1][0]
    assert pool[0][1].stats.chats == 0
    assert pool[2][1].stats.chats == 0


async def test_lowest_vllm_score_wins_and_follows_the_metrics(rt: RuntimeEnv) -> None:
    (busy, busy_fake), (idle, idle_fake) = await rt.pool("scored-model", [[], []])
    busy_fake.running, busy_fake.waiting = 4, 2
    idle_fake.running = 1
    profile = await rt.profile("scored-model")

    first = await rt.chat(await rt.conversation(modelProfileId=profile))
    assert first.headers["x-arona-backend"] == idle

    idle_fake.waiting = 5  # 1 + 50 now scores worse than 4 + 20
    await asyncio.sleep(2.1)  # past the metrics' freshness

    # The first call after that triggers a scrape in the background; calls route on
    # the fresh figures once it has landed.
    async def routed_to_busy() -> bool:
        result = await rt.chat(await rt.conversation(modelProfileId=profile))
        return result.headers["x-arona-backend"] == busy

    await eventually(routed_to_busy, within=5.0, interval=0.05)


async def test_every_turn_is_scored_a_conversation_leaves_its_backend_when_loaded(
    rt: RuntimeEnv,
) -> None:
    (first, first_fake), (second, second_fake) = await rt.pool("turns-model", [[], []])
    first_fake.running, second_fake.running = 0, 1  # the first scores lower
    profile = await rt.profile("turns-model", routingScore="seed")
    conversation = await rt.conversation(modelProfileId=profile)
    opening = await rt.chat(conversation)
    assert opening.headers["x-arona-backend"] == first
    # A little busier than the other: the warm prefix cache keeps the conversation.
    first_fake.running = 3
    await asyncio.sleep(2.1)  # past the metrics' freshness

    async def stays() -> bool:
        result = await rt.chat(conversation)
        return result.headers["x-arona-backend"] == first

    await eventually(stays, within=5.0, interval=0.05)
    # Now it queues: the next turns leave it (the seed used to pin them for 24 h).
    first_fake.waiting = 6

    async def leaves() -> bool:
        result = await rt.chat(conversation)
        return result.headers["x-arona-backend"] == second

    await eventually(leaves, within=5.0, interval=0.05)
    # And stay on the new backend while it is good enough.
    first_fake.waiting, first_fake.running = 0, 0
    await asyncio.sleep(2.1)
    for _ in range(3):
        assert (await rt.chat(conversation)).headers["x-arona-backend"] == second


async def test_the_backend_header_names_the_one_that_served_after_a_cut_before_any_byte(
    rt: RuntimeEnv,
) -> None:
    (first, first_fake), (second, second_fake) = await rt.pool("cut-model", [[], []])
    first_fake.running, second_fake.running = 0, 1  # the first scores lower: tried first
    profile = await rt.profile("cut-model")
    warm = await rt.chat(await rt.conversation(modelProfileId=profile))
    assert warm.headers["x-arona-backend"] == first
    first_fake.control.drop_stream_after = 0  # answers 200, then cuts before a frame

    result = await rt.chat(await rt.conversation(modelProfileId=profile))

    assert result.status == 200
    assert first_fake.stats.dropped_streams == 1
    assert result.headers["x-arona-backend"] == second
    assert result.text == second_fake.reply_text()
    assert not result.errors


async def test_a_stream_every_backend_cuts_before_any_byte_is_a_502_not_a_200(
    rt: RuntimeEnv,
) -> None:
    pool = await rt.pool("all-cut-model", [[], []])
    profile = await rt.profile("all-cut-model")
    for _, fake in pool:
        fake.control.drop_stream_after = 0
    conversation = await rt.conversation(modelProfileId=profile)

    result = await rt.chat(conversation)

    assert result.status == 502
    assert result.body["error"]["code"] == "bad_gateway"
    assert all(fake.stats.dropped_streams == 1 for _, fake in pool)
    assert await rt.messages(conversation) == []


async def test_the_profiles_routing_score_ranks_the_backends_with_their_batch_slots(
    rt: RuntimeEnv,
) -> None:
    # Roomy: 20 running of 64 slots. Full: 2 running of its 2 slots. The seed score
    # (running + 10 * waiting) prefers the full one (2 < 20); the capacity score
    # prefers the one with a free slot, which it knows only from max_concurrency
    # (without it, 2 running would look emptier than 20).
    model = "slots-model"
    roomy_fake, roomy_url = await rt.vllm(models=[model])
    full_fake, full_url = await rt.vllm(models=[model])
    roomy, full = unique("roomy"), unique("full")
    await rt.register(roomy, roomy_url, tags=[], max_concurrency=64)
    await rt.register(full, full_url, tags=[], max_concurrency=2)
    roomy_fake.running, full_fake.running = 20, 2
    seed = await rt.profile(model, routingScore="seed")
    capacity = await rt.profile(model, routingScore="capacity")
    default = await rt.profile(model)
    assert rt.gw.settings.routing_score == "capacity"

    async def served_by(profile: str) -> str:
        result = await rt.chat(await rt.conversation(modelProfileId=profile))
        assert result.status == 200, result.body
        return result.headers["x-arona-backend"]

    for _ in range(3):
        assert await served_by(seed) == full
        assert await served_by(capacity) == roomy
        assert await served_by(default) == roomy  # the platform default: capacity

    # Cleared, the seed profile follows the platform default too.
    response = await rt.http.patch(
        f"/api/admin/model-profiles/{seed}", json={"routingScore": None}, headers=ADMIN
    )
    assert response.status_code == 200, response.text
    assert await served_by(seed) == roomy


async def test_a_failing_backend_is_retried_on_another_then_cools_down(rt: RuntimeEnv) -> None:
    (first, first_fake), (second, second_fake) = await rt.pool("retry-model", [[], []])
    first_fake.running, second_fake.running = 0, 1  # the first scores lower: tried first
    profile = await rt.profile("retry-model")
    # Warms the metrics cache, so the failure below hits the chat, not the scrape.
    warm = await rt.chat(await rt.conversation(modelProfileId=profile))
    assert warm.headers["x-arona-backend"] == first
    first_fake.control.fail_status = 503

    result = await rt.chat(await rt.conversation(modelProfileId=profile))

    assert result.status == 200
    assert result.headers["x-arona-backend"] == second
    assert result.text == second_fake.reply_text()
    assert first_fake.stats.failures == 1
    # Healthy again and still the lower score, but cooling down: passed over.
    first_fake.control.fail_status = None
    again = await rt.chat(await rt.conversation(modelProfileId=profile))
    assert again.headers["x-arona-backend"] == second
    assert first_fake.stats.failures == 1


async def test_a_backend_whose_metrics_fail_is_penalised(rt: RuntimeEnv) -> None:
    (_, blind_fake), (visible, visible_fake) = await rt.pool("blind-model", [[], []])
    blind_fake.metrics_status = 500
    visible_fake.running, visible_fake.waiting = 8, 3  # busy, but its load is known
    profile = await rt.profile("blind-model")

    for _ in range(3):
        result = await rt.chat(await rt.conversation(modelProfileId=profile))
        assert result.headers["x-arona-backend"] == visible
    assert blind_fake.stats.chats == 0
    assert blind_fake.metrics_scrapes >= 1
