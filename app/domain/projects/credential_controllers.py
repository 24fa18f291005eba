"""Projects REST API: the project's API keys and runtime tokens."""

from __future__ import annotations

from uuid import UUID

from litestar import delete, get, post
from litestar.status_codes import HTTP_201_CREATED, HTTP_204_NO_CONTENT

from app.domain.accounts.credential_services import ApiKeyService, RuntimeTokenService
from app.domain.accounts.principals import Principal, UserPrincipal
from app.domain.accounts.revocations import RevocationList
from app.domain.accounts.sync import ApiKeySync
from app.domain.paging import Page, Paging, by_attributes, from_row
from app.domain.projects import lifecycle
from app.domain.projects.schemas import (
    ApiKeyCreate,
    ApiKeyCreated,
    ApiKeyOut,
    RuntimeTokenCreate,
    RuntimeTokenCreated,
    RuntimeTokenOut,
)
from app.domain.projects.services import ProjectAccess
from app.domain.rest import ProjectApiController
from app.lib.settings import Settings
from app.lib.tokens import TokenService


def _creator(principal: Principal) -> UUID | None:
    return principal.user_id if isinstance(principal, UserPrincipal) else None


# The new row's fields, and the secret given once (``key=`` / ``token=``).
key_created = from_row(ApiKeyCreated)
token_created = from_row(RuntimeTokenCreated)


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
        row, secret = await lifecycle.issue_api_key(
            project_id,
            data.name if data else "",
            _creator(principal),
            api_keys_service=api_keys_service,
            api_key_sync=api_key_sync,
        )
        return key_created(row, key=secret)

    @get("/")
    async def list_keys(
        self,
        project_id: UUID,
        access: ProjectAccess,
        api_keys_service: ApiKeyService,
        paging: Paging,
    ) -> Page[ApiKeyOut]:
        rows, total = await api_keys_service.page(project_id, paging.limit, paging.offset)
        return paging.page(rows, total, by_attributes(ApiKeyOut))

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
        ttl = (data.expires_in_seconds if data else None) or settings.runtime_token_ttl_seconds
        row, issued = await runtime_tokens_service.issue(
            tokens=token_service,
            project_id=project_id,
            name=data.name if data else "",
            ttl_seconds=ttl,
            created_by=_creator(principal),
        )
        return token_created(row, token=issued.token)

    @get("/")
    async def list_tokens(
        self,
        project_id: UUID,
        access: ProjectAccess,
        runtime_tokens_service: RuntimeTokenService,
        paging: Paging,
    ) -> Page[RuntimeTokenOut]:
        rows, total = await runtime_tokens_service.page(project_id, paging.limit, paging.offset)
        return paging.page(rows, total, by_attributes(RuntimeTokenOut))

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
