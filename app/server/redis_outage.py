"""What a replica does when Redis goes away and comes back.

The ``FallbackStateStore`` switches shared state to local memory by itself; this module
adds what only the application knows:

- on the way down, this replica's memory is seeded with the revocations the database
  knows (runtime tokens, a deleted project's tokens, ended logins), so a revoked token
  is not accepted because its mark lived in Redis;
- on the way back, everything an invalidation event would have refreshed is reloaded
  (events published while Redis was down are lost), revocations are written to Redis
  again (one revoked during the outage reached only the database and this replica),
  and the breaker verdicts stored in Redis are re-applied.
"""

from __future__ import annotations

import datetime
from collections.abc import Awaitable, Callable

import structlog

from app.domain.accounts.credential_services import RuntimeTokenService, TokenRevocationService
from app.domain.accounts.services import RefreshTokenService, family_mark_until
from app.lib.clock import utcnow
from app.lib.state.fallback import FallbackStateStore
from app.server.resources import Resources

logger = structlog.get_logger()


async def restore_revocations(resources: Resources) -> None:
    """Every revocation the database knows into the state store: revoked runtime
    tokens, a deleted project's tokens, and logins ended recently enough that access
    tokens minted from them are still alive."""
    revocations = resources.revocations
    config = resources.db_config
    async with RuntimeTokenService.new(config=config) as runtime_tokens:
        for row in await runtime_tokens.revoked_unexpired():
            await revocations.revoke(str(row.id), row.expires_at.timestamp())
    async with TokenRevocationService.new(config=config) as orphans:
        await orphans.prune()
        for mark in await orphans.unexpired():
            await revocations.revoke(mark.jti, mark.expires_at.timestamp())
    settings = resources.settings
    # A family revoked at t is marked until family_mark_until(t): anything older is over.
    horizon = family_mark_until(0.0, settings)
    since = utcnow() - datetime.timedelta(seconds=horizon)
    async with RefreshTokenService.new(config=config) as refresh_tokens:
        for family_id, revoked_at in await refresh_tokens.families_revoked_since(since):
            until = family_mark_until(revoked_at.timestamp(), settings)
            await revocations.revoke_family(str(family_id), until)


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
