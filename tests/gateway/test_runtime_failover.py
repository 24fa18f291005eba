"""Failover on the runtime chat: latency-based (global, non-sticky, along a preference
chain) and disconnect-based (a sticky pin per conversation, cleared by an admin)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from app.lib.settings import Settings
from tests.support.api import eventually
from tests.support.gateway import ADMIN, GatewayEnv
from tests.support.live_server import live_server
from tests.support.runtime import RuntimeEnv, runtime_env
from tests.support.settings import AppFactory, with_settings

MODEL = "pool-model"
SLOW_SECONDS = 0.4
THRESHOLD_MS = 150
WINDOW_SECONDS = 4.0


@pytest.fixture(scope="module")
def gateway_settings(gateway_settings: Settings) -> Settings:
    # A short window so recovery is observable; two samples make a verdict.
    return with_settings(
        gateway_settings, failover_window_seconds=WINDOW_SECONDS, failover_min_samples=2
    )


@pytest.fixture
async def rt(env: GatewayEnv) -> AsyncIterator[RuntimeEnv]:
    runtime = await runtime_env(env)
    yield runtime
    await runtime.cleanup()
    await set_switch(runtime, True)


@dataclass
class Pool:
    smart: str
    general: str
    smart_fake: Any
    general_fake: Any
    base: str
    """The cheap profile (backends tagged ``general``)."""
    top: str
    """The smart profile: tags ``smart``, falls back and fails over to ``base``."""


async def smart_pool(rt: RuntimeEnv, **top_fields: Any) -> Pool:
    (smart, smart_fake), (general, general_fake) = await rt.pool(MODEL, [["smart"], ["general"]])
    base = await rt.profile(MODEL, tags=["general"])
    fields: dict[str, Any] = {
        "tags": ["smart"],
        "slowThresholdMs": THRESHOLD_MS,
        "failoverChain": [base],
        "fallbackProfileId": base,
        **top_fields,
    }
    top = await rt.profile(MODEL, **fields)
    return Pool(smart, general, smart_fake, general_fake, base, top)


async def set_switch(rt: RuntimeEnv, enabled: bool) -> dict[str, Any]:
    response = await rt.http.put("/api/admin/failover", json={"enabled": enabled}, headers=ADMIN)
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


async def failover_status(rt: RuntimeEnv, profile: str) -> dict[str, Any]:
    response = await rt.http.get("/api/admin/failover", headers=ADMIN)
    assert response.status_code == 200, response.text
    [status] = [p for p in response.json()["profiles"] if p["profileId"] == profile]
    return status  # type: ignore[no-any-return]


async def make_slow(rt: RuntimeEnv, pool: Pool, conversation: str) -> None:
    pool.smart_fake.control.delay_seconds = SLOW_SECONDS
    for _ in range(2):
        result = await rt.chat(conversation)
        assert result.headers["x-arona-profile"] == pool.top
        assert result.headers["x-arona-failover"] == "none"


# ------------------------------------------------------------------ latency failover


async def test_slow_profile_redirects_along_its_chain_then_recovers(rt: RuntimeEnv) -> None:
    pool = await smart_pool(rt)
    conversation = await rt.conversation(modelProfileId=pool.top)
    await make_slow(rt, pool, conversation)

    redirected = await rt.chat(conversation)
    assert redirected.status == 200
    assert redirected.headers["x-arona-profile"] == pool.base
    assert redirected.headers["x-arona-backend"] == pool.general
    assert redirected.headers["x-arona-failover"] == f"latency; from={pool.top}"
    status = await failover_status(rt, pool.top)
    assert status["state"] == "redirecting"
    assert status["target"] == pool.base
    assert status["typicalTtftMs"] > THRESHOLD_MS

    # The slow profile gets no traffic now; its samples age out and traffic returns.
    pool.smart_fake.control.delay_seconds = 0
    await asyncio.sleep(WINDOW_SECONDS + 0.2)
    back = await rt.chat(conversation)
    assert back.headers["x-arona-profile"] == pool.top
    assert back.headers["x-arona-failover"] == "none"
    assert (await failover_status(rt, pool.top))["state"] == "ok"


async def test_slow_v1_streams_to_the_base_model_redirect_the_profile(rt: RuntimeEnv) -> None:
    pool = await smart_pool(rt)
    pool.smart_fake.control.delay_seconds = SLOW_SECONDS
    sdk = rt.gw.sdk()

    # /v1 knows no profiles: its streams for the model land on either backend, and
    # the slow ones are the top profile's evidence (its pool is the ``smart`` one).
    async def judged_slow() -> bool:
        stream = await sdk.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}], stream=True
        )
        [chunk async for chunk in stream]
        status = await failover_status(rt, pool.top)
        return bool(status["state"] == "redirecting")

    await eventually(judged_slow, within=20, interval=0)
    assert pool.smart_fake.stats.streams >= 2
    conversation = await rt.conversation(modelProfileId=pool.top)
    redirected = await rt.chat(conversation)
    assert redirected.headers["x-arona-profile"] == pool.base
    assert redirected.headers["x-arona-failover"] == f"latency; from={pool.top}"


async def test_a_chained_profile_without_a_threshold_is_judged_by_the_default(
    rt: RuntimeEnv,
) -> None:
    pool = await smart_pool(rt, slowThresholdMs=None)
    status = await failover_status(rt, pool.top)
    assert status["slowThresholdMs"] == 10_000  # ARONA_FAILOVER_SLOW_THRESHOLD_MS
    assert status["state"] == "ok"


async def test_status_changes_are_published_on_the_event_bus(rt: RuntimeEnv) -> None:
    pool = await smart_pool(rt)
    conversation = await rt.conversation(modelProfileId=pool.top)
    bus = rt.gw.resources.event_bus
    seen: list[dict[str, Any]] = []

    async def listen(ready: asyncio.Event) -> None:
        async with bus.subscribe("failover") as events:
            ready.set()
            async for event in events:
                if event.get("profileId") == pool.top:
                    seen.append(event)

    ready = asyncio.Event()
    listener = asyncio.create_task(listen(ready))
    try:
        await ready.wait()
        await make_slow(rt, pool, conversation)

        async def redirecting_announced() -> bool:
            return any(e["kind"] == "status" and e["state"] == "redirecting" for e in seen)

        await eventually(redirecting_announced, within=5)
        [event] = [e for e in seen if e["state"] == "redirecting"]
        assert event["target"] == pool.base
        assert isinstance(event["since"], float)
    finally:
        listener.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await listener


async def test_priority_conversations_are_never_redirected(rt: RuntimeEnv) -> None:
    pool = await smart_pool(rt)
    await make_slow(rt, pool, await rt.conversation(modelProfileId=pool.top))
    urgent = await rt.conversation(modelProfileId=pool.top, priority=True)

    result = await rt.chat(urgent)

    assert result.headers["x-arona-profile"] == pool.top
    assert result.headers["x-arona-failover"] == "none"


async def test_the_admin_switch_turns_redirection_off_and_on(rt: RuntimeEnv) -> None:
    pool = await smart_pool(rt)
    conversation = await rt.conversation(modelProfileId=pool.top)
    await make_slow(rt, pool, conversation)

    body = await set_switch(rt, False)
    assert body["enabled"] is False
    off = await rt.chat(conversation)
    assert off.headers["x-arona-profile"] == pool.top
    assert (await failover_status(rt, pool.top))["state"] == "slow"

    await set_switch(rt, True)
    on = await rt.chat(conversation)
    assert on.headers["x-arona-profile"] == pool.base


async def test_unavailable_links_are_skipped(rt: RuntimeEnv) -> None:
    nowhere = await rt.profile("model-nobody-serves")
    (_, smart_fake), (general, _) = await rt.pool(MODEL, [["smart"], ["general"]])
    base = await rt.profile(MODEL, tags=["general"])
    top = await rt.profile(
        MODEL, tags=["smart"], slowThresholdMs=THRESHOLD_MS, failoverChain=[nowhere, base]
    )
    conversation = await rt.conversation(modelProfileId=top)
    smart_fake.control.delay_seconds = SLOW_SECONDS
    for _ in range(2):
        await rt.chat(conversation)

    result = await rt.chat(conversation)

    assert result.headers["x-arona-profile"] == base
    assert result.headers["x-arona-backend"] == general


async def test_admin_endpoints_need_an_admin(rt: RuntimeEnv) -> None:
    for method, path in (("GET", "/api/admin/failover"), ("GET", "/api/admin/pins")):
        response = await rt.http.request(method, path, headers=rt.gw.user_headers)
        assert response.status_code == 403, response.text
    response = await rt.http.put("/api/admin/failover", json={"enabled": "yes"}, headers=ADMIN)
    assert response.status_code == 400


# ------------------------------------------------------------- sticky disconnect pins


async def test_a_stream_dropped_upstream_pins_the_conversation_to_the_fallback(
    rt: RuntimeEnv,
) -> None:
    pool = await smart_pool(rt)
    conversation = await rt.conversation(modelProfileId=pool.top)
    pool.smart_fake.control.drop_stream_after = 2

    dropped = await rt.chat(conversation)

    assert dropped.status == 200
    assert dropped.done
    [error] = dropped.errors
    assert f"pinned to profile {pool.base}" in error["error"]["message"]
    [pin] = [p for p in await rt.pins() if p["conversationId"] == conversation]
    assert pin["fromProfileId"] == pool.top
    assert pin["toProfileId"] == pool.base
    assert pin["reason"] == "upstream_dropped"
    assert pin["backend"] == pool.smart
    # Only the user turn is stored: the assistant turn never completed.
    assert [m["role"] for m in await rt.messages(conversation)] == ["user"]

    pool.smart_fake.control.drop_stream_after = None
    pinned = await rt.chat(conversation)
    assert pinned.headers["x-arona-profile"] == pool.base
    assert pinned.headers["x-arona-failover"] == f"pin; from={pool.top}"
    conversation_view = await rt.http.get(
        f"/api/runtime/conversations/{conversation}", headers=rt.headers
    )
    assert conversation_view.json()["fallbackPin"]["toProfileId"] == pool.base

    cleared = await rt.http.delete(f"/api/admin/pins/{conversation}", headers=ADMIN)
    assert cleared.status_code == 204
    free = await rt.chat(conversation)
    assert free.headers["x-arona-profile"] == pool.top
    assert free.headers["x-arona-failover"] == "none"


async def leave_after_first_bytes(rt: RuntimeEnv, pool: Pool, conversation: str) -> None:
    """A turn on a long, slow stream whose runtime goes away after the first bytes."""
    pool.smart_fake.control.chunks = 20
    pool.smart_fake.control.chunk_delay_seconds = 0.1
    body = {"conversationId": conversation, "messages": [{"role": "user", "content": "long"}]}
    async with rt.http.stream("POST", "/api/runtime/chat", json=body, headers=rt.headers) as r:
        assert r.status_code == 200
        async for _ in r.aiter_bytes():
            break


async def test_a_runtime_that_disconnects_mid_stream_pins_too(rt: RuntimeEnv) -> None:
    pool = await smart_pool(rt)
    conversation = await rt.conversation(modelProfileId=pool.top)
    await leave_after_first_bytes(rt, pool, conversation)

    async def pinned() -> bool:
        return any(
            p["conversationId"] == conversation and p["reason"] == "client_disconnected"
            for p in await rt.pins()
        )

    await eventually(pinned, within=5)


async def test_a_priority_conversation_that_drops_is_not_pinned(rt: RuntimeEnv) -> None:
    pool = await smart_pool(rt)
    urgent = await rt.conversation(modelProfileId=pool.top, priority=True)
    pool.smart_fake.control.drop_stream_after = 2

    dropped = await rt.chat(urgent)

    assert dropped.done
    [error] = dropped.errors
    assert "priority conversation: not pinned" in error["error"]["message"]
    assert all(p["conversationId"] != urgent for p in await rt.pins())
    pool.smart_fake.control.drop_stream_after = None
    again = await rt.chat(urgent)
    assert again.headers["x-arona-profile"] == pool.top
    assert again.headers["x-arona-failover"] == "none"


async def test_a_priority_conversation_whose_runtime_leaves_is_not_pinned(
    rt: RuntimeEnv,
) -> None:
    pool = await smart_pool(rt)
    urgent = await rt.conversation(modelProfileId=pool.top, priority=True)
    await leave_after_first_bytes(rt, pool, urgent)

    # The drop is metered (499) once the relay noticed; it must still pin nothing.
    async def metered() -> bool:
        return any(
            row.conversation_id == urgent and row.status == 499 for row in await rt.gw.usage_rows()
        )

    await eventually(metered, within=5)
    assert all(p["conversationId"] != urgent for p in await rt.pins())


async def test_a_pin_set_before_a_conversation_became_priority_does_not_move_it(
    rt: RuntimeEnv,
) -> None:
    pool = await smart_pool(rt)
    conversation = await rt.conversation(modelProfileId=pool.top)
    pool.smart_fake.control.drop_stream_after = 1
    await rt.chat(conversation)
    pool.smart_fake.control.drop_stream_after = None
    assert any(p["conversationId"] == conversation for p in await rt.pins())

    patched = await rt.http.patch(
        f"/api/runtime/conversations/{conversation}", json={"priority": True}, headers=rt.headers
    )
    assert patched.status_code == 200, patched.text
    result = await rt.chat(conversation)
    assert result.headers["x-arona-profile"] == pool.top
    assert result.headers["x-arona-failover"] == "none"


async def test_a_profile_without_fallback_is_not_pinned(rt: RuntimeEnv) -> None:
    [(_, fake)] = await rt.pool("plain-model", [[]])
    profile = await rt.profile("plain-model")
    conversation = await rt.conversation(modelProfileId=profile)
    fake.control.drop_stream_after = 1

    dropped = await rt.chat(conversation)

    assert dropped.errors
    assert dropped.done
    assert all(p["conversationId"] != conversation for p in await rt.pins())


async def test_a_pin_holds_on_another_replica_and_after_a_restart(
    rt: RuntimeEnv, gateway_settings: Settings, make_app: AppFactory
) -> None:
    pool = await smart_pool(rt)
    conversation = await rt.conversation(modelProfileId=pool.top)
    pool.smart_fake.control.drop_stream_after = 1
    await rt.chat(conversation)
    pool.smart_fake.control.drop_stream_after = None

    async with contextlib.AsyncExitStack() as stack:
        url = await stack.enter_async_context(live_server(make_app(gateway_settings)))
        other = await stack.enter_async_context(httpx.AsyncClient(base_url=url, timeout=30))

        async def served_by_fallback() -> bool:
            response = await other.post(
                "/api/runtime/chat",
                json={
                    "conversationId": conversation,
                    "messages": [{"role": "user", "content": "again"}],
                },
                headers=rt.headers,
            )
            return bool(
                response.status_code == 200
                and response.headers["x-arona-profile"] == pool.base
                and response.headers["x-arona-failover"] == f"pin; from={pool.top}"
            )

        # The new replica probes its backends first (fail-closed until then).
        await eventually(served_by_fallback, within=5, interval=0.1)
