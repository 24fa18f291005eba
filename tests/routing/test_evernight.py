"""``evernight://`` URLs: parsing, the bridge client against real WebSocket servers, and
how the tunnel table follows ports."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable

import pytest
from websockets.asyncio.server import ServerConnection, serve

from app.fakes.evernight_bridge import FakeEvernightBridge
from app.lib.ports import free_port
from app.routing.evernight import (
    BridgeClient,
    BridgeError,
    EvernightAddress,
    EvernightTunnels,
    EvernightUrlError,
    is_evernight,
    parse_evernight,
)


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("evernight://gpu-1/llm", EvernightAddress("gpu-1", "llm")),
        ("evernight://gpu-1/llm/", EvernightAddress("gpu-1", "llm")),
        ("EVERNIGHT://gpu-1/llm", EvernightAddress("gpu-1", "llm")),
        ("evernight://gpu-1/llm/v1", EvernightAddress("gpu-1", "llm", "/v1")),
        ("evernight://node.lab/engine/ws/", EvernightAddress("node.lab", "engine", "/ws")),
    ],
)
def test_parse(url: str, expected: EvernightAddress) -> None:
    assert is_evernight(url)
    assert parse_evernight(url) == expected


@pytest.mark.parametrize(
    "url",
    [
        "evernight://gpu-1",
        "evernight://gpu-1/",
        "evernight:///llm",
        "evernight://gpu-1:3000/llm",
        "evernight://u:p@gpu-1/llm",
        "evernight://gpu-1/llm?x=1",
        "evernight://gpu-1/llm#f",
        "evernight://gpu 1/llm",
        "evernight://gpu-1/-llm",
        "http://gpu-1/llm",
    ],
)
def test_parse_refuses(url: str) -> None:
    with pytest.raises(EvernightUrlError):
        parse_evernight(url)


def test_local_url_follows_the_kind() -> None:
    address = EvernightAddress("gpu-1", "llm", "/v1")
    assert address.local_url(4100, "external") == "http://127.0.0.1:4100/v1"
    assert address.local_url(4100, "engine") == "ws://127.0.0.1:4100/v1"


@pytest.fixture
async def bridge() -> AsyncIterator[FakeEvernightBridge]:
    fake = FakeEvernightBridge()
    fake.publish("gpu-1", "llm", "127.0.0.1", 9)
    async with fake.running():
        yield fake


async def test_bridge_client_answers_the_tunnel_port(bridge: FakeEvernightBridge) -> None:
    client = BridgeClient(bridge.url)
    port = await client.connect("gpu-1", "llm")
    assert port == bridge.local_port("gpu-1", "llm")
    assert await client.connect("gpu-1", "llm") == port  # the same tunnel, reused
    assert bridge.calls[0]["method"] == "Bridge.Connect"
    assert bridge.calls[0]["params"] == {"node": "gpu-1", "service": "llm"}


async def test_bridge_client_reports_the_agents_refusal(bridge: FakeEvernightBridge) -> None:
    with pytest.raises(BridgeError, match="could not reach other on gpu-1: no service"):
        await BridgeClient(bridge.url).connect("gpu-1", "other")
    bridge.down = True
    with pytest.raises(BridgeError, match="bridge is down"):
        await BridgeClient(bridge.url).connect("gpu-1", "llm")


async def test_bridge_client_with_no_agent_listening() -> None:
    with pytest.raises(BridgeError, match="unreachable"):
        await BridgeClient(f"ws://127.0.0.1:{free_port()}/ws").connect("gpu-1", "llm")


@contextlib.asynccontextmanager
async def scripted_agent(answer: Callable[[str], list[str]]) -> AsyncIterator[str]:
    """A WebSocket server that answers each frame with the frames ``answer`` gives."""

    async def session(ws: ServerConnection) -> None:
        async for frame in ws:
            for reply in answer(str(frame)):
                await ws.send(reply)

    async with serve(session, "127.0.0.1", 0) as server:
        yield f"ws://127.0.0.1:{server.sockets[0].getsockname()[1]}/ws"


@pytest.mark.parametrize(
    ("replies", "message"),
    [
        (["not json"], "malformed reply"),
        (['{"jsonrpc":"2.0","id":1,"result":{}}'], "without a valid local_port"),
        (['{"jsonrpc":"2.0","id":1,"result":{"local_port":"80"}}'], "valid local_port"),
        (['{"jsonrpc":"2.0","id":1,"result":{"local_port":70000}}'], "valid local_port"),
        (['{"jsonrpc":"2.0","id":1,"result":{"local_port":true}}'], "valid local_port"),
        ([], "did not answer"),
    ],
)
async def test_bridge_client_refuses_bad_answers(replies: list[str], message: str) -> None:
    async with scripted_agent(lambda _: replies) as url:
        with pytest.raises(BridgeError, match=message):
            await BridgeClient(url, timeout=0.5).connect("gpu-1", "llm")


async def test_bridge_client_skips_chatter_before_its_reply() -> None:
    replies = [
        '{"jsonrpc":"2.0","method":"Bridge.Status","params":{}}',
        '{"jsonrpc":"2.0","id":99,"result":{"local_port":1}}',
        '{"jsonrpc":"2.0","id":1,"result":{"local_port":4242}}',
    ]
    async with scripted_agent(lambda _: replies) as url:
        assert await BridgeClient(url).connect("gpu-1", "llm") == 4242


class ScriptedPorts:
    """A port lookup whose answers the test sets (the table's logic, not a transport)."""

    def __init__(self) -> None:
        self.ports: dict[tuple[str, str], int | None] = {}
        self.asked: list[tuple[str, str]] = []

    async def __call__(self, node: str, service: str) -> int:
        self.asked.append((node, service))
        port = self.ports.get((node, service))
        if port is None:
            raise BridgeError("no tunnel")
        return port


async def test_tunnels_name_the_backends_whose_port_moved() -> None:
    lookup = ScriptedPorts()
    tunnels = EvernightTunnels(lookup)
    llm, embed = EvernightAddress("gpu-1", "llm"), EvernightAddress("gpu-2", "embed")
    lookup.ports = {llm.tunnel: 4000, embed.tunnel: 5000}
    tunnels.track("a", llm)
    tunnels.track("b", llm)
    tunnels.track("c", embed)
    assert await tunnels.resolve(llm) == 4000
    assert await tunnels.resolve(embed) == 5000
    assert await tunnels.resolve(llm) == 4000
    assert lookup.asked == [llm.tunnel, embed.tunnel]  # known ports are not asked again

    assert await tunnels.refresh() == []
    lookup.ports[llm.tunnel] = 4001
    assert await tunnels.refresh() == ["a", "b"]
    assert tunnels.port_of(llm) == 4001

    # A bridge that cannot answer leaves the last port in place.
    lookup.ports[embed.tunnel] = None
    assert await tunnels.refresh() == []
    assert tunnels.port_of(embed) == 5000

    tunnels.untrack("c")
    assert tunnels.port_of(embed) is None
    assert set(tunnels.riders()) == {"a", "b"}


async def test_a_tunnel_that_comes_up_late_is_named_once() -> None:
    lookup = ScriptedPorts()
    tunnels = EvernightTunnels(lookup)
    llm = EvernightAddress("gpu-1", "llm")
    tunnels.track("a", llm)
    with pytest.raises(BridgeError):
        await tunnels.resolve(llm)
    assert await tunnels.refresh() == []
    lookup.ports[llm.tunnel] = 4000
    assert await tunnels.refresh() == ["a"]
    assert await tunnels.refresh() == []
