"""Latency samples recorded on one replica reach the others' failover verdicts."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from app.lib.events.memory import MemoryEventBus
from app.routing.failover import FailoverPolicy
from app.routing.latency import LatencyTracker
from app.routing.profiles import Profile, ProfileTable
from app.routing.shared_latency import LATENCY_CHANNEL, SharedLatency
from tests.support.helpers import running, until
from tests.support.routing_fakes import FakeClock

WALL = 1_700_000_000.0


class Replica:
    def __init__(self, name: str, events: MemoryEventBus, wall: FakeClock) -> None:
        self.table = ProfileTable(
            [
                Profile("smart", "Smart", "big", slow_threshold_ms=1000, failover_chain=("fast",)),
                Profile("fast", "Fast", "mid"),
            ]
        )
        self.clock = FakeClock()
        self.policy = FailoverPolicy(self.table, LatencyTracker(30.0, 3, self.clock), wall)
        self.shared = SharedLatency(self.policy, events, instance=name, wall_clock=wall)
        self.shared.watch()

    def state(self) -> str:
        return next(s.state for s in self.policy.statuses() if s.profile_id == "smart")

    def samples(self) -> int:
        return next(s.samples for s in self.policy.statuses() if s.profile_id == "smart")


def following(*replicas: Replica) -> contextlib.AbstractAsyncContextManager[None]:
    return running(*(r.shared.follow for r in replicas))


async def test_a_profile_slow_on_one_replica_is_redirected_on_the_other() -> None:
    events, wall = MemoryEventBus(), FakeClock()
    wall.now = WALL
    a, b = Replica("a", events, wall), Replica("b", events, wall)
    async with following(a, b):
        for _ in range(3):
            a.policy.record("smart", 2500)
        assert a.state() == "redirecting"
        assert b.state() == "ok"
        await a.shared.publish_pending()
        await until(lambda: b.state() == "redirecting")
        assert b.samples() == 3
        assert b.policy.statuses()[0].typical_ttft_ms == 2500
        # Nothing new: nothing published, and B does not count A's samples twice.
        await a.shared.publish_pending()
        await asyncio.sleep(0.02)
        assert b.samples() == 3


async def test_samples_keep_their_age_and_stale_or_malformed_ones_are_ignored() -> None:
    events, wall = MemoryEventBus(), FakeClock()
    wall.now = WALL
    b = Replica("b", events, wall)
    async with following(b):
        await events.publish(
            LATENCY_CHANNEL,
            {
                "origin": "a",
                "samples": {
                    "smart": [[WALL - 29.0, 2500], [WALL - 40.0, 2500], ["x"], [WALL, "y"]],
                    "fast": "nonsense",
                },
            },
        )
        await events.publish(LATENCY_CHANNEL, {"origin": "a", "samples": [1, 2]})
        await until(lambda: b.samples() == 1)
        # The sample 29 s old leaves the 30 s window one second later.
        b.clock.advance(1.5)
        assert b.samples() == 0


async def test_an_idle_replica_publishes_nothing() -> None:
    events, wall = MemoryEventBus(), FakeClock()
    a = Replica("a", events, wall)
    async with events.subscribe(LATENCY_CHANNEL) as received:
        await a.shared.publish_pending()
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(anext(received), 0.05)
