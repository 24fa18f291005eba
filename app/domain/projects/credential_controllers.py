"""Projects REST API: the project's API keys and runtime tokens."""

from __future__ import annotations

import datetime
import math
from collections.abc import Callable, Sequence
from typing import TypeVar
from uuid import UUID

import msgspec
from litestar import delete, get, patch, post
from litestar.status_codes import HTTP_201_CREATED, HTTP_204_NO_CONTENT

from app.db.models import ApiKey, RuntimeToken
from app.domain.accounts.credential_services import ApiKeyService, RuntimeTokenService
from app.domain.accounts.governance import budget_text, valid_governance
from app.domain.accounts.principals import ApiKeyPrincipal, Principal, UserPrincipal
from app.domain.accounts.revocations import RevocationList
from app.domain.accounts.runtime_policies import RuntimePolicySync
from app.domain.accounts.sync import ApiKeySync
from app.domain.paging import Page, Paging, from_row
from app.domain.projects import lifecycle
from app.domain.projects.schemas import (
    ApiKeyCreate,
    ApiKeyCreated,
    ApiKeyOut,
    ApiKeyUpdate,
    RuntimeTokenCreate,
    RuntimeTokenCreated,
    RuntimeTokenOut,
    RuntimeTokenUpdate,
)
from app.domain.projects.services import ProjectAccess
from app.domain.rest import ProjectApiController
from app.domain.usage.key_spend import KeySpend, spend_out
from app.domain.usage.schemas import SpendOut
from app.domain.usage.services import UsageRecordService
from app.lib.clock import utcnow
from app.lib.errors import BadRequestError, PermissionDeniedError
from app.lib.settings import Settings
from app.lib.tokens import TokenService

Credential = TypeVar("Credential", ApiKey, RuntimeToken)
Out = TypeVar("Out", ApiKeyOut, RuntimeTokenOut)

MIN_TOKEN_SECONDS = 60
MAX_TOKEN_SECONDS = 366 * 24 * 3600


def _unrestricted(principal: Principal, action: str) -> None:
    """A key with limits of its own may not issue or edit credentials: it could mint
    itself an unlimited twin or lift its own limits."""
    if isinstance(principal, ApiKeyPrincipal) and principal.policy.restricted:
        raise PermissionDeniedError(
            f"an API key with limits or an expiry may not {action}; use an unrestricted "
            "key or a user token",
            code="key_restricted",
        )


def _creator(principal: Principal) -> UUID | None:
    return principal.user_id if isinstance(principal, UserPrincipal) else None


def _budget(row: object) -> str | None:
    return budget_text(getattr(row, "budget_micros", None))


def _same(out: Out) -> Out:
    return out


# The new row's fields, and the secret given once (``key=`` / ``token=``).
key_created = from_row(ApiKeyCreated, budget=_budget)
token_created = from_row(RuntimeTokenCreated, budget=_budget)
key_out = from_row(ApiKeyOut, budget=_budget)
token_out = from_row(RuntimeTokenOut, budget=_budget)


def _spend(row: ApiKey | RuntimeToken, spend: KeySpend, now: datetime.datetime) -> SpendOut:
    return spend_out(
        spend, budget_micros=row.budget_micros, budget_period=row.budget_period, now=now
    )


async def _with_spend(
    project_id: UUID,
    rows: Sequence[Credential],
    usage_records_service: UsageRecordService,
    to_out: Callable[..., Out],
) -> list[Out]:
    """``rows`` as ``to_out`` shows them, each with its spend: one usage statement for
    all of them, whatever their number."""
    now = utcnow()
    spends = await usage_records_service.key_spend(project_id, [r.id for r in rows], now=now)
    return [to_out(row, spend=_spend(row, spends[row.id], now)) for row in rows]


class ApiKeyController(ProjectApiController):
    path = "/api/projects/{project_id:uuid}/api-keys"

    @post("/", status_code=HTTP_201_CREATED)
    async def create_key(
        self,
        project_id: UUID,
        access: ProjectAccess,
        principal: Principal,
        api_keys_service: ApiKeyService,
        api_key_sync: ApiKeySync,
        data: ApiKeyCreate | None = None,
    ) -> ApiKeyCreated:
        access.require(access.can_manage_credentials, "create API keys")
        _unrestricted(principal, "create API keys")
        body = data or ApiKeyCreate()
        row, secret = await lifecycle.issue_api_key(
            project_id,
            body.name,
            _creator(principal),
            api_keys_service=api_keys_service,
            api_key_sync=api_key_sync,
            governance=valid_governance(body, now=utcnow()),
        )
        return key_created(row, key=secret)

    @get("/{key_id:uuid}")
    async def get_key(
        self,
        project_id: UUID,
        access: ProjectAccess,
        key_id: UUID,
        api_keys_service: ApiKeyService,
        usage_records_service: UsageRecordService,
    ) -> ApiKeyOut:
        row = await api_keys_service.get_in_project(project_id, key_id)
        (out,) = await _with_spend(project_id, [row], usage_records_service, key_out)
        return out

    @patch("/{key_id:uuid}")
    async def update_key(
        self,
        project_id: UUID,
        access: ProjectAccess,
        key_id: UUID,
        data: ApiKeyUpdate,
        principal: Principal,
        api_keys_service: ApiKeyService,
        api_key_sync: ApiKeySync,
        usage_records_service: UsageRecordService,
    ) -> ApiKeyOut:
        """Change a key's limits, expiry, labels or name; the key itself stays the same.
        Unsent fields are kept, ``null`` clears one."""
        access.require(access.can_manage_credentials, "edit API keys")
        _unrestricted(principal, "edit API keys")
        current = await api_keys_service.get_in_project(project_id, key_id)
        values = valid_governance(data, now=utcnow(), current_period=current.budget_period)
        if data.name is not msgspec.UNSET:
            values["name"] = data.name
        row = await lifecycle.change_api_key(
            project_id, key_id, values, api_keys_service=api_keys_service, api_key_sync=api_key_sync
        )
        (out,) = await _with_spend(project_id, [row], usage_records_service, key_out)
        return out

    @get("/")
    async def list_keys(
        self,
        project_id: UUID,
        access: ProjectAccess,
        api_keys_service: ApiKeyService,
        usage_records_service: UsageRecordService,
        paging: Paging,
    ) -> Page[ApiKeyOut]:
        """Each key with its spend this period (``spend``)."""
        rows, total = await api_keys_service.page(project_id, paging.limit, paging.offset)
        items = await _with_spend(project_id, rows, usage_records_service, key_out)
        return paging.page(items, total, _same)

    @delete("/{key_id:uuid}", status_code=HTTP_204_NO_CONTENT)
    async def revoke_key(
        self,
        project_id: UUID,
        access: ProjectAccess,
        key_id: UUID,
        principal: Principal,
        api_keys_service: ApiKeyService,
        api_key_sync: ApiKeySync,
    ) -> None:
        access.require(access.can_manage_credentials, "revoke API keys")
        await lifecycle.revoke_api_key(
            project_id, key_id, api_keys_service=api_keys_service, api_key_sync=api_key_sync
        )


