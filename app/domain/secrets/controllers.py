"""Secrets API: ``/api/projects/{projectId}/secrets``.

Values are write-only: they go in on create and ``PUT .../value`` and never come
back (responses carry a masked ``hint``). Members read the list; owners, platform
admins and the project's API keys write. Another project's secret is a 404
``secret_not_found``, exactly like a missing one.
"""

from __future__ import annotations

from uuid import UUID

import msgspec
from litestar import delete, get, patch, post, put
from litestar.status_codes import HTTP_201_CREATED, HTTP_204_NO_CONTENT

from app.db.models import ProjectSecret
from app.domain.paging import Page, Paging, from_row
from app.domain.projects.services import ProjectAccess
from app.domain.rest import ProjectApiController
from app.domain.secrets.schemas import (
    SecretCreate,
    SecretOut,
    SecretUpdate,
    SecretValueIn,
)
from app.domain.secrets.services import ProjectSecretService
from app.lib.vault import Vault

# ``used_by`` is given: ``secret_out(row, used_by=[...])``.
secret_out = from_row(SecretOut)


async def _out(service: ProjectSecretService, row: ProjectSecret) -> SecretOut:
    users = await service.users_of(row.project_id, [row.id])
    return secret_out(row, used_by=users.get(row.id, []))


def _require_write(access: ProjectAccess, action: str) -> None:
    access.require(access.can_manage_credentials, action)


class ProjectSecretController(ProjectApiController):
    path = "/api/projects/{project_id:uuid}/secrets"

    @post("/", status_code=HTTP_201_CREATED)
    async def create_secret(
        self,
        data: SecretCreate,
        access: ProjectAccess,
        secrets_service: ProjectSecretService,
        vault: Vault,
    ) -> SecretOut:
        _require_write(access, "create secrets")
        row = await secrets_service.create_secret(
            access.project.id,
            name=data.name,
            value=data.value,
            description=data.description,
            vault=vault,
        )
        return secret_out(row, used_by=[])

    @get("/")
    async def list_secrets(
        self,
        access: ProjectAccess,
        secrets_service: ProjectSecretService,
        paging: Paging,
    ) -> Page[SecretOut]:
        project_id = access.project.id
        rows, total = await secrets_service.page(project_id, paging.limit, paging.offset)
        users = await secrets_service.users_of(project_id, [r.id for r in rows])
        return paging.page(rows, total, lambda r: secret_out(r, used_by=users.get(r.id, [])))

    @get("/{secret_id:uuid}")
    async def get_secret(
        self,
        secret_id: UUID,
        access: ProjectAccess,
        secrets_service: ProjectSecretService,
    ) -> SecretOut:
        row = await secrets_service.require(access.project.id, secret_id)
        return await _out(secrets_service, row)

    @put("/{secret_id:uuid}/value")
    async def replace_value(
        self,
        secret_id: UUID,
        data: SecretValueIn,
        access: ProjectAccess,
        secrets_service: ProjectSecretService,
        vault: Vault,
    ) -> SecretOut:
        _require_write(access, "change secrets")
        project_id = access.project.id
        row = await secrets_service.replace_value(project_id, secret_id, data.value, vault)
        return await _out(secrets_service, row)

    @patch("/{secret_id:uuid}")
    async def update_secret(
        self,
        secret_id: UUID,
        data: SecretUpdate,
        access: ProjectAccess,
        secrets_service: ProjectSecretService,
    ) -> SecretOut:
        _require_write(access, "change secrets")
        description = None if data.description is msgspec.UNSET else data.description
        row = await secrets_service.update_description(access.project.id, secret_id, description)
        return await _out(secrets_service, row)

    @delete("/{secret_id:uuid}", status_code=HTTP_204_NO_CONTENT)
    async def delete_secret(
        self,
        secret_id: UUID,
        access: ProjectAccess,
        secrets_service: ProjectSecretService,
    ) -> None:
        _require_write(access, "delete secrets")
        project_id = access.project.id
        await secrets_service.delete_secret(project_id, secret_id)
