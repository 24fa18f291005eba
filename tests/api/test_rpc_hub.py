"""The live notification hub: ordering and replay rules, slow clients, and releasing
every subscription when its connection ends (in process and over real sockets)."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest
from redis.asyncio import Redis
from websockets.exceptions import ConnectionClosed

from app.domain.rpc.live import LOST, OVERFLOW, FeedUnavailableError, LiveHub
from app.domain.rpc.sidecar import PING, sse_frame, stream_frames
from app.domain.rpc.socket import ws_notification
from app.domain.video.events import CHANNEL, notification_of
from app.lib.events.memory import MemoryEventBus
from app.lib.events.redis import RedisEventBus
from app.lib.settings import Settings
from tests.support.api import eventually
from tests.support.rpc import (
    Replica,
    RpcSocket,
    call,
    read_sse,
    result,
    rpc_socket,
    serve,
    video_setup,
)
from tests.support.settings import REDIS_URL, AppFactory, with_settings
from tests.support.video import Minimax, minimax, video_pg_settings

__all__ = ["minimax", "video_pg_settings"]


def _event(stream_id: str, status: str, progress: int = 0, **extra: Any) -> dict[str, Any]:
    return {
        "kind": "video",
        "job_id": "vid_" + "a" * 32,
        "stream_id": stream_id,
        "project_id": None,
        "user_id": None,
        "status": status,
        "progress": progress,
        "result": extra.get("result"),
        "cost": extra.get("cost"),
        "error": extra.get("error"),
    }


async def _drain(queue: asyncio.Queue[tuple[bytes, bool]], wait: float = 0.05) -> list[bytes]:
    await asyncio.sleep(wait)
    out = []
    while not queue.empty():
        out.append(queue.get_nowait()[0])
    return out


def _encode(method: str, params: dict[str, Any]) -> bytes:
    return f"{method}:{params.get('status', '')}:{params.get('progress', '')}".encode()


async def test_held_events_replay_and_forward_only_order() -> None:
    bus = MemoryEventBus()
    hub = LiveHub(bus, CHANNEL, notification_of)
    async with hub.subscriber(capacity=16, encode=_encode) as sub:
        sub.watch("s1")
        # Events while held are kept (the newest only), not sent.
        await bus.publish(CHANNEL, _event("s1", "running", 10))
        await bus.publish(CHANNEL, _event("s1", "running", 20))
        await bus.publish(CHANNEL, _event("other", "running", 50))
        assert await _drain(sub.queue) == []
        # A replay read before those events is older: the held one wins.
        sub.release("s1", ("video.progress", _event("s1", "running", 5)))
        assert await _drain(sub.queue) == [b"video.progress:running:20"]
        # Repeats and older states are dropped; newer ones pass.
        await bus.publish(CHANNEL, _event("s1", "running", 20))
        await bus.publish(CHANNEL, _event("s1", "queued", 0))
        await bus.publish(CHANNEL, _event("s1", "running", 30))
        assert await _drain(sub.queue) == [b"video.progress:running:30"]
        # The terminal event goes out once and the stream is forgotten.
        await bus.publish(CHANNEL, _event("s1", "done", 100, result={"url": "u"}, cost=1.0))
        await bus.publish(CHANNEL, _event("s1", "failed", 100, error="late"))
        assert await _drain(sub.queue) == [b"video.done::"]
        assert not sub.is_watching("s1")
        assert hub.watched_streams == 0
        # A terminal replay of a held stream ends it at once.
        sub.watch("s2")
        sub.release("s2", notification_of(_event("s2", "cancelled", 40)))
        queued = sub.queue.get_nowait()
        assert queued == (b"video.failed::", True)
    assert hub.subscribers == 0
    await bus.close()


async def test_a_slow_subscriber_is_ended_without_holding_up_the_others() -> None:
    bus = MemoryEventBus()
    hub = LiveHub(bus, CHANNEL, notification_of)
    async with (
        hub.subscriber(capacity=3, encode=_encode) as slow,
        hub.subscriber(capacity=100, encode=_encode) as fast,
    ):
        for sub in (slow, fast):
            sub.watch("s")
            sub.release("s", None)
        for progress in range(1, 11):
            await bus.publish(CHANNEL, _event("s", "running", progress))
        await asyncio.sleep(0.05)
        assert slow.end_reason == OVERFLOW
        assert slow.ended.is_set()
        assert hub.subscribers == 1  # the slow one let go of the hub at once
        assert len(await _drain(fast.queue)) == 10
        await bus.publish(CHANNEL, _event("s", "done", 100))
        assert await _drain(fast.queue) == [b"video.done::"]
    assert hub.subscribers == 0
    assert hub.watched_streams == 0
    await bus.close()


async def test_the_hub_follows_the_channel_only_while_someone_listens() -> None:
    prefix = f"test:{uuid.uuid4().hex}:events:"
    redis = Redis.from_url(REDIS_URL)
    bus = RedisEventBus(redis, prefix)
    hub = LiveHub(bus, CHANNEL, notification_of)
    channel = prefix + CHANNEL

    async def listeners() -> int:
        counts = await redis.pubsub_numsub(channel)
        return int(counts[0][1])

    try:
        assert await listeners() == 0
        async with hub.subscriber(capacity=8, encode=_encode) as first:
            async with hub.subscriber(capacity=8, encode=_encode) as second:
                # Two subscribers, one bus subscription.
                assert await listeners() == 1
                second.watch("s")
                second.release("s", None)
                await bus.publish(CHANNEL, _event("s", "running", 7))
                async with asyncio.timeout(5):
                    message = await second.next_message()
                assert message == (b"video.progress:running:7", False)
            assert first.end_reason is None
            assert await listeners() == 1
        await eventually(lambda: _is(listeners, 0), within=5)
        # And it starts again for the next one.
        async with hub.subscriber(capacity=8, encode=_encode):
            assert await listeners() == 1
        await eventually(lambda: _is(listeners, 0), within=5)
    finally:
        await redis.aclose()


async def _is(count: Any, expected: int) -> bool:
    return bool(await count() == expected)


async def test_a_lost_bus_ends_every_subscriber_and_a_dead_one_refuses_new_ones() -> None:
    bus = MemoryEventBus()
    hub = LiveHub(bus, CHANNEL, notification_of)
    async with hub.subscriber(capacity=8, encode=_encode) as sub:
        sub.watch("s")
        await bus.close()
        async with asyncio.timeout(5):
            await sub.ended.wait()
        assert sub.end_reason == LOST
        assert hub.watched_streams == 0
    # Nothing listens on port 1: the subscription cannot be made.
    dead = LiveHub(RedisEventBus.from_url("redis://127.0.0.1:1/0"), CHANNEL, notification_of)
    with pytest.raises(FeedUnavailableError):
        async with dead.subscriber(capacity=8, encode=_encode):
            pass
    assert dead.subscribers == 0


async def test_a_socket_that_does_not_read_is_dropped_and_others_carry_on(
    video_pg_settings: Settings, make_app: AppFactory, minimax: Minimax
) -> None:
    settings = with_settings(video_pg_settings, redis_prefix=f"test:{uuid.uuid4().hex}:")
    async with serve(make_app(settings)) as server:
        setup = await video_setup(server, minimax)
        headers = setup.tenant.key
        stuck = {"model": setup.model, "prompt": "[stuck] slow reader"}
        slow_job = result(await call(server.http, headers, "video.create", stuck))
        other_job = result(await call(server.http, headers, "video.create", stuck))
        async with (
            rpc_socket(server, headers, receive_buffer=4096) as slow,
            rpc_socket(server, headers) as good,
        ):
            result(await slow.call("video.subscribe", {"stream_id": slow_job["stream_id"]}))
            result(await good.call("video.subscribe", {"stream_id": other_job["stream_id"]}))
            await good.next_note(other_job["stream_id"])
            # Far more than the socket buffers hold: 2,000 notifications of ~16 KB.
            bus = server.resources.event_bus
            filler = "f" * 16_000
            for progress in range(1, 2001):
                event = _event(slow_job["stream_id"], "running", progress)
                await bus.publish(CHANNEL, {**event, "job_id": filler})
            # The hub was never held up: the other socket hears of a cancel at once.
            cancel = {"job_id": other_job["job_id"]}
            result(await call(server.http, headers, "video.cancel", cancel))
            notes = await good.stream(other_job["stream_id"])
            assert notes[-1] == ("video.failed", {**other_job, "error": "cancelled"})
            received, closed = await _read_until_closed(slow)
            assert closed.rcvd is not None
            assert closed.rcvd.code == 1008
            assert "too slow" in closed.rcvd.reason
            assert received < 2000
            # The good socket is still served.
            assert result(await good.call("video.list", {"limit": 1}))["total"] == 2
        result(await call(server.http, headers, "video.cancel", {"job_id": slow_job["job_id"]}))


async def _read_until_closed(socket: RpcSocket) -> tuple[int, ConnectionClosed]:
    """How many messages arrive before the server closes the socket, and the close."""
    received = 0
    while True:
        try:
            await socket.recv(within=20)
        except ConnectionClosed as exc:
            return received, exc
        received += 1


async def test_every_connection_releases_its_subscription(
    video_pg_settings: Settings, make_app: AppFactory, minimax: Minimax
) -> None:
    prefix = f"test:{uuid.uuid4().hex}:"
    settings = with_settings(video_pg_settings, redis_prefix=prefix)
    redis = Redis.from_url(REDIS_URL)
    channel = f"{prefix}events:{CHANNEL}"

    async def listeners() -> int:
        counts = await redis.pubsub_numsub(channel)
        return int(counts[0][1])

    try:
        async with serve(make_app(settings)) as server:
            setup = await video_setup(server, minimax)
            headers = setup.tenant.key
            stuck = {"model": setup.model, "prompt": "[stuck] held open"}
            job = result(await call(server.http, headers, "video.create", stuck))
            assert await listeners() == 0
            async with rpc_socket(server, headers) as first, rpc_socket(server, headers) as second:
                result(await first.call("video.subscribe", {"stream_id": job["stream_id"]}))
                result(await second.call("video.subscribe", {"stream_id": job["stream_id"]}))
                assert await listeners() == 1
                # An SSE client that gives up mid-stream lets go too.
                opened = asyncio.Event()
                reading = asyncio.create_task(
                    read_sse(server.http, headers, job["stream_id"], opened=opened)
                )
                async with asyncio.timeout(10):
                    await opened.wait()
                assert await listeners() == 1
                await first.next_note(job["stream_id"])
                reading.cancel()
                await asyncio.gather(reading, return_exceptions=True)
            await eventually(lambda: _is(listeners, 0), within=5)
            await _check_feed_again(server, headers, job)
            await eventually(lambda: _is(listeners, 0), within=5)
    finally:
        await redis.aclose()


async def _check_feed_again(server: Replica, headers: dict[str, str], job: dict[str, Any]) -> None:
    """After every listener left, a new one is served live again."""
    async with rpc_socket(server, headers) as socket:
        result(await socket.call("video.subscribe", {"stream_id": job["stream_id"]}))
        await socket.next_note(job["stream_id"])
        result(await call(server.http, headers, "video.cancel", {"job_id": job["job_id"]}))
        notes = await socket.stream(job["stream_id"])
        assert notes[-1][1]["error"] == "cancelled"


def test_ws_notifications_are_json_rpc_notifications() -> None:
    frame = ws_notification("video.progress", {"status": "running", "progress": 5})
    assert frame == (
        b'{"jsonrpc":"2.0","method":"video.progress","params":{"status":"running","progress":5}}'
    )


async def test_the_sidecar_pings_when_idle_and_rereads_a_job_whose_event_was_lost() -> None:
    bus = MemoryEventBus()
    hub = LiveHub(bus, CHANNEL, notification_of)
    reads = 0

    async with hub.subscriber(capacity=8, encode=sse_frame) as sub:
        sub.watch("s")
        sub.release("s", notification_of(_event("s", "running", 10)))

        async def refresh() -> None:
            # The database says done; no event ever told the hub.
            nonlocal reads
            reads += 1
            sub.offer("s", notification_of(_event("s", "done", 100, result={"url": "u"})))

        frames = [
            frame async for frame in stream_frames(sub, "s", refresh, heartbeat=0.05, resync=0.1)
        ]
    assert frames[0].startswith(b"event: video.progress\ndata: ")
    assert PING in frames
    assert frames[-1] == (
        b'event: video.done\ndata: {"job_id":"vid_' + b"a" * 32 + b'","stream_id":"s",'
        b'"result":{"url":"u"},"cost":null}\n\n'
    )
    assert reads == 1
    await bus.close()
