"""Project API keys and runtime tokens: issue, list, revoke; durable revocation marks."""

from __future__ import annotations

import datetime
from collections.abc import Mapping, Sequence
from typing import Any
from uuid import UUID, uuid4

from advanced_alchemy.repository import SQLAlchemyAsyncRepository
from advanced_alchemy.service import SQLAlchemyAsyncRepositoryService

from app.db.models import ApiKey, RuntimeToken, TokenRevocation
from app.domain.accounts.services import RUNTIME_AUDIENCE
from app.domain.paging import newest_first
from app.lib.clock import utcnow
from app.lib.errors import BadRequestError, ConflictError, NotFoundError
from app.lib.hashing import random_secret, sha256_hex
from app.lib.tokens import IssuedToken, TokenService

API_KEY_PREFIX = "ak-"
DISPLAY_PREFIX_LENGTH = 10


class ApiKeyService(SQLAlchemyAsyncRepositoryService[ApiKey]):
    class Repo(SQLAlchemyAsyncRepository[ApiKey]):
        model_type = ApiKey

    repository_type = Repo

    async def issue(
        self,
        *,
        project_id: UUID,
        name: str,
        created_by: UUID | None,
        governance: Mapping[str, Any] | None = None,
    ) -> tuple[ApiKey, str]:
        """Create a key; the plaintext is returned once and never stored.
        ``governance``: checked column values (``valid_governance``)."""
        secret = random_secret(API_KEY_PREFIX)
        row = await self.create(
            ApiKey(
                project_id=project_id,
                name=name,
                prefix=secret[:DISPLAY_PREFIX_LENGTH],
                key_hash=sha256_hex(secret),
                created_by_id=created_by,
                **(governance or {}),
            ),
            auto_commit=True,
        )
        return row, secret

    async def change(self, project_id: UUID, key_id: UUID, values: Mapping[str, Any]) -> ApiKey:
        """Set checked governance values (and ``name``) without rotating the key. A
        revoked key stays revoked (409)."""
        row = await self.get_in_project(project_id, key_id)
        if row.revoked_at is not None:
            raise ConflictError("this API key is revoked: it cannot be edited", code="revoked")
        for column, value in values.items():
            setattr(row, column, value)
        return await self.update(row, auto_commit=True)

    async def page(self, project_id: UUID, limit: int, offset: int) -> tuple[Sequence[ApiKey], int]:
        return await self.get_many_and_count(
            ApiKey.project_id == project_id, *newest_first(limit, offset)
        )

    async def get_in_project(self, project_id: UUID, key_id: UUID) -> ApiKey:
        row = await self.get_one_or_none(ApiKey.project_id == project_id, ApiKey.id == key_id)
        if row is None:
            raise NotFoundError("API key not found", code="api_key_not_found")
        return row

    async def revoke(self, project_id: UUID, key_id: UUID) -> ApiKey:
        row = await self.get_in_project(project_id, key_id)
        if row.revoked_at is None:
            row.revoked_at = utcnow()
            row = await self.update(row, auto_commit=True)
        return row


class RuntimeTokenService(SQLAlchemyAsyncRepositoryService[RuntimeToken]):
    class Repo(SQLAlchemyAsyncRepository[RuntimeToken]):
        model_type = RuntimeToken

    repository_type = Repo

    async def issue(
        self,
        *,
        tokens: TokenService,
        project_id: UUID,
        name: str,
        ttl_seconds: int,
        created_by: UUID | None,
        governance: Mapping[str, Any] | None = None,
    ) -> tuple[RuntimeToken, IssuedToken]:
        token_id = uuid4()
        issued = tokens.issue(
            subject=str(project_id),
            audience=RUNTIME_AUDIENCE,
            ttl_seconds=ttl_seconds,
            claims={"pid": str(project_id)},
            jti=str(token_id),
        )
        row = await self.create(
            RuntimeToken(
                id=token_id,
                project_id=project_id,
                name=name,
                expires_at=issued.expires_at,
                created_by_id=created_by,
                **(governance or {}),
            ),
            auto_commit=True,
        )
        return row, issued

    async def page(
        self, project_id: UUID, limit: int, offset: int
    ) -> tuple[Sequence[RuntimeToken], int]:
        return await self.get_many_and_count(
            RuntimeToken.project_id == project_id, *newest_first(limit, offset)
        )

    async def get_in_project(self, project_id: UUID, token_id: UUID) -> RuntimeToken:
        row = await self.get_one_or_none(
            RuntimeToken.project_id == project_id, RuntimeToken.id == token_id
        )
        if row is None:
            raise NotFoundError("runtime token not found", code="runtime_token_not_found")
        return row

    async def change(
        self, project_id: UUID, token_id: UUID, values: Mapping[str, Any]
    ) -> RuntimeToken:
        """Set checked governance values; ``expires_at`` may only move earlier, since
        the token's lifetime is signed into it."""
        row = await self.get_in_project(project_id, token_id)
        if row.revoked_at is not None:
            raise ConflictError(
                "this runtime token is revoked: it cannot be edited", code="revoked"
            )
        if "expires_at" in values:
            expires = values["expires_at"]
            if expires is None or expires > row.expires_at:
                raise BadRequestError(
                    "a runtime token's expiry is signed into it: expiresAt can only move "
                    f"earlier than {row.expires_at.isoformat()} (issue a new token to extend)",
                    code="expiry_not_extendable",
                    param="expiresAt",
                )
        for column, value in values.items():
            setattr(row, column, value)
        return await self.update(row, auto_commit=True)

    async def revoke(self, project_id: UUID, token_id: UUID) -> RuntimeToken:
        row = await self.get_in_project(project_id, token_id)
        if row.revoked_at is None:
            row.revoked_at = utcnow()
            row = await self.update(row, auto_commit=True)
        return row

    async def unexpired_in_project(self, project_id: UUID) -> Sequence[RuntimeToken]:
        return await self.get_many(
            RuntimeToken.project_id == project_id, RuntimeToken.expires_at > utcnow()
        )

    async def revoked_unexpired(self) -> Sequence[RuntimeToken]:
        return await self.get_many(
            RuntimeToken.revoked_at.is_not(None), RuntimeToken.expires_at > utcnow()
        )


class TokenRevocationService(SQLAlchemyAsyncRepositoryService[TokenRevocation]):
    """Revoked JWTs whose own row is about to go (see ``TokenRevocation``)."""

    class Repo(SQLAlchemyAsyncRepository[TokenRevocation]):
        model_type = TokenRevocation

    repository_type = Repo

    async def record(self, tokens: Sequence[RuntimeToken]) -> None:
        """Stage the marks in the caller's transaction (committed with the delete)."""
        if tokens:
            await self.create_many(
                [TokenRevocation(jti=str(t.id), expires_at=t.expires_at) for t in tokens],
                auto_commit=False,
            )

    async def unexpired(self) -> Sequence[TokenRevocation]:
        return await self.get_many(TokenRevocation.expires_at > utcnow())

    async def prune(self) -> None:
        """Drop marks of tokens that have expired anyway."""
        await self.delete_where(
            TokenRevocation.expires_at <= utcnow(), auto_commit=True, sanity_check=False
        )


def expires_epoch(moment: datetime.datetime) -> float:
    return moment.timestamp()
