"""One ``EventBus`` contract, run against the in-process and the Redis implementation.

Absence of delivery is checked without sleeping: publish the unwanted event, then a
marker on a subscribed channel; since one publisher's events arrive in order, the
marker being the first event received proves the unwanted one was not delivered.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest
from structlog.testing import capture_logs

from app.lib.events.base import Event, EventBus
from app.lib.events.memory import MemoryEventBus
from app.lib.events.redis import RedisEventBus
from tests.support.state_harness import Harness

WAIT = 2.0
FLOOD_WAIT = 20.0


async def receive(events: AsyncIterator[Event]) -> Event:
    async with asyncio.timeout(WAIT):
        return await anext(events)


async def test_roundtrip(bus: EventBus) -> None:
    async with bus.subscribe("health") as events:
        await bus.publish("health", {"backend": "b1", "healthy": False, "n": [1, 2.5, None]})
        assert await receive(events) == {
            "backend": "b1",
            "healthy": False,
            "n": [1, 2.5, None],
            "channel": "health",
        }


async def test_events_arrive_in_publish_order(bus: EventBus) -> None:
    async with bus.subscribe("jobs") as events:
        for i in range(20):
            await bus.publish("jobs", {"i": i})
        assert [(await receive(events))["i"] for _ in range(20)] == list(range(20))


async def test_multiple_channels(bus: EventBus) -> None:
    async with bus.subscribe("health", "registry") as events:
        await bus.publish("registry", {"i": 1})
        await bus.publish("health", {"i": 2})
        assert await receive(events) == {"i": 1, "channel": "registry"}
        assert await receive(events) == {"i": 2, "channel": "health"}


async def test_channel_field_reflects_delivery_channel(bus: EventBus) -> None:
    async with bus.subscribe("health") as events:
        await bus.publish("health", {"channel": "spoofed"})
        assert (await receive(events))["channel"] == "health"


async def test_two_subscribers_both_receive(bus: EventBus) -> None:
    async with bus.subscribe("health") as first, bus.subscribe("health") as second:
        await bus.publish("health", {"i": 1})
        assert await receive(first) == {"i": 1, "channel": "health"}
        assert await receive(second) == {"i": 1, "channel": "health"}


async def test_other_channels_not_delivered(bus: EventBus) -> None:
    async with bus.subscribe("health") as events:
        await bus.publish("registry", {"unwanted": True})
        await bus.publish("health", {"marker": True})
        assert await receive(events) == {"marker": True, "channel": "health"}


async def test_event_before_subscription_not_delivered(bus: EventBus) -> None:
    await bus.publish("health", {"early": True})
    async with bus.subscribe("health") as events:
        await bus.publish("health", {"late": True})
        assert await receive(events) == {"late": True, "channel": "health"}


async def test_unsubscribed_receives_nothing(bus: EventBus) -> None:
    async with bus.subscribe("health") as stays:
        async with bus.subscribe("health") as leaves:
            pass
        await bus.publish("health", {"after": True})
        assert await receive(stays) == {"after": True, "channel": "health"}
        # The exited subscription ends instead of yielding (or hanging).
        with pytest.raises(StopAsyncIteration):
            await receive(leaves)


async def test_exit_ends_reader_blocked_in_another_task(bus: EventBus) -> None:
    async with bus.subscribe("health") as events:
        reader = asyncio.create_task(receive(events))
        await asyncio.sleep(0.05)
    with pytest.raises(StopAsyncIteration):
        await reader


async def test_resubscribe_sees_only_new_events(bus: EventBus) -> None:
    async with bus.subscribe("health"):
        pass
    await bus.publish("health", {"between": True})
    async with bus.subscribe("health") as events:
        await bus.publish("health", {"now": True})
        assert await receive(events) == {"now": True, "channel": "health"}


async def test_publish_without_subscribers(bus: EventBus) -> None:
    await bus.publish("nobody-listens", {"i": 1})


async def test_unserializable_event_raises(bus: EventBus) -> None:
    with pytest.raises(TypeError):
        await bus.publish("health", {"obj": object()})


async def test_subscribe_requires_channel(bus: EventBus) -> None:
    with pytest.raises(ValueError, match="channel"):
        async with bus.subscribe():
            pass


async def test_replica_publishes_other_replica_receives(harness: Harness) -> None:
    # Separate clients on the redis backend: replica A publishes, replica B listens.
    a, b = harness.bus(), harness.bus()
    async with b.subscribe("registry") as events:
        await a.publish("registry", {"backend": "new"})
        assert await receive(events) == {"backend": "new", "channel": "registry"}


async def test_idle_subscriber_does_not_block_publisher(bus: EventBus) -> None:
    async with bus.subscribe("flood"):
        started = time.monotonic()
        # A publisher that waited on the idle subscriber would hang here for good;
        # the bound is generous because the shared Redis may be busy.
        async with asyncio.timeout(FLOOD_WAIT):
            for i in range(1000):
                await bus.publish("flood", {"i": i})
        print(f"1000 publishes past an idle subscriber: {time.monotonic() - started:.2f}s")


async def test_subscriber_iterates_from_another_task(bus: EventBus) -> None:
    async with bus.subscribe("health") as events:
        reader = asyncio.create_task(receive(events))
        await asyncio.sleep(0.05)
        await bus.publish("health", {"i": 1})
        assert await reader == {"i": 1, "channel": "health"}


async def test_memory_slow_subscriber_drops_oldest() -> None:
    bus = MemoryEventBus(max_queue=5)
    async with bus.subscribe("flood") as slow, bus.subscribe("flood") as fast:
        for i in range(20):
            await bus.publish("flood", {"i": i})
        assert [(await receive(slow))["i"] for _ in range(5)] == [15, 16, 17, 18, 19]
        assert [(await receive(fast))["i"] for _ in range(5)] == [15, 16, 17, 18, 19]
    await bus.close()


async def test_memory_close_ends_subscriptions() -> None:
    bus = MemoryEventBus()
    async with bus.subscribe("health") as events:
        reader = asyncio.create_task(receive(events))
        await asyncio.sleep(0)
        await bus.close()
        with pytest.raises(StopAsyncIteration):
            await reader
    with pytest.raises(RuntimeError, match="closed"):
        async with bus.subscribe("health"):
            pass


async def test_redis_malformed_messages_skipped() -> None:
    # Only Redis can carry payloads from a foreign producer.
    harness = Harness("redis")
    try:
        bus = harness.bus()
        raw = harness.redis_client()
        async with bus.subscribe("health") as events:
            with capture_logs() as logs:
                for junk in (b"not json", b"[1, 2]", b'"str"', b"\xff\xfe", b""):
                    await raw.publish(harness.prefix + "health", junk)
                await bus.publish("health", {"ok": True})
                assert await receive(events) == {"ok": True, "channel": "health"}
        assert [entry["event"] for entry in logs] == ["event_malformed"] * 5
    finally:
        await harness.cleanup()


async def test_redis_publish_logs_and_swallows_outage() -> None:
    # Port 1 on loopback: nothing listens, the connection is refused at once.
    bus = RedisEventBus.from_url("redis://127.0.0.1:1/0")
    try:
        with capture_logs() as logs:
            for i in range(5):
                await bus.publish("health", {"i": i})
    finally:
        await bus.close()
    # An outage fails every publish: the first is logged, the rest within the minute
    # are counted into the next line.
    assert [(e["event"], e["log_level"], e["channel"], e["failures"]) for e in logs] == [
        ("event_publish_failed", "warning", "health", 1)
    ]
