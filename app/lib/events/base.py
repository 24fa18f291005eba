"""The ``EventBus`` interface: fan-out of state changes to every replica.

Health changes, failover changes, registry changes, cache invalidations and job
progress are published on named channels. Delivery is at-most-once and
best-effort: subscribers treat events as hints to refresh, never as the source of
truth (that is the database or the ``StateStore``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager
from typing import Any, Protocol, runtime_checkable

Event = dict[str, Any]


@runtime_checkable
class EventBus(Protocol):
    async def publish(self, channel: str, event: Event) -> None: ...

    def subscribe(self, *channels: str) -> AbstractAsyncContextManager[AsyncIterator[Event]]:
        """Subscribe to channels; the iterator yields events published after subscription
        (each event carries ``"channel"``)."""
        ...

    async def close(self) -> None: ...
