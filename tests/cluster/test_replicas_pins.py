"""Conversations keep their backend and their fallback pin whichever replica a turn
lands on: session affinity and sticky fallback pins are shared state, not per replica."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from app.fakes.openai_upstream import FakeOpenAI
from app.fakes.serve import serve_asgi
from tests.support.cluster import (
    ADMIN,
    Cluster,
    Tenant,
    register_backend,
    runtime_token,
    unique,
    wait_healthy_everywhere,
)
from tests.support.helpers import bearer
from tests.support.runtime import ChatResult, parse_sse

pytestmark = pytest.mark.cluster


@contextlib.asynccontextmanager
async def backends(cluster: Cluster, model: str, count: int) -> AsyncIterator[list[FakeOpenAI]]:
    """``count`` fakes serving ``model``, registered (as ``fake.name``) and healthy on
    every replica; unregistered at the end."""
    fakes = [FakeOpenAI(unique("be"), models=[model]) for _ in range(count)]
    async with contextlib.AsyncExitStack() as stack:
        for fake in fakes:
            url = await stack.enter_async_context(serve_asgi(fake))
            await register_backend(cluster.a, fake.name, url)
        for fake in fakes:
            await wait_healthy_everywhere(cluster, fake.name)
        yield fakes
        for fake in fakes:
            await cluster.a.delete(f"/api/admin/backends/{fake.name}", headers=ADMIN)


async def create_profile(cluster: Cluster, base_model: str, **fields: Any) -> str:
    profile_id = unique("prof")
    response = await cluster.a.post(
        "/api/admin/model-profiles",
        json={
            "id": profile_id,
            "name": profile_id,
            "baseModel": base_model,
            "contextWindowTokens": 8192,
            "maxOutputTokens": 1024,
            **fields,
        },
        headers=ADMIN,
    )
    assert response.status_code == 201, response.text
    return profile_id


async def conversation(client: httpx.AsyncClient, token: str, profile_id: str) -> str:
    response = await client.post(
        "/api/runtime/conversations", json={"modelProfileId": profile_id}, headers=bearer(token)
    )
    assert response.status_code == 201, response.text
    conversation_id: str = response.json()["id"]
    return conversation_id


async def turn(client: httpx.AsyncClient, token: str, conversation_id: str) -> ChatResult:
    body = {"conversationId": conversation_id, "messages": [{"role": "user", "content": "hi"}]}
    async with client.stream(
        "POST", "/api/runtime/chat", json=body, headers=bearer(token)
    ) as response:
        raw = await response.aread()
    result = ChatResult(status=response.status_code, headers=response.headers)
    result.events, result.done = parse_sse(raw)
    return result


async def test_a_conversation_started_on_a_stays_on_its_backend_on_b(
    cluster: Cluster, tenant: Tenant
) -> None:
    token = await runtime_token(cluster.a, tenant)
    model = unique("shared-model")
    async with backends(cluster, model, 2) as fakes:
        profile_id = await create_profile(cluster, model)
        conversations = [await conversation(cluster.a, token, profile_id) for _ in range(4)]
        first: dict[str, str] = {}
        for conv in conversations:
            result = await turn(cluster.a, token, conv)
            assert result.status == 200, result.events
            assert result.done, result.events
            first[conv] = result.headers["x-arona-backend"]
        # Both backends are equally good: A spread the first turns over both.
        assert set(first.values()) == {f.name for f in fakes}, first

        # B picks ties round-robin; asking in the order X, X, Y, Y (by first backend)
        # would alternate without affinity, so at least one turn would move.
        ordered = sorted(conversations, key=lambda c: first[c])
        for conv in ordered:
            result = await turn(cluster.b, token, conv)
            assert result.status == 200, result.events
            assert result.done, result.events
            assert result.headers["x-arona-backend"] == first[conv], conv
            assert result.text == f"Hello from {first[conv]}"
        # And on C as well.
        for conv in reversed(ordered):
            result = await turn(cluster.c, token, conv)
            assert result.headers["x-arona-backend"] == first[conv], conv


async def test_a_fallback_pin_set_on_b_applies_on_c(cluster: Cluster, tenant: Tenant) -> None:
    token = await runtime_token(cluster.a, tenant)
    main_model, fallback_model = unique("main-model"), unique("fallback-model")
    async with (
        backends(cluster, main_model, 1) as (main,),
        backends(cluster, fallback_model, 1) as (fallback,),
    ):
        fallback_profile = await create_profile(cluster, fallback_model)
        main_profile = await create_profile(cluster, main_model, fallbackProfileId=fallback_profile)
        conv = await conversation(cluster.a, token, main_profile)
        result = await turn(cluster.a, token, conv)
        assert result.headers["x-arona-profile"] == main_profile
        assert result.headers["x-arona-failover"] == "none"

        # The main backend cuts its next stream mid-flight: B pins the conversation.
        main.control.drop_stream_after = 2
        result = await turn(cluster.b, token, conv)
        assert result.status == 200
        assert result.errors, result.events
        assert fallback_profile in result.errors[0]["error"]["message"], result.errors
        main.control.drop_stream_after = None

        pins = await cluster.a.get("/api/admin/pins", headers=ADMIN)
        assert pins.status_code == 200, pins.text
        mine = [p for p in pins.json()["items"] if p["conversationId"] == conv]
        assert len(mine) == 1, pins.json()
        assert (mine[0]["fromProfileId"], mine[0]["toProfileId"]) == (
            main_profile,
            fallback_profile,
        )

        # The main backend is fine again, yet on C the pin holds.
        streams_before = main.stats.streams
        result = await turn(cluster.c, token, conv)
        assert result.status == 200, result.events
        assert result.done, result.events
        assert not result.errors, result.events
        assert result.headers["x-arona-profile"] == fallback_profile
        assert result.headers["x-arona-backend"] == fallback.name
        assert result.headers["x-arona-failover"] == f"pin; from={main_profile}"
        assert result.text == f"Hello from {fallback.name}"
        assert main.stats.streams == streams_before

        # Cleared on A, gone on C.
        response = await cluster.a.delete(f"/api/admin/pins/{conv}", headers=ADMIN)
        assert response.status_code == 204, response.text
        result = await turn(cluster.c, token, conv)
        assert result.headers["x-arona-profile"] == main_profile
        assert result.headers["x-arona-backend"] == main.name
