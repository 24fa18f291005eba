"""Custom LLMs as the directory caches them: rows read once per project, keys still
sealed until a call needs them (``load_project_llms`` is the one query per project on
a cache miss)."""

from __future__ import annotations

from dataclasses import dataclass, field
from uuid import UUID

from advanced_alchemy.extensions.litestar import SQLAlchemyAsyncConfig
from sqlalchemy import select

from app.db.models import CustomLlm
from app.domain.custom_llms.names import llm_id
from app.domain.custom_llms.templates import Technical
from app.domain.records import copied
from app.domain.secrets.aad import custom_llm_aad
from app.lib.errors import AronaError
from app.lib.vault import Vault, VaultError


class CustomLlmKeyUnreadableError(AronaError):
    """The stored key exists but this server's vault keys cannot open it."""

    status_code = 500
    default_code = "custom_llm_key_unreadable"


@dataclass(frozen=True, slots=True)
class StoredLlm(Technical):
    """A custom LLM as the directory caches it (key still sealed)."""

    id: UUID
    project_id: UUID
    name: str
    template: str
    enabled: bool
    secret_id: UUID | None
    api_key_encrypted: str | None = field(repr=False)

    @property
    def llm_id(self) -> str:
        """``custom:<name>``."""
        return llm_id(self.name)


def stored_llm(row: CustomLlm) -> StoredLlm:
    return copied(StoredLlm, row)


async def load_project_llms(db_config: SQLAlchemyAsyncConfig, project_id: UUID) -> list[StoredLlm]:
    """Every custom LLM of the project, in one query."""
    async with db_config.get_session() as session:
        rows = await session.scalars(
            select(CustomLlm).where(CustomLlm.project_id == project_id).order_by(CustomLlm.name)
        )
        return [stored_llm(row) for row in rows]


def open_key(vault: Vault, llm: StoredLlm) -> str:
    """The plaintext of a key typed in directly. Never log or return it."""
    if llm.api_key_encrypted is None:
        raise CustomLlmKeyUnreadableError(f"custom LLM {llm.name!r} has no stored key")
    try:
        return vault.decrypt(llm.api_key_encrypted, custom_llm_aad(llm.project_id, llm.id))
    except VaultError:
        raise CustomLlmKeyUnreadableError(
            f"the key of custom LLM {llm.name!r} cannot be decrypted on this server: ask "
            "the operator to check ARONA_VAULT_KEYS"
        ) from None
