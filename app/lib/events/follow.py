"""The one way a replica follows a channel of cache-invalidation hints."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import structlog

from app.lib.events.base import Event, EventBus

logger = structlog.get_logger()


async def follow(
    bus: EventBus,
    channel: str,
    *,
    reload: Callable[[], Awaitable[None]],
    apply: Callable[[Event], Awaitable[None]],
    ready: asyncio.Event | None = None,
) -> None:
    """Subscribe, reload everything, then apply each event until cancelled.

    The reload comes after the subscription is in place, not before: a change
    published while reloading is queued and applied on top instead of falling into
    the gap. A restart after a lost connection reloads too, since events published
    meanwhile are gone. A failing ``apply`` (a database hiccup) is logged and the
    next event or resubscription catches up.
    """
    async with bus.subscribe(channel) as events:
        await reload()
        if ready is not None:
            ready.set()
        async for event in events:
            try:
                await apply(event)
            except Exception as exc:
                logger.warning("could not apply a change", channel=channel, error=repr(exc))
