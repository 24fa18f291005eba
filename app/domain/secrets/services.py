"""Project secrets: write-only values sealed by the vault, always filtered by project.

Service API for other areas (custom LLMs resolve ``secretId`` at call time)
==========================================================================

Read a value where it is used, never earlier, and never log or return it::

    from app.domain.secrets.services import SecretResolver

    resolver = SecretResolver(resources.db_config, resources.vault)  # once per app
    api_key = await resolver.reveal(project_id, secret_id)           # per call / cache fill

- ``SecretResolver.reveal(project_id, secret_id) -> str``: the plaintext. Opens its
  own short session (one primary-key query) and ends it before returning, so it is
  safe outside a request and while a stream runs. Raises ``NotFoundError``
  ``secret_not_found`` (404) when the secret does not exist or belongs to another
  project, and ``SecretUnreadableError`` (500 ``secret_unreadable``) when this
  server's ``ARONA_VAULT_KEYS`` cannot open it (the server log names the secret and
  the missing key id; the client sees neither).
- Inside a request that already has a ``ProjectSecretService`` (DI name
  ``secrets_service``): ``await secrets_service.reveal(project_id, secret_id, vault)``,
  same contract on the request's session.

Cache invalidation: after every value replacement (rotation) and every deletion,
the replica that wrote publishes on the ``EventBus`` channel ``CHANNEL``
(``"secrets.changed"``)::

    {"kind": "secret", "projectId": "<project uuid>", "secretId": "<secret uuid>",
     "origin": "<replica id>"}

(the bus adds ``"channel"``). The event carries no value. Whoever caches decrypted
values drops the entry for ``secretId`` on every event, including this replica's
own (``origin`` is the writing replica, not the cache's owner, so do not skip your
"own" events here). Delivery is best-effort: also reload on (re)subscription, e.g.
with ``app.lib.events.follow.follow(bus, CHANNEL, reload=..., apply=...)``.

Associated data of every encrypted column lives in ``app.domain.secrets.aad``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from uuid import UUID, uuid4

import structlog
from advanced_alchemy.extensions.litestar import SQLAlchemyAsyncConfig
from advanced_alchemy.repository import SQLAlchemyAsyncRepository
from advanced_alchemy.service import SQLAlchemyAsyncRepositoryService
from sqlalchemy import select

from app.db.models import CustomLlm, ProjectSecret
from app.domain.queries import delete_in_project, project_page
from app.domain.races import RACED, commit_raced
from app.domain.secrets.aad import secret_aad
from app.domain.secrets.schemas import MAX_VALUE_BYTES, SecretUser
from app.lib.clock import utcnow
from app.lib.errors import AronaError, BadRequestError, ConflictError, NotFoundError
from app.lib.events.base import EventBus
from app.lib.vault import Vault, VaultError, mask

CHANNEL = "secrets.changed"
"""EventBus channel of ``{"kind": "secret", "projectId", "secretId", "origin"}``."""
KIND_SECRET = "secret"  # noqa: S105 (an event kind, not a password)
logger = structlog.get_logger()


class SecretUnreadableError(AronaError):
    """The stored value exists but this server's vault keys cannot open it."""

    status_code = 500
    default_code = "secret_unreadable"


def secret_not_found() -> NotFoundError:
    return NotFoundError("secret not found", code="secret_not_found")


def secret_exists(name: str) -> ConflictError:
    return ConflictError(
        f"a secret named {name!r} already exists in this project",
        code="secret_exists",
        param="name",
    )


def check_value(value: str) -> None:
    """The byte bound the schema cannot express (it counts characters)."""
    if len(value.encode("utf-8")) > MAX_VALUE_BYTES:
        raise BadRequestError(
            f"value must be at most {MAX_VALUE_BYTES} bytes of UTF-8",
            code="value_too_large",
            param="value",
        )


def _unreadable(row: ProjectSecret, exc: VaultError) -> SecretUnreadableError:
    # The operator's half (which key is missing) goes to the log; the vault's messages
    # never carry plaintext or key material.
    logger.error(
        "secret cannot be decrypted",
        project_id=str(row.project_id),
        secret_id=str(row.id),
        error=str(exc),
    )
    return SecretUnreadableError(
        f"secret {row.name!r} cannot be decrypted on this server: ask the operator "
        "to check ARONA_VAULT_KEYS"
    )


