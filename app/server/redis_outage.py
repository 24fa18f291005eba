"""What a replica does when Redis goes away and comes back.

The ``FallbackStateStore`` switches shared state to local memory by itself; this module
adds what only the application knows:

- on the way down, this replica's memory is seeded with the revoked runtime tokens the
  database knows, so a revoked token is not accepted because its mark lived in Redis;
- on the way back, everything an invalidation event would have refreshed is reloaded
  (events published while Redis was down are lost), revocations are written to Redis
  again (one revoked during the outage reached only the database and this replica),
  and the breaker verdicts stored in Redis are re-applied.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import structlog

from app.domain.accounts.credential_services import RuntimeTokenService
from app.lib.state.fallback import FallbackStateStore
from app.server.resources import Resources

logger = structlog.get_logger()


async def restore_revocations(resources: Resources) -> None:
    """The revoked, unexpired runtime tokens from the database into the state store."""
    async with RuntimeTokenService.new(config=resources.db_config) as service:
        for row in await service.revoked_unexpired():
            await resources.revocations.revoke(str(row.id), row.expires_at.timestamp())


async def resync_after_outage(resources: Resources) -> None:
    await restore_revocations(resources)
    await resources.api_key_index.reload()
    await resources.routing_sync.load_all()
    await resources.profile_sync.load_all()
    await resources.custom_llms.sync.reload()
    await resources.override_sync.reload()
    await resources.quota_sync.reload()
    await resources.shared_verdicts.restore_all()
    logger.info("caches re-synced after the state store came back")


def outage_watcher(resources: Resources) -> Callable[[], Awaitable[None]] | None:
    """The loop to run for the life of the process, or None without Redis."""
    store = resources.state_store
    if not isinstance(store, FallbackStateStore):
        return None

    async def seed() -> None:
        await restore_revocations(resources)

    async def resync() -> None:
        await resync_after_outage(resources)

    store.on_degraded(seed)
    store.on_recovered(resync)
    return store.watch
