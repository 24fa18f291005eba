"""What a replica does when Redis goes away and comes back.

The ``FallbackStateStore`` switches shared state to local memory by itself; this module
adds what only the areas know, through their wiring (``app.lib.components``):

- on the way down, each area seeds this replica's memory with what must hold (the
  revocations the database knows, so a revoked token is not accepted because its mark
  lived in Redis);
- on the way back, each area reloads what an invalidation event would have refreshed
  (events published while Redis was down are lost), in the order of the components.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import structlog

from app.lib.state.fallback import FallbackStateStore
from app.server.resources import Resources

logger = structlog.get_logger()


def outage_watcher(resources: Resources) -> Callable[[], Awaitable[None]] | None:
    """The loop to run for the life of the process, or None without Redis."""
    store = resources.state_store
    if not isinstance(store, FallbackStateStore):
        return None
    components = resources.components

    async def seed() -> None:
        for component in components:
            await component.seed_after_outage()

    async def resync() -> None:
        for component in components:
            await component.resync_after_outage()
        logger.info("caches re-synced after the state store came back")

    store.on_degraded(seed)
    store.on_recovered(resync)
    return store.watch