def _open(row: ProjectSecret, vault: Vault) -> str:
    try:
        return vault.decrypt(row.value_encrypted, secret_aad(row.project_id, row.id))
    except VaultError as exc:
        raise _unreadable(row, exc) from None


class ProjectSecretService(SQLAlchemyAsyncRepositoryService[ProjectSecret]):
    class Repo(SQLAlchemyAsyncRepository[ProjectSecret]):
        model_type = ProjectSecret

    repository_type = Repo
    changes: SecretChanges | None = None
    """Set by the request's provider: told after every rotation and deletion."""

    # ------------------------------------------------------------- the REST API

    async def create_secret(
        self, project_id: UUID, *, name: str, value: str, description: str, vault: Vault
    ) -> ProjectSecret:
        check_value(value)
        if await self.exists(ProjectSecret.project_id == project_id, ProjectSecret.name == name):
            raise secret_exists(name)
        # The id exists before the row does: the ciphertext is bound to it.
        secret_id = uuid4()
        row = ProjectSecret(
            id=secret_id,
            project_id=project_id,
            name=name,
            description=description,
            value_encrypted=vault.encrypt(value, secret_aad(project_id, secret_id)),
            hint=mask(value),
            rotated_at=None,
        )
        # Another request can create the same name between the check and the insert.
        raced = await commit_raced(self.repository.session, row)
        if raced is not None:
            raise secret_exists(name) from raced
        logger.info("secret created", project_id=str(project_id), secret_id=str(row.id), name=name)
        return row

    async def page(
        self, project_id: UUID, limit: int, offset: int
    ) -> tuple[Sequence[ProjectSecret], int]:
        """By name (unique in the project, so the order is stable)."""
        by_name = [ProjectSecret.name, ProjectSecret.id]
        session = self.repository.session
        return await project_page(session, ProjectSecret, project_id, by_name, limit, offset)

    async def require(self, project_id: UUID, secret_id: UUID) -> ProjectSecret:
        """The project's secret; another project's is a 404 like a missing one."""
        row = await self.get_one_or_none(
            ProjectSecret.id == secret_id, ProjectSecret.project_id == project_id
        )
        if row is None:
            raise secret_not_found()
        return row

    async def users_of(
        self, project_id: UUID, secret_ids: Sequence[UUID]
    ) -> dict[UUID, list[SecretUser]]:
        """The project's custom LLMs that refer to each secret, by name."""
        if not secret_ids:
            return {}
        rows = await self.repository.session.execute(
            select(CustomLlm.secret_id, CustomLlm.id, CustomLlm.name)
            .where(CustomLlm.project_id == project_id, CustomLlm.secret_id.in_(secret_ids))
            .order_by(CustomLlm.name, CustomLlm.id)
        )
        users: dict[UUID, list[SecretUser]] = {}
        for secret_id, llm_id, llm_name in rows:
            if secret_id is not None:
                users.setdefault(secret_id, []).append(SecretUser(id=llm_id, name=llm_name))
        return users

    async def replace_value(
        self, project_id: UUID, secret_id: UUID, value: str, vault: Vault
    ) -> ProjectSecret:
        """Rotation by the owner: a new value, sealed under the newest key."""
        check_value(value)
        row = await self.require(project_id, secret_id)
        row.value_encrypted = vault.encrypt(value, secret_aad(project_id, row.id))
        row.hint = mask(value)
        row.rotated_at = utcnow()
        await self.repository.session.commit()
        logger.info(
            "secret value replaced",
            project_id=str(project_id),
            secret_id=str(row.id),
            name=row.name,
        )
        await self._changed(project_id, row.id)
        return row

    async def update_description(
        self, project_id: UUID, secret_id: UUID, description: str | None
    ) -> ProjectSecret:
        row = await self.require(project_id, secret_id)
        if description is not None:
            row.description = description
            await self.repository.session.commit()
        return row

    async def delete_secret(self, project_id: UUID, secret_id: UUID) -> None:
        """A secret a custom LLM refers to stays (409 ``secret_in_use``)."""
        # Plain values: a rollback below expires the row, and reading an expired
        # attribute would be I/O outside the session's await.
        name = (await self.require(project_id, secret_id)).name
        await self._refuse_if_used(project_id, secret_id, name)
        session = self.repository.session
        try:
            # Deleted meanwhile by another request: a 404 as if it had never been.
            if not await delete_in_project(session, ProjectSecret, project_id, secret_id):
                raise secret_not_found()
        except RACED as exc:
            # A custom LLM started to use it between the check and the delete: the
            # foreign key (ON DELETE RESTRICT) refused.
            await session.rollback()
            await self._refuse_if_used(project_id, secret_id, name)
            raise _in_use(name, []) from exc
        logger.info(
            "secret deleted", project_id=str(project_id), secret_id=str(secret_id), name=name
        )
        await self._changed(project_id, secret_id)

    async def _changed(self, project_id: UUID, secret_id: UUID) -> None:
        if self.changes is not None:
            await self.changes.changed(project_id, secret_id)

    async def _refuse_if_used(self, project_id: UUID, secret_id: UUID, name: str) -> None:
        users = (await self.users_of(project_id, [secret_id])).get(secret_id, [])
        if users:
            raise _in_use(name, users)

    # ------------------------------------------------------------- other areas

    async def reveal(self, project_id: UUID, secret_id: UUID, vault: Vault) -> str:
        """The plaintext, for a call about to be made. Never log or return it."""
        return _open(await self.require(project_id, secret_id), vault)


