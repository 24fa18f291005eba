"""``evernight://node/service`` backends end to end: a fake bridge agent that opens real
TCP forwards to a real fake upstream, a live Arona, and the ``openai`` SDK as client."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest

from app.fakes.engine_echo import EchoEngine
from app.fakes.evernight_bridge import FakeEvernightBridge
from app.fakes.openai_upstream import FakeOpenAI
from app.fakes.serve import serve_asgi
from app.lib.ports import free_port
from app.lib.settings import Settings
from tests.support.api import eventually
from tests.support.gateway import ADMIN, GatewayEnv, open_env, unique
from tests.support.settings import AppFactory, with_settings

KEEPALIVE_SECONDS = 0.2
NODE = "gpu-node-1"


@dataclass
class Bridged:
    env: GatewayEnv
    bridge: FakeEvernightBridge
    upstream: FakeOpenAI
    service: str

    @property
    def url(self) -> str:
        return f"evernight://{NODE}/{self.service}"

    def local_url(self) -> str:
        return f"http://127.0.0.1:{self.bridge.local_port(NODE, self.service)}"


def bridged_settings(settings: Settings, bridge_url: str) -> Settings:
    return with_settings(
        settings, evernight_url=bridge_url, evernight_keepalive_seconds=KEEPALIVE_SECONDS
    )


@pytest.fixture
async def bridged(gateway_settings: Settings, make_app: AppFactory) -> AsyncIterator[Bridged]:
    async with contextlib.AsyncExitStack() as stack:
        upstream = FakeOpenAI(unique("tunnelled"), models=["tunnel-model"])
        upstream_url = await stack.enter_async_context(serve_asgi(upstream))
        bridge = FakeEvernightBridge()
        service = unique("llm")
        port = int(upstream_url.rsplit(":", 1)[1])
        bridge.publish(NODE, service, "127.0.0.1", port)
        bridge_url = await stack.enter_async_context(bridge.running())
        env = await open_env(bridged_settings(gateway_settings, bridge_url), make_app, stack)
        yield Bridged(env=env, bridge=bridge, upstream=upstream, service=service)


async def test_registered_evernight_backend_routes_through_the_tunnel(bridged: Bridged) -> None:
    name = unique("bridged")
    body = await bridged.env.register(name, bridged.url)
    # The stored URL stays the evernight one; the tunnel port is what this replica uses.
    assert body["url"] == bridged.url
    assert body["resolved_url"] == bridged.local_url()
    assert bridged.bridge.calls[-1]["params"] == {"node": NODE, "service": bridged.service}

    reply = await bridged.env.sdk().chat.completions.create(
        model="tunnel-model", messages=[{"role": "user", "content": "hi"}]
    )
    assert reply.choices[0].message.content == f"Hello from {bridged.upstream.name}"
    assert (await bridged.env.backend(name))["advertised_models"] == ["tunnel-model"]


async def test_a_moved_tunnel_is_followed_and_in_flight_streams_finish(bridged: Bridged) -> None:
    name = unique("bridged")
    await bridged.env.register(name, bridged.url)
    old_port = bridged.bridge.local_port(NODE, bridged.service)
    bridged.upstream.control.chunk_delay_seconds = 0.05
    bridged.upstream.control.chunks = 10
    stream = await bridged.env.sdk().chat.completions.create(
        model="tunnel-model", messages=[{"role": "user", "content": "hi"}], stream=True
    )
    pieces = []
    iterator = stream.__aiter__()
    first = await iterator.__anext__()
    pieces.append(first.choices[0].delta.content or "" if first.choices else "")

    new_port = await bridged.bridge.move(NODE, bridged.service)
    assert new_port != old_port
    assert old_port is not None
    old_connections = bridged.bridge.accepted[old_port]

    async def followed() -> bool:
        return bool(
            (await bridged.env.backend(name))["resolved_url"] == f"http://127.0.0.1:{new_port}"
        )

    await eventually(followed, within=5.0)
    # Rebuilt as the same upstream: health and breaker carried over, no probe gap.
    state = bridged.env.resources.backend_registry.get(name)
    assert state is not None
    assert state.health.healthy

    async for chunk in iterator:
        if chunk.choices:
            pieces.append(chunk.choices[0].delta.content or "")
    assert "".join(pieces) == f"Hello from {bridged.upstream.name}"

    bridged.upstream.control.chunk_delay_seconds = 0.0
    reply = await bridged.env.sdk().chat.completions.create(
        model="tunnel-model", messages=[{"role": "user", "content": "again"}]
    )
    assert reply.choices[0].message.content == f"Hello from {bridged.upstream.name}"
    # New calls go through the new port; the old one took no connection after the move.
    assert bridged.bridge.accepted.get(new_port, 0) >= 1
    assert bridged.bridge.accepted[old_port] == old_connections


@pytest.mark.parametrize("failure", ["bridge-down", "unknown-service"])
async def test_an_unresolvable_url_is_refused_at_registration(
    bridged: Bridged, failure: str
) -> None:
    url = bridged.url
    if failure == "bridge-down":
        bridged.bridge.down = True
    else:
        url = f"evernight://{NODE}/nothing-here"
    await _assert_refused(bridged.env, url)


async def test_a_url_is_refused_when_no_agent_listens(
    gateway_settings: Settings, make_app: AppFactory
) -> None:
    settings = bridged_settings(gateway_settings, f"ws://127.0.0.1:{free_port()}/ws")
    async with contextlib.AsyncExitStack() as stack:
        env = await open_env(settings, make_app, stack)
        await _assert_refused(env, f"evernight://{NODE}/llm")


async def _assert_refused(env: GatewayEnv, url: str) -> None:
    name = unique("refused")
    response = await env.http.post(
        "/api/admin/backends",
        json={"name": name, "type": "external", "url": url},
        headers=ADMIN,
    )
    assert response.status_code == 502, response.text
    error = response.json()["error"]
    assert error["code"] == "evernight_unreachable"
    assert error["param"] == "url"
    assert (await env.http.get(f"/api/admin/backends/{name}", headers=ADMIN)).status_code == 404


@pytest.mark.parametrize(
    "url",
    [
        "evernight://gpu-node-1",
        "evernight://gpu-node-1/",
        "evernight://gpu-node-1:3000/llm",
        "evernight://user:pw@gpu-node-1/llm",
        "evernight://gpu-node-1/llm?x=1",
        "evernight://bad node/llm",
    ],
)
async def test_a_malformed_evernight_url_is_a_400(env: GatewayEnv, url: str) -> None:
    response = await env.http.post(
        "/api/admin/backends",
        json={"name": unique("bad"), "type": "external", "url": url},
        headers=ADMIN,
    )
    assert response.status_code == 400, response.text
    assert response.json()["error"]["code"] == "invalid_url"


async def test_a_restart_resolves_again_and_a_late_tunnel_is_picked_up(
    bridged: Bridged, gateway_settings: Settings, make_app: AppFactory
) -> None:
    name = unique("bridged")
    await bridged.env.register(name, bridged.url)

    # A second process on the same database, started while the bridge is refusing:
    # the backend is stored but cannot run there yet.
    bridged.bridge.down = True
    async with contextlib.AsyncExitStack() as stack:
        other = await open_env(
            bridged_settings(gateway_settings, bridged.bridge.url), make_app, stack
        )
        body = await other.backend(name)
        assert body["url"] == bridged.url
        assert body["resolved_url"] is None
        assert other.resources.backend_registry.get(name) is None

        # The keepalive keeps asking; once the bridge answers the backend loads.
        bridged.bridge.down = False
        await other.wait_health(name, "healthy", within=5.0)
        assert (await other.backend(name))["resolved_url"] == bridged.local_url()
        reply = await other.sdk().chat.completions.create(
            model="tunnel-model", messages=[{"role": "user", "content": "hi"}]
        )
        assert reply.choices[0].message.content == f"Hello from {bridged.upstream.name}"


async def test_keepalive_keeps_a_working_tunnel_when_the_bridge_hiccups(bridged: Bridged) -> None:
    name = unique("bridged")
    await bridged.env.register(name, bridged.url)
    calls = len(bridged.bridge.calls)
    bridged.bridge.down = True

    async def asked_again() -> bool:
        return len(bridged.bridge.calls) >= calls + 2

    await eventually(asked_again, within=5.0)
    await asyncio.sleep(KEEPALIVE_SECONDS)
    body = await bridged.env.backend(name)
    assert body["resolved_url"] == bridged.local_url()
    assert body["health"]["status"] == "healthy"


async def test_an_engine_backend_rides_a_tunnel_as_websocket(bridged: Bridged) -> None:
    async with EchoEngine("tunnelled-engine", models=("echo-tunnel",)) as engine:
        service = unique("engine")
        bridged.bridge.publish(NODE, service, "127.0.0.1", int(engine.url.rsplit(":", 1)[1]))
        name = unique("bridged-engine")
        body = await bridged.env.register(name, f"evernight://{NODE}/{service}", type="engine")
        port = bridged.bridge.local_port(NODE, service)
        assert body["resolved_url"] == f"ws://127.0.0.1:{port}"
        reply = await bridged.env.sdk().chat.completions.create(
            model="echo-tunnel", messages=[{"role": "user", "content": "through the bridge"}]
        )
        assert "through the bridge" in (reply.choices[0].message.content or "")
        assert engine.stats.handshakes >= 1
