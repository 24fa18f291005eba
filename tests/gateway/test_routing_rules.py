"""Routing rules seen from a client: aliases, tags, provider hints, load, affinity."""

from __future__ import annotations

import asyncio
from collections import Counter

from openai.types.chat import ChatCompletionMessageParam

from app.fakes.engine_echo import EchoEngine
from app.fakes.serve import serve_asgi
from app.fakes.vllm_upstream import FakeVllm
from tests.support.gateway import ADMIN, GatewayEnv, unique

MESSAGES: list[ChatCompletionMessageParam] = [{"role": "user", "content": "hi"}]


async def served_by(env: GatewayEnv, model: str, **extra: object) -> str:
    reply = await env.sdk().chat.completions.create(
        model=model,
        messages=MESSAGES,
        extra_body=extra or None,
    )
    return reply.choices[0].message.content or ""


async def test_alias_routes_to_its_target_and_is_listed(env: GatewayEnv) -> None:
    fake, url = await env.fake(models=["real-target"])
    await env.register(unique("ext"), url)
    alias = unique("fast")
    created = await env.http.post(
        "/api/admin/aliases", json={"alias": alias, "target": "real-target"}, headers=ADMIN
    )
    assert created.status_code == 201, created.text
    try:
        assert fake.name in await served_by(env, alias)
        (recorded,) = fake.requests_for("/chat/completions")
        assert recorded.body["model"] == "real-target"
        listed = {m.id for m in (await env.sdk().models.list()).data}
        assert {alias, "real-target"} <= listed
    finally:
        await env.http.delete(f"/api/admin/aliases/{alias}", headers=ADMIN)


async def test_bare_name_matches_latest_and_explicit_tags_match_exactly(env: GatewayEnv) -> None:
    fake, url = await env.ollama(models=["nomic-embed-text:latest", "qwen3:0.6b"])
    await env.register(unique("ollama"), url, type="ollama")
    sdk = env.sdk()
    embedded = await sdk.embeddings.create(model="nomic-embed-text", input="hello")
    assert len(embedded.data) == 1
    assert embedded.data[0].embedding
    (recorded,) = fake.requests_for("/api/embed")
    assert recorded.body["model"] == "nomic-embed-text:latest"
    reply = await sdk.chat.completions.create(model="qwen3:0.6b", messages=MESSAGES)
    assert reply.choices[0].message.content
    for missing in ("qwen3", "qwen3:1.7b", "nomic-embed-text:v2"):
        response = await env.http.post(
            "/v1/chat/completions",
            json={"model": missing, "messages": MESSAGES},
            headers={"Authorization": f"Bearer {env.api_key}"},
        )
        assert response.status_code == 404, missing


