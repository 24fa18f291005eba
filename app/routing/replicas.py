"""How replicas share routing evidence: events stamped with their origin, and each
replica applying only the ones the others sent.

Every shared verdict, sample or count travels the same way (``shared_latency``,
``shared_verdicts``, ``load_share``, the health prober's rounds): published with the
sender's ``instance`` under ``origin``, followed by every replica, which skips its own
(it has counted them already). Nothing here is on a request's path: publishing happens on
transitions and flush timers, following in a supervised background loop.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from app.lib.events.base import Event, EventBus


async def tell_others(events: EventBus, channel: str, instance: str, **fields: Any) -> None:
    """Publish ``fields`` on ``channel`` with ``origin`` first (the wire shape every
    follower reads)."""
    await events.publish(channel, {"origin": instance, **fields})


async def follow_others(
    events: EventBus,
    channel: str,
    instance: str,
    apply: Callable[[Event], None],
    *,
    subscribed: Callable[[], Awaitable[None]] | None = None,
) -> None:
    """Call ``apply`` with every event another replica publishes on ``channel`` (run
    supervised). ``subscribed`` runs once the subscription is in place and before the
    first event, so what is published while it runs is applied after it, not lost."""
    async with events.subscribe(channel) as stream:
        if subscribed is not None:
            await subscribed()
        async for event in stream:
            if event.get("origin") != instance:
                apply(event)