def _in_use(name: str, users: Sequence[SecretUser]) -> ConflictError:
    if users:
        names = ", ".join(repr(u.name) for u in users)
        what = f"by custom LLM{'s' if len(users) > 1 else ''} {names}"
    else:
        what = "by a custom LLM"
    return ConflictError(
        f"secret {name!r} is in use {what}: point them at another secret or delete them first",
        code="secret_in_use",
    )


class SecretResolver:
    """``reveal(project_id, secret_id)`` on a session of its own (see the module doc)."""

    __slots__ = ("_db_config", "_vault")

    def __init__(self, db_config: SQLAlchemyAsyncConfig, vault: Vault) -> None:
        self._db_config = db_config
        self._vault = vault

    async def reveal(self, project_id: UUID, secret_id: UUID) -> str:
        async with self._db_config.get_session() as session:
            row = await session.scalar(
                select(ProjectSecret).where(
                    ProjectSecret.id == secret_id, ProjectSecret.project_id == project_id
                )
            )
            # End the read transaction now: the caller is about to make a slow call.
            await session.commit()
        if row is None:
            raise secret_not_found()
        return _open(row, self._vault)


SecretListener = Callable[[UUID], None]
"""``(project_id)``: a cache of this process that holds something opened from the
project's secrets (the custom LLMs area registers one as the ``secret_listeners``
dependency; this area imports none of them)."""


class SecretChanges:
    """Publishes ``secrets.changed`` after a rotation or deletion (see the module doc)."""

    __slots__ = ("_bus", "_local", "origin")

    def __init__(
        self,
        bus: EventBus,
        origin: str | None = None,
        local: Sequence[SecretListener] = (),
    ) -> None:
        self._bus = bus
        self._local = tuple(local)
        """Caches of this process dropped before the write is answered, so the
        writer's next call already sees the new value (the bus event is later)."""
        self.origin = origin or uuid4().hex
        """The writing replica's id in every event."""

    async def changed(self, project_id: UUID, secret_id: UUID) -> None:
        for drop in self._local:
            drop(project_id)
        event = {
            "kind": KIND_SECRET,
            "projectId": str(project_id),
            "secretId": str(secret_id),
            "origin": self.origin,
        }
        try:
            await self._bus.publish(CHANNEL, event)
        except Exception as exc:  # a hint channel: the write itself has succeeded
            logger.warning(
                "could not publish a secret change", secret_id=str(secret_id), error=repr(exc)
            )
