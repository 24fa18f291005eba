"""Agent token -> identity, with unknown tokens negatively cached.

Handshakes with a bad token are answered from memory for ``NEGATIVE_TTL_SECONDS``
(no database query per attempt). A token is random and only its hash is stored, so
caching "unknown" cannot hide an identity created later.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from uuid import UUID

from advanced_alchemy.extensions.litestar import SQLAlchemyAsyncConfig

from app.db.models import AgentNode
from app.domain.agents.services import AgentNodeService
from app.lib.hashing import sha256_hex

NEGATIVE_TTL_SECONDS = 5.0
MAX_NEGATIVE = 10_000


class AgentTokens:
    """Token -> agent identity, with unknown tokens negatively cached."""

    def __init__(self, db_config: SQLAlchemyAsyncConfig) -> None:
        self._db_config = db_config
        self._unknown: OrderedDict[str, float] = OrderedDict()

    async def identify(self, token: str) -> tuple[UUID, str] | None:
        token_hash = sha256_hex(token)
        now = time.monotonic()
        expires = self._unknown.get(token_hash)
        if expires is not None and expires > now:
            return None
        async with AgentNodeService.new(config=self._db_config) as agents:
            row = await agents.get_one_or_none(AgentNode.token_hash == token_hash)
        if row is None:
            self._unknown[token_hash] = now + NEGATIVE_TTL_SECONDS
            self._unknown.move_to_end(token_hash)
            while len(self._unknown) > MAX_NEGATIVE:
                self._unknown.popitem(last=False)
            return None
        return row.id, row.name
