"""Each runtime token's governance, served from memory and kept current over the bus.

A runtime JWT is checked without the database (signature, expiry, revocation marks
in the ``StateStore``), but its governance (allowed models, limits, an expiry its
owner moved earlier) lives on its row. ``RuntimePolicies`` reads a token's row on its
first use on a replica and then serves it from memory; ``RuntimePolicySync`` forgets
it on every replica when ``RuntimeTokenService.change`` wrote (through the
credential lifecycle), and everything after a resubscription. Entries also go stale
after a minute, the safety net under a lost event.

Event shape (a JSON object; the bus adds ``channel``)::

    {"kind": "token", "tokenId": "<runtime token uuid>", "origin": "<replica id>"}
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from uuid import UUID

from advanced_alchemy.extensions.litestar import SQLAlchemyAsyncConfig
from sqlalchemy import select

from app.db.models import RuntimeToken
from app.db.outage import unavailable_on_outage
from app.domain.accounts.governance import KeyPolicy
from app.lib.events.base import EventBus
from app.lib.replicated_cache import CacheSync, ReplicatedCache

CHANNEL = "auth.runtime_tokens"
DEFAULT_MAX_AGE = 60.0
DEFAULT_MAX_TOKENS = 100_000


@dataclass(frozen=True, slots=True)
class TokenGrant:
    policy: KeyPolicy | None
    """``None``: the token has no row any more (its project was deleted)."""


GrantLoader = Callable[[UUID], Awaitable[TokenGrant]]


def db_grant_loader(db_config: SQLAlchemyAsyncConfig) -> GrantLoader:
    async def load(token_id: UUID) -> TokenGrant:
        async with db_config.get_session() as session:
            row = await session.scalar(select(RuntimeToken).where(RuntimeToken.id == token_id))
            return TokenGrant(None if row is None else KeyPolicy.of_row(row))

    return unavailable_on_outage(
        load,
        "this runtime token's settings cannot be read right now: the database is "
        "unreachable; retry shortly",
    )


class RuntimePolicies:
    def __init__(
        self,
        loader: GrantLoader,
        *,
        max_age: float = DEFAULT_MAX_AGE,
        max_tokens: int = DEFAULT_MAX_TOKENS,
    ) -> None:
        # Invalidated entries are kept, stale: served only if the re-read fails.
        self._entries: ReplicatedCache[UUID, TokenGrant] = ReplicatedCache(
            loader,
            "runtime token policies",
            max_entries=max_tokens,
            max_age=max_age,
            keep_on_invalidate=True,
        )

    async def get(self, token_id: UUID) -> KeyPolicy | None:
        """The token's governance, or ``None`` when it has no row."""
        return (await self._entries.get(token_id)).policy

    def invalidate(self, token_id: UUID) -> None:
        self._entries.invalidate(token_id)

    def mark_all_stale(self) -> None:
        self._entries.mark_all_stale()


class RuntimePolicySync(CacheSync):
    """``changed(token_id)`` is called after a token's governance was written."""

    key_field = "tokenId"

    def __init__(self, policies: RuntimePolicies, bus: EventBus) -> None:
        super().__init__(bus, CHANNEL, "token", "runtime token policies")
        self.policies = policies

    async def forget(self, key: UUID) -> None:
        self.policies.invalidate(key)

    async def reload(self) -> None:
        self.policies.mark_all_stale()
