"""A project's custom LLMs in the database, always filtered by project.

The write rules (templates, credentials, name conflicts with suggestions, names the
platform uses (``platform_names``), the SSRF check of base URLs) live here; the
controllers check roles and then tell
``CustomLlmSync`` so every replica's directory and catalog drop the project.
``app.domain.custom_llms.stored`` holds what the directory caches and loads.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import cast
from uuid import UUID, uuid4

import msgspec
from advanced_alchemy.repository import SQLAlchemyAsyncRepository
from advanced_alchemy.service import SQLAlchemyAsyncRepositoryService
from sqlalchemy import select

from app.db.models import CustomLlm, Project, ProjectSecret
from app.domain.custom_llms.names import custom_llm_not_found, name_taken, suggest_names
from app.domain.custom_llms.platform_names import platform_uses
from app.domain.custom_llms.schemas import Credential, CustomLlmCreate, CustomLlmUpdate
from app.domain.custom_llms.templates import (
    BOB,
    BOB_DEFAULT_NAME,
    CUSTOM_DEFAULT_MAX_INPUT_TOKENS,
    CUSTOM_DEFAULT_MAX_OUTPUT_TOKENS,
    CUSTOM_DEFAULT_PROVIDER,
    TECHNICAL_FIELDS,
    Technical,
    locked_field,
)
from app.domain.queries import project_page
from app.domain.races import commit_raced
from app.domain.records import field_values
from app.domain.secrets.aad import custom_llm_aad
from app.lib.errors import AronaError, BadRequestError, ConflictError, NotFoundError
from app.lib.replicated_cache import UNPUBLISHED, Changes
from app.lib.ssrf import UnsafeUrlError, UrlGuard
from app.lib.vault import Vault, mask
from app.routing.types import AuthScheme

SUGGESTION_ROUNDS = 5
"""Suggestions are drawn again while the platform uses one of them, at most this often
(then those it uses are left out)."""
# ------------------------------------------------------------------ rules


def _given(value: object) -> bool:
    return value is not msgspec.UNSET


def _refuse_locked(data: CustomLlmCreate | CustomLlmUpdate, template: str) -> None:
    for param, attr in TECHNICAL_FIELDS:
        if _given(getattr(data, attr)):
            raise locked_field(param, template)


def _required(param: str) -> BadRequestError:
    return BadRequestError(f"`{param}` is required", code="invalid_request", param=param)


def _url_error(exc: UnsafeUrlError) -> BadRequestError:
    return BadRequestError(f"baseUrl: {exc.message}", code=exc.code, param="baseUrl")


def _check_credentials_pair(api_key: object, secret_id: object) -> None:
    if api_key not in (msgspec.UNSET, None) and secret_id not in (msgspec.UNSET, None):
        raise BadRequestError(
            "send either apiKey or secretId, not both",
            code="credentials_conflict",
            param="secretId",
        )


def credential_of(row: CustomLlm) -> Credential:
    if row.secret_id is not None:
        return "secret"
    if row.api_key_encrypted is not None:
        return "apiKey"
    return "none"


@dataclass(slots=True)
class _Credentials:
    """What a write leaves stored (``api_key`` is the new plaintext to seal, if any)."""

    secret_id: UUID | None = None
    api_key: str | None = field(default=None, repr=False)
    keep_sealed: bool = False
    """Keep the row's sealed key as it is."""


