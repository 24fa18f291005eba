"""Stored override keys: the database side of the overrides API and of the index.

Rules of the API (``OverrideService``):

- ``(conversationId, modelId)`` is unique per project: a second key for the same
  target is a 409 ``override_exists`` (delete the old one first to replace it). The
  unique constraint backs the check when two requests race.
- A project holds at most ``MAX_OVERRIDES_PER_PROJECT`` keys (409
  ``override_limit_reached``): the index keeps a project's keys in memory as a whole.
- Identifiers must not start or end with whitespace nor contain control characters;
  a key must be visible ASCII (it travels in an HTTP header). 400s name the field.
- The key is sealed with the vault before the row is written; its associated data is
  ``aad("override_key", project_id, row_id)`` (``override_key_aad`` of
  ``app.domain.secrets.aad``, which ``arona vault rotate`` uses too). Only the masked
  hint is ever read back by the API.

``load_project_overrides`` is the index's loader: one query for a project's rows,
decrypted in memory; a row that cannot be decrypted is skipped with a warning that
names the row, never the key.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from uuid import UUID, uuid4

import structlog
from advanced_alchemy.extensions.litestar import SQLAlchemyAsyncConfig
from advanced_alchemy.repository import SQLAlchemyAsyncRepository
from advanced_alchemy.service import SQLAlchemyAsyncRepositoryService
from sqlalchemy import func, select

from app.db.models import OverrideKey
from app.domain.overrides.index import LoadedOverride
from app.domain.overrides.schemas import OverrideCreate
from app.domain.queries import delete_in_project, project_page
from app.domain.races import commit_raced
from app.domain.secrets.aad import override_key_aad
from app.lib.errors import BadRequestError, ConflictError, NotFoundError
from app.lib.replicated_cache import UNPUBLISHED, Changes
from app.lib.vault import Vault, VaultError, mask

MAX_OVERRIDES_PER_PROJECT = 10_000
# Control characters (C0, DEL, C1) and the Unicode line/paragraph separators.
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")
_VISIBLE_ASCII = re.compile(r"[\x21-\x7e]+")

logger = structlog.get_logger()


def override_not_found() -> NotFoundError:
    return NotFoundError("override not found", code="override_not_found")


def _override_exists() -> ConflictError:
    return ConflictError(
        "this conversation already has an override key for this modelId; delete it first "
        "to replace it",
        code="override_exists",
        param="modelId",
    )


def check_identifier(value: str, param: str) -> str:
    """A conversation id or model prefix, exactly as requests will carry it."""
    if value != value.strip():
        raise BadRequestError(
            f"{param} must not start or end with whitespace", code="invalid_value", param=param
        )
    if _CONTROL.search(value):
        raise BadRequestError(
            f"{param} must not contain control characters", code="invalid_value", param=param
        )
    return value


def check_api_key(value: str) -> str:
    # Never echo the value: error messages end up in logs and on screens.
    if not _VISIBLE_ASCII.fullmatch(value):
        raise BadRequestError(
            "apiKey must be visible ASCII characters only (no spaces, line breaks or "
            "other characters an HTTP header cannot carry)",
            code="invalid_api_key",
            param="apiKey",
        )
    return value


class OverrideService(SQLAlchemyAsyncRepositoryService[OverrideKey]):
    class Repo(SQLAlchemyAsyncRepository[OverrideKey]):
        model_type = OverrideKey

    repository_type = Repo
    changes: Changes = UNPUBLISHED
    """``OverrideSync`` (set by the request's provider): told after every write."""

    async def create_override(
        self, project_id: UUID, data: OverrideCreate, vault: Vault
    ) -> OverrideKey:
        conversation_id = check_identifier(data.conversation_id, "conversationId")
        prefix = check_identifier(data.model_id, "modelId")
        api_key = check_api_key(data.api_key)
        session = self.repository.session
        taken = await session.scalar(
            select(OverrideKey.id).where(
                OverrideKey.project_id == project_id,
                OverrideKey.conversation_id == conversation_id,
                OverrideKey.model_prefix == prefix,
            )
        )
        if taken is not None:
            raise _override_exists()
        count = await session.scalar(
            select(func.count())
            .select_from(OverrideKey)
            .where(OverrideKey.project_id == project_id)
        )
        if int(count or 0) >= MAX_OVERRIDES_PER_PROJECT:
            raise ConflictError(
                f"a project holds at most {MAX_OVERRIDES_PER_PROJECT} override keys",
                code="override_limit_reached",
            )
        # The id exists before the row does: the ciphertext is bound to it.
        row_id = uuid4()
        row = OverrideKey(
            id=row_id,
            project_id=project_id,
            conversation_id=conversation_id,
            model_prefix=prefix,
            key_encrypted=vault.encrypt(api_key, override_key_aad(project_id, row_id)),
            key_hint=mask(api_key),
        )
        # Another request can create the same target after the check above.
        raced = await commit_raced(session, row)
        if raced is not None:
            raise _override_exists() from raced
        await self.changes.changed(project_id)
        return row

    async def page(
        self, project_id: UUID, limit: int, offset: int, *, conversation_id: str | None = None
    ) -> tuple[Sequence[OverrideKey], int]:
        """Newest first."""
        where = [] if conversation_id is None else [OverrideKey.conversation_id == conversation_id]
        newest_first = [OverrideKey.created_at.desc(), OverrideKey.id.desc()]
        session = self.repository.session
        return await project_page(
            session, OverrideKey, project_id, newest_first, limit, offset, *where
        )

    async def require(self, project_id: UUID, override_id: UUID) -> OverrideKey:
        """The project's override; another project's is a 404."""
        row: OverrideKey | None = await self.repository.session.scalar(
            select(OverrideKey).where(
                OverrideKey.id == override_id, OverrideKey.project_id == project_id
            )
        )
        if row is None:
            raise override_not_found()
        return row

    async def delete_override(self, project_id: UUID, override_id: UUID) -> None:
        session = self.repository.session
        if not await delete_in_project(session, OverrideKey, project_id, override_id):
            raise override_not_found()
        await self.changes.changed(project_id)


# ------------------------------------------------------------------ the index side


async def load_project_overrides(
    db_config: SQLAlchemyAsyncConfig, vault: Vault, project_id: UUID
) -> list[LoadedOverride]:
    """Every override of ``project_id``, decrypted (one query)."""
    async with db_config.get_session() as session:
        rows = (
            await session.execute(
                select(
                    OverrideKey.id,
                    OverrideKey.conversation_id,
                    OverrideKey.model_prefix,
                    OverrideKey.key_encrypted,
                ).where(OverrideKey.project_id == project_id)
            )
        ).all()
    loaded: list[LoadedOverride] = []
    for row_id, conversation_id, prefix, token in rows:
        try:
            api_key = vault.decrypt(token, override_key_aad(project_id, row_id))
        except VaultError as exc:
            # The message names the key id or the failure, never key material.
            logger.warning(
                "skipping an override key that cannot be decrypted",
                override_id=str(row_id),
                project_id=str(project_id),
                error=str(exc),
            )
            continue
        loaded.append(
            LoadedOverride(
                id=row_id, conversation_id=conversation_id, model_prefix=prefix, api_key=api_key
            )
        )
    return loaded
