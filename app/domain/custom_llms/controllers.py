"""Projects REST API: a project's custom LLMs (``/api/projects/{projectId}/custom-llms``).

Members (and anyone who can see the project) read; owners, platform admins and the
project's API keys write, and run the test call (it spends the project's key). A
custom LLM is addressed by its name; another project's is a 404
``custom_llm_not_found`` like a missing one. Every write goes to the database, then
drops the project from this replica's directory and catalog at once and from the
other replicas' through ``CustomLlmSync``.
"""

from __future__ import annotations

from uuid import UUID

from litestar import delete, get, patch, post
from litestar.status_codes import HTTP_200_OK, HTTP_201_CREATED, HTTP_204_NO_CONTENT

from app.domain.custom_llms.names import llm_id
from app.domain.custom_llms.schemas import (
    CustomLlmCreate,
    CustomLlmOut,
    CustomLlmTestOut,
    CustomLlmUpdate,
)
from app.domain.custom_llms.services import CustomLlmService, credential_of
from app.domain.custom_llms.setup import CustomLlms
from app.domain.paging import Page, Paging, from_row
from app.domain.projects.services import ProjectAccess
from app.domain.rest import ProjectApiController
from app.lib.errors import ERRORS_OPT
from app.lib.vault import Vault

custom_llm_out = from_row(
    CustomLlmOut,
    llm_id=lambda row: llm_id(row.name),
    credential=credential_of,
    # A key stored with the LLM shows its hint; a referenced secret has its own.
    api_key_hint=lambda row: row.api_key_hint if row.secret_id is None else None,
)


class CustomLlmController(ProjectApiController):
    path = "/api/projects/{project_id:uuid}/custom-llms"

    @post("/", status_code=HTTP_201_CREATED)
    async def create_custom_llm(
        self,
        project_id: UUID,
        access: ProjectAccess,
        data: CustomLlmCreate,
        custom_llms_service: CustomLlmService,
        custom_llms: CustomLlms,
        vault: Vault,
    ) -> CustomLlmOut:
        access.require(access.can_manage_credentials, "create custom LLMs")
        row = await custom_llms_service.create_llm(
            access.project, data, vault=vault, guard=custom_llms.guard
        )
        return custom_llm_out(row)

    @get("/")
    async def list_custom_llms(
        self,
        project_id: UUID,
        access: ProjectAccess,
        custom_llms_service: CustomLlmService,
        paging: Paging,
    ) -> Page[CustomLlmOut]:
        rows, total = await custom_llms_service.page(project_id, paging.limit, paging.offset)
        return paging.page(rows, total, custom_llm_out)

    @get("/{name:str}")
    async def get_custom_llm(
        self,
        project_id: UUID,
        access: ProjectAccess,
        name: str,
        custom_llms_service: CustomLlmService,
    ) -> CustomLlmOut:
        return custom_llm_out(await custom_llms_service.require(project_id, name))

    @patch("/{name:str}")
    async def update_custom_llm(
        self,
        project_id: UUID,
        access: ProjectAccess,
        name: str,
        data: CustomLlmUpdate,
        custom_llms_service: CustomLlmService,
        custom_llms: CustomLlms,
        vault: Vault,
    ) -> CustomLlmOut:
        access.require(access.can_manage_credentials, "change custom LLMs")
        row = await custom_llms_service.update_llm(
            access.project, name, data, vault=vault, guard=custom_llms.guard
        )
        return custom_llm_out(row)

    @delete("/{name:str}", status_code=HTTP_204_NO_CONTENT)
    async def delete_custom_llm(
        self,
        project_id: UUID,
        access: ProjectAccess,
        name: str,
        custom_llms_service: CustomLlmService,
    ) -> None:
        access.require(access.can_manage_credentials, "delete custom LLMs")
        await custom_llms_service.delete_llm(project_id, name)

    @post("/{name:str}/test", status_code=HTTP_200_OK, opt={ERRORS_OPT: (502,)})
    async def test_custom_llm(
        self,
        project_id: UUID,
        access: ProjectAccess,
        name: str,
        custom_llms_service: CustomLlmService,
        custom_llms: CustomLlms,
    ) -> CustomLlmTestOut:
        access.require(access.can_manage_credentials, "test custom LLMs")
        return await custom_llms.test(custom_llms_service, project_id, name)
