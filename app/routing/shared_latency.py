"""Latency samples shared by every replica, so latency failover is one cluster's verdict.

Each replica records the time to first token of what it serves; without sharing, a
replica that served few of a slow profile's requests would keep sending traffic to it
while another redirects. Here every sample recorded on a replica is batched and
published on ``routing.latency`` every ``flush_seconds`` (one event per interval at
most, and none while idle); the others add it to their own tracker at its true age
(wall clock: replicas agree on it as far as NTP does), so all judge a profile by the
same window of evidence.

Samples are hints like every event: one lost in a Redis outage only leaves a replica
with less evidence for a window's length. A batch carries at most ``max_batch``
samples per profile (the newest); a tracker keeps fewer than that anyway.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable
from dataclasses import KW_ONLY, dataclass, field

import structlog

from app.lib.events.base import Event, EventBus
from app.routing.failover import FailoverPolicy
from app.routing.replicas import follow_others, tell_others

LATENCY_CHANNEL = "routing.latency"
DEFAULT_FLUSH_SECONDS = 0.5
DEFAULT_MAX_BATCH = 256

logger = structlog.get_logger()


@dataclass(slots=True, eq=False)
class SharedLatency:
    policy: FailoverPolicy
    events: EventBus
    _: KW_ONLY
    instance: str
    flush_seconds: float = DEFAULT_FLUSH_SECONDS
    max_batch: int = DEFAULT_MAX_BATCH
    wall_clock: Callable[[], float] = time.time
    _outbox: dict[str, deque[tuple[float, float]]] = field(default_factory=dict, init=False)

    def watch(self) -> None:
        self.policy.on_sample(self._recorded)

    def _recorded(self, profile_id: str, ttft_ms: float) -> None:
        batch = self._outbox.get(profile_id)
        if batch is None:
            batch = self._outbox[profile_id] = deque(maxlen=self.max_batch)
        batch.append((self.wall_clock(), ttft_ms))

    async def publish_pending(self) -> None:
        """Send what was recorded since the last call (nothing when idle)."""
        if not self._outbox:
            return
        outbox, self._outbox = self._outbox, {}
        samples = {pid: [[at, ms] for at, ms in batch] for pid, batch in outbox.items()}
        await tell_others(self.events, LATENCY_CHANNEL, self.instance, samples=samples)

    async def run_publisher(self) -> None:
        while True:
            await asyncio.sleep(self.flush_seconds)
            await self.publish_pending()

    async def follow(self) -> None:
        """Add the samples other replicas publish (run supervised)."""
        await follow_others(self.events, LATENCY_CHANNEL, self.instance, self._apply)

    def _apply(self, event: Event) -> None:
        samples = event.get("samples")
        if not isinstance(samples, dict):
            logger.warning("malformed latency samples", samples=samples)
            return
        now = self.wall_clock()
        aged: list[tuple[str, float, float]] = []
        for profile_id, batch in samples.items():
            if not isinstance(batch, list):
                continue
            for item in batch:
                try:
                    at, ms = float(item[0]), float(item[1])
                except (TypeError, ValueError, IndexError):
                    continue
                aged.append((str(profile_id), ms, max(0.0, now - at)))
        if aged:
            self.policy.record_elsewhere(aged)