class RuntimeTokenController(ProjectApiController):
    path = "/api/projects/{project_id:uuid}/runtime-tokens"

    @post("/", status_code=HTTP_201_CREATED)
    async def create_token(
        self,
        project_id: UUID,
        access: ProjectAccess,
        principal: Principal,
        runtime_tokens_service: RuntimeTokenService,
        token_service: TokenService,
        settings: Settings,
        data: RuntimeTokenCreate | None = None,
    ) -> RuntimeTokenCreated:
        access.require(access.can_manage_credentials, "issue runtime tokens")
        _unrestricted(principal, "issue runtime tokens")
        body = data or RuntimeTokenCreate()
        now = utcnow()
        governance = valid_governance(body, now=now)
        ttl = body.expires_in_seconds or settings.runtime_token_ttl_seconds
        expires_at = governance.pop("expires_at", None)
        if expires_at is not None:
            if body.expires_in_seconds is not None:
                raise BadRequestError(
                    "send expiresAt or expiresInSeconds, not both",
                    code="invalid_expiry",
                    param="expiresAt",
                )
            ttl = math.ceil((expires_at - now).total_seconds())
            if not MIN_TOKEN_SECONDS <= ttl <= MAX_TOKEN_SECONDS:
                raise BadRequestError(
                    "a runtime token lives between one minute and one year",
                    code="invalid_expiry",
                    param="expiresAt",
                )
        row, issued = await runtime_tokens_service.issue(
            tokens=token_service,
            project_id=project_id,
            name=body.name,
            ttl_seconds=ttl,
            created_by=_creator(principal),
            governance=governance,
        )
        return token_created(row, token=issued.token)

    @get("/{token_id:uuid}")
    async def get_token(
        self,
        project_id: UUID,
        access: ProjectAccess,
        token_id: UUID,
        runtime_tokens_service: RuntimeTokenService,
        usage_records_service: UsageRecordService,
    ) -> RuntimeTokenOut:
        row = await runtime_tokens_service.get_in_project(project_id, token_id)
        (out,) = await _with_spend(project_id, [row], usage_records_service, token_out)
        return out

    @patch("/{token_id:uuid}")
    async def update_token(
        self,
        project_id: UUID,
        access: ProjectAccess,
        token_id: UUID,
        data: RuntimeTokenUpdate,
        principal: Principal,
        runtime_tokens_service: RuntimeTokenService,
        runtime_policy_sync: RuntimePolicySync,
        usage_records_service: UsageRecordService,
    ) -> RuntimeTokenOut:
        """Change a token's limits, labels or name, or move its expiry earlier."""
        access.require(access.can_manage_credentials, "edit runtime tokens")
        _unrestricted(principal, "edit runtime tokens")
        current = await runtime_tokens_service.get_in_project(project_id, token_id)
        values = valid_governance(data, now=utcnow(), current_period=current.budget_period)
        if data.name is not msgspec.UNSET:
            values["name"] = data.name
        row = await lifecycle.change_runtime_token(
            project_id,
            token_id,
            values,
            runtime_tokens_service=runtime_tokens_service,
            runtime_policy_sync=runtime_policy_sync,
        )
        (out,) = await _with_spend(project_id, [row], usage_records_service, token_out)
        return out

    @get("/")
    async def list_tokens(
        self,
        project_id: UUID,
        access: ProjectAccess,
        runtime_tokens_service: RuntimeTokenService,
        usage_records_service: UsageRecordService,
        paging: Paging,
    ) -> Page[RuntimeTokenOut]:
        """Each token with what its runtime chats spent this period (``spend``)."""
        rows, total = await runtime_tokens_service.page(project_id, paging.limit, paging.offset)
        items = await _with_spend(project_id, rows, usage_records_service, token_out)
        return paging.page(items, total, _same)

    @delete("/{token_id:uuid}", status_code=HTTP_204_NO_CONTENT)
    async def revoke_token(
        self,
        project_id: UUID,
        access: ProjectAccess,
        token_id: UUID,
        runtime_tokens_service: RuntimeTokenService,
        revocations: RevocationList,
    ) -> None:
        access.require(access.can_manage_credentials, "revoke runtime tokens")
        await lifecycle.revoke_runtime_token(
            project_id,
            token_id,
            runtime_tokens_service=runtime_tokens_service,
            revocations=revocations,
        )
