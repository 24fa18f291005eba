"""The accounts area's per-app objects and their life: the API key index and its
sync, key use recording, revocation marks and the authenticator."""

from __future__ import annotations

import asyncio
import datetime
from collections.abc import Mapping, Sequence

import structlog
from advanced_alchemy.extensions.litestar import SQLAlchemyAsyncConfig

from app.domain.accounts.authenticator import Authenticator
from app.domain.accounts.credential_services import RuntimeTokenService, TokenRevocationService
from app.domain.accounts.deps import accounts_dependencies
from app.domain.accounts.keyring import (
    ApiKeyIndex,
    db_key_loaders,
)
from app.domain.accounts.last_used import LastUsedRecorder
from app.domain.accounts.revocations import RevocationList
from app.domain.accounts.runtime_policies import (
    RuntimePolicies,
    RuntimePolicySync,
    db_grant_loader,
)
from app.domain.accounts.services import RefreshTokenService, family_mark_until
from app.domain.accounts.sync import ApiKeySync
from app.lib.clock import utcnow
from app.lib.components import BackgroundTask, Component, periodic
from app.lib.events.base import EventBus
from app.lib.settings import Settings
from app.lib.state.base import StateStore
from app.lib.tokens import TokenService

logger = structlog.get_logger()
KEY_INDEX_RELOAD_SECONDS = 60.0
KEY_SYNC_READY_SECONDS = 10.0


async def restore_revocations(
    revocations: RevocationList, config: SQLAlchemyAsyncConfig, settings: Settings
) -> None:
    """Every revocation the database knows into the state store: revoked runtime
    tokens, a deleted project's tokens, and logins ended recently enough that access
    tokens minted from them are still alive."""
    async with RuntimeTokenService.new(config=config) as runtime_tokens:
        for row in await runtime_tokens.revoked_unexpired():
            await revocations.revoke(str(row.id), row.expires_at.timestamp())
    async with TokenRevocationService.new(config=config) as orphans:
        await orphans.prune()
        for mark in await orphans.unexpired():
            await revocations.revoke(mark.jti, mark.expires_at.timestamp())
    # A family revoked at t is marked until family_mark_until(t): anything older is over.
    horizon = family_mark_until(0.0, settings)
    since = utcnow() - datetime.timedelta(seconds=horizon)
    async with RefreshTokenService.new(config=config) as refresh_tokens:
        for family_id, revoked_at in await refresh_tokens.families_revoked_since(since):
            until = family_mark_until(revoked_at.timestamp(), settings)
            await revocations.revoke_family(str(family_id), until)


class AccountsWiring(Component):
    name = "accounts"

    def __init__(
        self,
        settings: Settings,
        *,
        db_config: SQLAlchemyAsyncConfig,
        state_store: StateStore,
        bus: EventBus,
        tokens: TokenService,
    ) -> None:
        self._settings = settings
        self._db_config = db_config
        self.revocations = RevocationList(state_store)
        load_all, lookup_one = db_key_loaders(db_config)
        self.api_key_index = ApiKeyIndex(
            load_all,
            lookup_one,
            negative_ttl=settings.negative_key_cache_ttl_seconds,
        )
        self.api_key_sync = ApiKeySync(self.api_key_index, bus)
        self.last_used = LastUsedRecorder(db_config.get_engine())
        self.runtime_policy_sync = RuntimePolicySync(
            RuntimePolicies(db_grant_loader(db_config)), bus
        )
        self.authenticator = Authenticator(
            tokens=tokens,
            revocations=self.revocations,
            api_keys=self.api_key_index,
            last_used=self.last_used,
            admin_token=settings.admin_token,
            runtime_policies=self.runtime_policy_sync.policies,
        )
        self._keys_ready = asyncio.Event()

    def provides(self) -> Mapping[str, object]:
        return {
            **accounts_dependencies(),
            "revocations": self.revocations,
            "authenticator": self.authenticator,
            "api_key_sync": self.api_key_sync,
            "runtime_policy_sync": self.runtime_policy_sync,
        }

    async def _restore_revocations(self) -> None:
        await restore_revocations(self.revocations, self._db_config, self._settings)

    async def _flush_last_used(self) -> None:
        try:
            await self.last_used.flush()
        except Exception as exc:
            logger.warning("could not record API key use", error=repr(exc))

    async def start(self) -> None:
        # The in-memory store forgets revocations on restart; the database does not.
        await self._restore_revocations()
        self._keys_ready = asyncio.Event()

    def tasks(self) -> Sequence[BackgroundTask]:
        ready = self._keys_ready
        return (
            # Subscribes first and then loads the key index, so no change made on
            # another replica falls between the load and the subscription.
            BackgroundTask("api-key-sync", lambda: self.api_key_sync.run(ready)),
            BackgroundTask("runtime-policy-sync", self.runtime_policy_sync.run),
            periodic(
                "api-key-last-used", self._settings.last_used_flush_seconds, self._flush_last_used
            ),
            periodic("api-key-reload", KEY_INDEX_RELOAD_SECONDS, self.api_key_index.reload),
        )

    async def ready(self) -> None:
        try:
            await asyncio.wait_for(self._keys_ready.wait(), KEY_SYNC_READY_SECONDS)
        except TimeoutError:
            logger.warning("api key events unavailable; serving from a plain load")
            await self.api_key_index.reload()

    async def seed_after_outage(self) -> None:
        # A revoked token must not be accepted because its mark lived in Redis.
        await self._restore_revocations()

    async def resync_after_outage(self) -> None:
        # One revoked during the outage reached only the database and this replica.
        await self._restore_revocations()
        await self.api_key_index.reload()
        await self.runtime_policy_sync.reload()

    async def aclose(self) -> None:
        await self._flush_last_used()
