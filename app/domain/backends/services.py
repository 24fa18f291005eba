"""Stored backends and aliases: the database side of the routing registry."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol
from uuid import UUID, uuid4

from advanced_alchemy.repository import SQLAlchemyAsyncRepository
from advanced_alchemy.service import SQLAlchemyAsyncRepositoryService

from app.db.models import BackendConfig, ModelAlias
from app.domain.backends.schemas import ValidRegistration
from app.domain.paging import ascending
from app.domain.races import RACED, retry_raced
from app.lib.errors import NotFoundError
from app.lib.vault import Vault, VaultError, aad
from app.routing.types import BackendSpec

AAD_KIND = "backend_config"


def key_aad(row_id: UUID) -> bytes:
    return aad(AAD_KIND, row_id)


def backend_spec(row: BackendConfig, vault: Vault) -> BackendSpec:
    """The routing view of a stored backend; raises ``VaultError`` if the key is unreadable."""
    api_key = None
    if row.api_key_encrypted is not None:
        api_key = vault.decrypt(row.api_key_encrypted, key_aad(row.id))
    return BackendSpec(
        name=row.name,
        kind=row.kind,
        url=row.url,
        api_key=api_key,
        models=tuple(row.models),
        tags=frozenset(row.tags or ()),
        max_concurrency=row.max_concurrency,
    )


def stored_as(row: BackendConfig, registration: ValidRegistration, vault: Vault) -> bool:
    """Whether ``row`` already holds exactly ``registration`` (its key included)."""
    try:
        current = backend_spec(row, vault)
    except VaultError:
        return False  # an unreadable key is worth replacing
    return (
        current.kind == registration.kind
        and current.url == registration.url
        and current.api_key == registration.api_key
        and current.models == registration.models
        and tuple(row.tags or ()) == registration.tags
        and current.max_concurrency == registration.max_concurrency
    )


def _new_row(registration: ValidRegistration, vault: Vault) -> BackendConfig:
    # The id exists before the row does: the key's ciphertext is bound to it.
    row = BackendConfig(id=uuid4(), name=registration.name)
    _fill(row, registration, vault)
    return row


def _fill(row: BackendConfig, registration: ValidRegistration, vault: Vault) -> None:
    row.kind = registration.kind
    row.url = registration.url
    row.models = list(registration.models)
    row.tags = list(registration.tags)
    row.max_concurrency = registration.max_concurrency
    row.api_key_encrypted = (
        None
        if registration.api_key is None
        else vault.encrypt(registration.api_key, key_aad(row.id))
    )


def backend_not_found(name: str) -> NotFoundError:
    return NotFoundError(f"no backend is registered as {name!r}", code="backend_not_found")


class RoutingChanges(Protocol):
    """``RoutingConfigSync``: applies a change here and tells the other replicas."""

    async def backend_changed(self, name: str) -> None: ...

    async def alias_changed(self) -> None: ...


class BackendConfigService(SQLAlchemyAsyncRepositoryService[BackendConfig]):
    class Repo(SQLAlchemyAsyncRepository[BackendConfig]):
        model_type = BackendConfig

    repository_type = Repo
    changes: RoutingChanges | None = None
    """Set by the request's provider: told after every registration and deletion. A
    service made elsewhere (start-up seeding) publishes nothing; its caller does."""

    async def register(self, registration: ValidRegistration, vault: Vault) -> BackendConfig:
        """Register ``registration.name``, replacing everything about an existing one."""
        # Another request can create the same name between our read and insert.
        row = await retry_raced(
            self.repository.session, lambda: self._register(registration, vault)
        )
        await self._changed(row.name)
        return row

    async def _register(self, registration: ValidRegistration, vault: Vault) -> BackendConfig:
        row = await self.get_by_name(registration.name)
        if row is None:
            return await self.create(_new_row(registration, vault), auto_commit=True)
        _fill(row, registration, vault)
        return await self.update(row, auto_commit=True)

    async def create_if_absent(
        self, registration: ValidRegistration, vault: Vault
    ) -> BackendConfig | None:
        """Create ``registration.name`` unless that name exists; None when it did.

        Two processes creating the same name at once (replicas seeding at start-up)
        both end without an error: the loser's insert fails and it keeps the winner's.
        """
        if await self.get_by_name(registration.name) is not None:
            return None
        try:
            return await self.create(_new_row(registration, vault), auto_commit=True)
        except RACED:
            await self.repository.session.rollback()
            return None

    async def get_by_name(self, name: str) -> BackendConfig | None:
        return await self.get_one_or_none(BackendConfig.name == name)

    async def require(self, name: str) -> BackendConfig:
        row = await self.get_by_name(name)
        if row is None:
            raise backend_not_found(name)
        return row

    async def page(self, limit: int, offset: int) -> tuple[Sequence[BackendConfig], int]:
        return await self.get_many_and_count(*ascending("name", limit, offset))

    async def delete_by_name(self, name: str) -> None:
        row = await self.require(name)
        await self.delete(row.id, auto_commit=True)
        await self._changed(name)

    async def _changed(self, name: str) -> None:
        if self.changes is not None:
            await self.changes.backend_changed(name)


def alias_not_found(alias: str) -> NotFoundError:
    return NotFoundError(f"no alias {alias!r} exists", code="alias_not_found")


class AliasService(SQLAlchemyAsyncRepositoryService[ModelAlias]):
    class Repo(SQLAlchemyAsyncRepository[ModelAlias]):
        model_type = ModelAlias

    repository_type = Repo
    changes: RoutingChanges | None = None
    """Set by the request's provider: told after every write."""

    async def set_alias(self, alias: str, target: str) -> ModelAlias:
        row = await retry_raced(self.repository.session, lambda: self._set_alias(alias, target))
        await self._changed()
        return row

    async def _set_alias(self, alias: str, target: str) -> ModelAlias:
        row = await self.get_one_or_none(ModelAlias.alias == alias)
        if row is None:
            return await self.create(ModelAlias(alias=alias, target=target), auto_commit=True)
        row.target = target
        return await self.update(row, auto_commit=True)

    async def page(self, limit: int, offset: int) -> tuple[Sequence[ModelAlias], int]:
        return await self.get_many_and_count(*ascending("alias", limit, offset))

    async def targets(self) -> dict[str, str]:
        return {row.alias: row.target for row in await self.get_many()}

    async def delete_by_alias(self, alias: str) -> None:
        row = await self.get_one_or_none(ModelAlias.alias == alias)
        if row is None:
            raise alias_not_found(alias)
        await self.delete(row.id, auto_commit=True)
        await self._changed()

    async def _changed(self) -> None:
        if self.changes is not None:
            await self.changes.alias_changed()