class CustomLlmService(SQLAlchemyAsyncRepositoryService[CustomLlm]):
    class Repo(SQLAlchemyAsyncRepository[CustomLlm]):
        model_type = CustomLlm

    repository_type = Repo
    changes: Changes = UNPUBLISHED
    """``CustomLlmSync`` (set by the request's provider): told after every write."""

    # ----------------------------------------------------------------- reads

    async def page(
        self, project_id: UUID, limit: int, offset: int
    ) -> tuple[Sequence[CustomLlm], int]:
        """By name (unique in the project, so the order is stable)."""
        session = self.repository.session
        return await project_page(session, CustomLlm, project_id, [CustomLlm.name], limit, offset)

    async def require(self, project_id: UUID, name: str) -> CustomLlm:
        """The project's custom LLM; another project's is a 404 like a missing one."""
        row = await self.get_one_or_none(CustomLlm.project_id == project_id, CustomLlm.name == name)
        if row is None:
            raise custom_llm_not_found()
        return row

    async def suggestions(self, project: Project, name: str) -> list[str]:
        """Free names near ``name``: not taken in the project, nor on the platform."""
        session = self.repository.session
        taken = set(
            await session.scalars(select(CustomLlm.name).where(CustomLlm.project_id == project.id))
        )
        used: dict[str, str] = {}
        for _ in range(SUGGESTION_ROUNDS):
            offered = suggest_names(name, project.slug, taken)
            used = await platform_uses(session, offered)
            if not used:
                return offered
            taken.update(used)
        return [n for n in offered if n not in used]

    async def _check_free(self, project: Project, name: str) -> None:
        """409 ``custom_llm_exists`` with free names when ``name`` is taken in the
        project or used by the platform (``platform_names``)."""
        if await self.exists(CustomLlm.project_id == project.id, CustomLlm.name == name):
            raise name_taken(name, await self.suggestions(project, name))
        used = await platform_uses(self.repository.session, (name,))
        if name in used:
            raise name_taken(name, await self.suggestions(project, name), used[name])

    # ---------------------------------------------------------------- writes

    async def create_llm(
        self, project: Project, data: CustomLlmCreate, *, vault: Vault, guard: UrlGuard
    ) -> CustomLlm:
        if data.template == "bob":
            _refuse_locked(data, "bob")
            technical = BOB
            name = data.name if _given(data.name) else BOB_DEFAULT_NAME
        else:
            technical, name = await self._custom_fields(data, guard)
        _check_credentials_pair(data.api_key, data.secret_id)
        credentials = await self._credentials(
            project.id,
            technical.auth_scheme,
            api_key=data.api_key,
            secret_id=data.secret_id,
            current=None,
        )
        name = cast(str, name)
        await self._check_free(project, name)
        row_id = uuid4()
        row = CustomLlm(
            id=row_id,
            project_id=project.id,
            name=name,
            template=data.template,
            enabled=data.enabled,
            **field_values(Technical, technical),
        )
        self._store_credentials(row, credentials, vault)
        raced = await commit_raced(self.repository.session, row)
        if raced is not None:
            raise await self._raced(project, name, credentials) from raced
        await self.changes.changed(project.id)
        return row

    async def update_llm(
        self,
        project: Project,
        name: str,
        data: CustomLlmUpdate,
        *,
        vault: Vault,
        guard: UrlGuard,
    ) -> CustomLlm:
        row = await self.require(project.id, name)
        if _given(data.template):
            raise locked_field("template", row.template)
        if row.template == "bob":
            _refuse_locked(data, "bob")
        else:
            await self._apply_custom_fields(row, data, guard)
        _check_credentials_pair(data.api_key, data.secret_id)
        credentials = await self._credentials(
            project.id,
            cast(AuthScheme, row.auth_scheme),
            api_key=data.api_key,
            secret_id=data.secret_id,
            current=row,
        )
        new_name = data.name if _given(data.name) else row.name
        new_name = cast(str, new_name)
        if new_name != row.name:
            await self._check_free(project, new_name)
        row.name = new_name
        if _given(data.enabled):
            row.enabled = cast(bool, data.enabled)
        self._store_credentials(row, credentials, vault)
        raced = await commit_raced(self.repository.session)
        if raced is not None:
            raise await self._raced(project, new_name, credentials) from raced
        await self.changes.changed(project.id)
        return row

    async def delete_llm(self, project_id: UUID, name: str) -> None:
        row = await self.require(project_id, name)
        await self.delete(row.id, auto_commit=True)
        await self.changes.changed(project_id)

    # ------------------------------------------------------------- internals

    async def _custom_fields(self, data: CustomLlmCreate, guard: UrlGuard) -> tuple[Technical, str]:
        if not _given(data.name):
            raise _required("name")
        if not _given(data.base_url):
            raise _required("baseUrl")
        if not _given(data.model):
            raise _required("model")
        base_url = cast(str, data.base_url)
        try:
            await guard.check(base_url)
        except UnsafeUrlError as exc:
            raise _url_error(exc) from None
        technical = Technical(
            base_url=base_url,
            model=cast(str, data.model),
            auth_scheme=cast(
                AuthScheme, data.auth_scheme if _given(data.auth_scheme) else "bearer"
            ),
            provider=cast(str, data.provider if _given(data.provider) else CUSTOM_DEFAULT_PROVIDER),
            max_input_tokens=cast(
                int,
                data.max_input_tokens
                if _given(data.max_input_tokens)
                else CUSTOM_DEFAULT_MAX_INPUT_TOKENS,
            ),
            max_output_tokens=cast(
                int,
                data.max_output_tokens
                if _given(data.max_output_tokens)
                else CUSTOM_DEFAULT_MAX_OUTPUT_TOKENS,
            ),
        )
        return technical, cast(str, data.name)

    async def _apply_custom_fields(
        self, row: CustomLlm, data: CustomLlmUpdate, guard: UrlGuard
    ) -> None:
        if _given(data.base_url) and data.base_url != row.base_url:
            base_url = cast(str, data.base_url)
            try:
                await guard.check(base_url)
            except UnsafeUrlError as exc:
                raise _url_error(exc) from None
            row.base_url = base_url
        for _, attr in TECHNICAL_FIELDS:
            value = getattr(data, attr)
            if attr != "base_url" and _given(value):
                setattr(row, attr, value)

    async def _credentials(
        self,
        project_id: UUID,
        scheme: AuthScheme,
        *,
        api_key: object,
        secret_id: object,
        current: CustomLlm | None,
    ) -> _Credentials:
        """The credential a write leaves, by the rules: ``none`` takes no key (one
        sent is refused, a stored one dropped); every other scheme needs exactly one,
        a secret of this project (checked) or a key typed in."""
        if scheme == "none":
            for param, value in (("apiKey", api_key), ("secretId", secret_id)):
                if value not in (msgspec.UNSET, None):
                    raise BadRequestError(
                        "authScheme `none` sends no credential: leave out apiKey and secretId",
                        code="credentials_not_used",
                        param=param,
                    )
            return _Credentials()
        if isinstance(secret_id, UUID):
            await self._require_secret(project_id, secret_id)
            return _Credentials(secret_id=secret_id)
        if isinstance(api_key, str):
            return _Credentials(api_key=api_key)
        # Nothing new: keep what is stored unless the request cleared it.
        if current is not None:
            if current.secret_id is not None and secret_id is msgspec.UNSET:
                return _Credentials(secret_id=current.secret_id)
            if current.api_key_encrypted is not None and api_key is msgspec.UNSET:
                return _Credentials(keep_sealed=True)
        raise BadRequestError(
            f"authScheme `{scheme}` needs a credential: send secretId (a secret of this "
            "project) or apiKey",
            code="credentials_required",
            param="apiKey",
        )

    async def _require_secret(self, project_id: UUID, secret_id: UUID) -> None:
        found = await self.repository.session.scalar(
            select(ProjectSecret.id).where(
                ProjectSecret.id == secret_id, ProjectSecret.project_id == project_id
            )
        )
        if found is None:
            raise NotFoundError(
                "no secret with this id exists in this project",
                code="secret_not_found",
                param="secretId",
            )

    @staticmethod
    def _store_credentials(row: CustomLlm, credentials: _Credentials, vault: Vault) -> None:
        row.secret_id = credentials.secret_id
        if credentials.keep_sealed:
            return
        if credentials.api_key is None:
            row.api_key_encrypted = None
            row.api_key_hint = None
            return
        row.api_key_encrypted = vault.encrypt(
            credentials.api_key, custom_llm_aad(row.project_id, row.id)
        )
        row.api_key_hint = mask(credentials.api_key)

    async def _raced(self, project: Project, name: str, credentials: _Credentials) -> AronaError:
        """Why a commit failed after the checks passed: the name was taken meanwhile,
        or the secret was deleted meanwhile."""
        if await self.exists(CustomLlm.project_id == project.id, CustomLlm.name == name):
            return name_taken(name, await self.suggestions(project, name))
        if credentials.secret_id is not None:
            return NotFoundError(
                "no secret with this id exists in this project",
                code="secret_not_found",
                param="secretId",
            )
        return ConflictError("the custom LLM changed meanwhile; try again", code="conflict")
