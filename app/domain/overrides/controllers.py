"""``/api/projects/{projectId}/overrides``: a project's BYO provider keys.

- ``POST /`` (201): ``{"conversationId", "modelId", "apiKey"}``. The key is sealed with
  the vault and never returned; a second key for the same conversation and modelId is
  a 409 ``override_exists`` (delete the old one to replace it).
- ``GET /`` (paginated, newest first, optional ``conversationId`` filter) and
  ``GET /{overrideId}``: ``{"id", "conversationId", "modelId", "keyHint",
  "createdAt"}``, the hint being ``••••`` and the key's last four characters.
- ``DELETE /{overrideId}`` (204).

Reading needs any role in the project; writing needs owner, platform admin or the
project's API key (as for the project's other credentials). A project the caller
cannot see is a 404 ``project_not_found``; another project's override a 404
``override_not_found``. Every write drops the project's entry from the override
index here and, through ``OverrideSync``, on the other replicas.
"""

from __future__ import annotations

from typing import Annotated
from uuid import UUID

from litestar import delete, get, post
from litestar.params import QueryParameter
from litestar.status_codes import HTTP_201_CREATED, HTTP_204_NO_CONTENT

from app.domain.overrides.schemas import MAX_TARGET, OverrideCreate, OverrideOut
from app.domain.overrides.services import OverrideService
from app.domain.paging import Page, Paging, from_row
from app.domain.projects.services import ProjectAccess
from app.domain.rest import ProjectApiController
from app.lib.errors import BadRequestError
from app.lib.vault import Vault

# Checked in the handler: Litestar would name the argument (``conversation_id``) in a 400.
ConversationFilter = Annotated[str | None, QueryParameter(name="conversationId")]


def _conversation_filter(value: str | None) -> str | None:
    if value is not None and not 1 <= len(value) <= MAX_TARGET:
        raise BadRequestError(
            f"conversationId must be 1-{MAX_TARGET} characters",
            code="invalid_request",
            param="conversationId",
        )
    return value


override_out = from_row(OverrideOut, model_id=lambda row: row.model_prefix)


class OverrideController(ProjectApiController):
    path = "/api/projects/{project_id:uuid}/overrides"

    @post("/", status_code=HTTP_201_CREATED)
    async def create_override(
        self,
        access: ProjectAccess,
        data: OverrideCreate,
        overrides_service: OverrideService,
        vault: Vault,
    ) -> OverrideOut:
        access.require(access.can_manage_credentials, "create override keys")
        row = await overrides_service.create_override(access.project.id, data, vault)
        return override_out(row)

    @get("/")
    async def list_overrides(
        self,
        access: ProjectAccess,
        overrides_service: OverrideService,
        paging: Paging,
        conversation_id: ConversationFilter = None,
    ) -> Page[OverrideOut]:
        wanted = _conversation_filter(conversation_id)
        rows, total = await overrides_service.page(
            access.project.id, paging.limit, paging.offset, conversation_id=wanted
        )
        return paging.page(rows, total, override_out)

    @get("/{override_id:uuid}")
    async def get_override(
        self,
        access: ProjectAccess,
        override_id: UUID,
        overrides_service: OverrideService,
    ) -> OverrideOut:
        return override_out(await overrides_service.require(access.project.id, override_id))

    @delete("/{override_id:uuid}", status_code=HTTP_204_NO_CONTENT)
    async def delete_override(
        self,
        access: ProjectAccess,
        override_id: UUID,
        overrides_service: OverrideService,
    ) -> None:
        access.require(access.can_manage_credentials, "delete override keys")
        await overrides_service.delete_override(access.project.id, override_id)
