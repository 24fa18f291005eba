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

from litestar import Controller, delete, get, patch, post
from litestar.status_codes import HTTP_200_OK, HTTP_201_CREATED, HTTP_204_NO_CONTENT

from app.db.models import CustomLlm
from app.domain.custom_llms.names import llm_id
from app.domain.custom_llms.schemas import (
    CustomLlmCreate,
    CustomLlmOut,
    CustomLlmTestOut,
    CustomLlmUpdate,
)
from app.domain.custom_llms.services import CustomLlmService, credential_of
from app.domain.custom_llms.setup import CustomLlms
from app.domain.paging import Page, Paging
from app.domain.projects.services import ProjectAccess
from app.domain.rest import project_dependencies
from app.lib.errors import ERRORS_OPT
from app.lib.vault import Vault


def custom_llm_out(row: CustomLlm) -> CustomLlmOut:
    return CustomLlmOut(
        id=row.id,
        project_id=row.project_id,
        name=row.name,
        llm_id=llm_id(row.name),
        template=row.template,
        base_url=row.base_url,
        model=row.model,
        auth_scheme=row.auth_scheme,
        provider=row.provider,
        max_input_tokens=row.max_input_tokens,
        max_output_tokens=row.max_output_tokens,
        enabled=row.enabled,
        credential=credential_of(row),
        secret_id=row.secret_id,
        api_key_hint=row.api_key_hint if row.secret_id is None else None,
        created_at=row.created_at,
        updated_at=row.updated_at,
    )


class CustomLlmController(Controller):
    path = "/api/projects/{project_id:uuid}/custom-llms"
    tags = ["projects"]
    dependencies = project_dependencies()

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