async def test_ollama_chat_streams_and_reports_usage(env: GatewayEnv) -> None:
    _, url = await env.ollama(models=["llama3:latest"])
    await env.register(unique("ollama"), url, type="ollama", api_key="ignored", models=["x"])
    stream = await env.sdk().chat.completions.create(
        model="llama3",
        messages=MESSAGES,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = [c async for c in stream]
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens > 0


async def test_provider_hint_picks_the_named_backend_or_kind(env: GatewayEnv) -> None:
    one, one_url = await env.fake("one", models=["shared-model"])
    two, two_url = await env.fake("two", models=["shared-model"])
    name_one, name_two = unique("one"), unique("two")
    await env.register(name_one, one_url)
    await env.register(name_two, two_url)
    for _ in range(4):
        assert two.name in await served_by(env, "shared-model", provider=name_two.upper())
    assert one.stats.chats == 0
    response = await env.http.post(
        "/v1/chat/completions",
        json={"model": "shared-model", "messages": MESSAGES, "provider": "ollama"},
        headers={"Authorization": f"Bearer {env.api_key}"},
    )
    assert response.status_code == 404


async def test_a_kind_hint_picks_backends_of_that_kind_by_any_of_its_names(
    env: GatewayEnv,
) -> None:
    model = unique("kind-model")
    external, external_url = await env.fake("ext", models=[model])
    engine = EchoEngine(unique("cep"), models=[model], embedding_models=[], reply="from the engine")
    await engine.start()
    env.stack.push_async_callback(engine.stop)
    await env.register(unique("ext"), external_url)
    await env.register(unique("engine"), engine.url, type="engine")
    for hint in ("cep", "CEP", "Engine"):
        for _ in range(3):
            assert await served_by(env, model, provider=hint) == "from the engine", hint
    assert external.stats.chats == 0
    for _ in range(3):
        assert external.name in await served_by(env, model, provider="EXTERNAL")
    assert engine.stats.chats == 9
    # The cloud video kind serves no chat: its names leave no backend for the model.
    response = await env.http.post(
        "/v1/chat/completions",
        json={"model": model, "messages": MESSAGES, "provider": "cloud"},
        headers={"Authorization": f"Bearer {env.api_key}"},
    )
    assert response.status_code == 404, response.text


async def test_least_loaded_spreads_evenly_across_equal_backends(env: GatewayEnv) -> None:
    left, left_url = await env.fake("left", models=["spread"])
    right, right_url = await env.fake("right", models=["spread"])
    for fake in (left, right):
        fake.control.delay_seconds = 0.01
    await env.register(unique("l"), left_url)
    await env.register(unique("r"), right_url)
    sdk = env.sdk()
    gate = asyncio.Semaphore(16)

    async def one() -> None:
        async with gate:
            await sdk.chat.completions.create(model="spread", messages=MESSAGES)

    await asyncio.gather(*(one() for _ in range(200)))
    counts = (left.stats.chats, right.stats.chats)
    assert sum(counts) == 200
    assert abs(counts[0] - counts[1]) <= 20, counts


async def test_conversation_is_pinned_and_rebinds_when_its_backend_fails(
    env: GatewayEnv,
) -> None:
    first, first_url = await env.fake("first", models=["sticky"])
    second, second_url = await env.fake("second", models=["sticky"])
    names = {first.name: unique("f"), second.name: unique("s")}
    await env.register(names[first.name], first_url)
    await env.register(names[second.name], second_url)
    conversation = unique("conv")
    seen = Counter([await served_by(env, "sticky", conversation_id=conversation) for _ in range(6)])
    assert len(seen) == 1, seen
    pinned_fake = first if first.name in next(iter(seen)) else second
    other_fake = second if pinned_fake is first else first
    pinned_fake.control.fail_status = 503
    await env.probe_all()
    moved = [await served_by(env, "sticky", conversation_id=conversation) for _ in range(3)]
    assert all(other_fake.name in text for text in moved)
    pinned_fake.control.fail_status = None
    await env.probe_all()
    # Re-bound: the conversation stays where it moved, even once the old one is back.
    again = [await served_by(env, "sticky", conversation_id=conversation) for _ in range(3)]
    assert all(other_fake.name in text for text in again)
    # Without a conversation id, both backends take traffic.
    free = Counter([await served_by(env, "sticky") for _ in range(6)])
    assert len(free) == 2


async def test_embeddings_accept_a_string_or_a_list(env: GatewayEnv) -> None:
    _, url = await env.fake(models=["embed-x"])
    await env.register(unique("ext"), url)
    sdk = env.sdk()
    single = await sdk.embeddings.create(model="embed-x", input="one")
    assert len(single.data) == 1
    many = await sdk.embeddings.create(model="embed-x", input=["one", "two", "three"])
    assert [d.index for d in many.data] == [0, 1, 2]
    assert many.usage.prompt_tokens > 0


async def test_models_lists_healthy_backends_only(env: GatewayEnv) -> None:
    _up, up_url = await env.fake(models=["listed-up"])
    down, down_url = await env.fake(models=["listed-down"])
    await env.register(unique("up"), up_url)
    await env.register(unique("down"), down_url)
    down.control.fail_status = 500
    await env.probe_all()
    models = await env.sdk().models.list()
    ids = {m.id for m in models.data}
    assert "listed-up" in ids
    assert "listed-down" not in ids
    assert all(m.object == "model" for m in models.data)


async def test_health_summarises_backends(env: GatewayEnv) -> None:
    _, url = await env.fake(models=["h"])
    await env.register(unique("ext"), url)
    response = await env.http.get("/v1/health", headers={"Authorization": f"Bearer {env.api_key}"})
    assert response.status_code == 200
    body = response.json()
    assert body["backends"]["healthy"] >= 1
    assert body["status"] in ("ok", "degraded")


async def test_vllm_backends_are_chosen_by_their_published_load(env: GatewayEnv) -> None:
    busy, quiet = (
        FakeVllm(unique("busy"), models=["pool-m"]),
        FakeVllm(unique("quiet"), models=["pool-m"]),
    )
    busy.running, busy.waiting = 40.0, 5.0
    quiet.running, quiet.engines, quiet.old_names = 2.0, 2, True
    urls = [await env.stack.enter_async_context(serve_asgi(fake)) for fake in (busy, quiet)]
    for url in urls:
        await env.register(unique("vllm"), url, type="vllm")
    served = Counter([await served_by(env, "pool-m") for _ in range(8)])
    assert set(served) == {f"Hello from {quiet.name}"}, served
    assert busy.metrics_scrapes >= 1
    assert quiet.metrics_scrapes >= 1
    assert busy.stats.chats == 0
