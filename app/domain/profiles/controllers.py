"""Model profiles over HTTP.

- ``/api/admin/model-profiles``: platform admins create, read, change and delete
  profiles. Deleting one that another profile names (fallback, failover chain) is a
  409 ``profile_in_use``; projects naming it (default, enabled list) are cleaned up in
  the same transaction.
- ``/api/projects/{projectId}/models``: a project's default profile and enabled set
  (read: any member or the project's API key; write: owners and admins).
- ``GET /api/runtime/llms``: the runtime catalog (runtime JWT only), from memory.

Every write goes to the database first, then to this replica's table and catalog at
once, then to the other replicas through ``ProfileSync``.
"""

from __future__ import annotations

from uuid import UUID

import msgspec
from litestar import Controller, delete, get, patch, post, put
from litestar.status_codes import HTTP_201_CREATED, HTTP_204_NO_CONTENT

from app.domain.accounts.principals import Principal, RuntimePrincipal
from app.domain.paging import Page, Paging, from_row
from app.domain.profiles.catalog import ProfileCatalog, ProjectModels
from app.domain.profiles.schemas import (
    LlmCatalog,
    ProfileCreate,
    ProfileOut,
    ProfileUpdate,
    ProjectModelsIn,
    ProjectModelsOut,
)
from app.domain.profiles.services import ModelProfileService, ProjectModelsService, score_kind
from app.domain.projects.services import ProjectAccess
from app.domain.rest import AdminController, ProjectApiController
from app.lib.errors import PermissionDeniedError

profile_out = from_row(
    ProfileOut,
    tags=lambda row: list(row.tags or ()),
    failover_chain=lambda row: list(row.failover_chain or ()),
    routing_score=lambda row: score_kind(row.routing_score),
)


class ModelProfileAdminController(AdminController):
    path = "/api/admin/model-profiles"
    tags = ["admin: model profiles"]

    @post("/", status_code=HTTP_201_CREATED)
    async def create_profile(
        self,
        data: ProfileCreate,
        platform_admin: Principal,
        model_profiles_service: ModelProfileService,
    ) -> ProfileOut:
        row = await model_profiles_service.create_profile(data)
        return profile_out(row)

    @get("/")
    async def list_profiles(
        self,
        platform_admin: Principal,
        model_profiles_service: ModelProfileService,
        paging: Paging,
    ) -> Page[ProfileOut]:
        rows, total = await model_profiles_service.page(paging.limit, paging.offset)
        return paging.page(rows, total, profile_out)

    @get("/{profile_id:str}")
    async def get_profile(
        self,
        profile_id: str,
        platform_admin: Principal,
        model_profiles_service: ModelProfileService,
    ) -> ProfileOut:
        return profile_out(await model_profiles_service.require(profile_id))

    @patch("/{profile_id:str}")
    async def update_profile(
        self,
        profile_id: str,
        data: ProfileUpdate,
        platform_admin: Principal,
        model_profiles_service: ModelProfileService,
    ) -> ProfileOut:
        row = await model_profiles_service.update_profile(profile_id, data)
        return profile_out(row)

    @delete("/{profile_id:str}", status_code=HTTP_204_NO_CONTENT)
    async def delete_profile(
        self,
        profile_id: str,
        platform_admin: Principal,
        model_profiles_service: ModelProfileService,
    ) -> None:
        await model_profiles_service.delete_profile(profile_id)


def _models_out(settings: ProjectModels, catalog: LlmCatalog) -> ProjectModelsOut:
    enabled = settings.enabled_profile_ids
    return ProjectModelsOut(
        default_profile_id=settings.default_profile_id,
        enabled_profile_ids=None if enabled is None else sorted(enabled),
        catalog=catalog,
    )


class ProjectModelsController(ProjectApiController):
    path = "/api/projects/{project_id:uuid}/models"

    @get("/")
    async def get_models(
        self,
        project_id: UUID,
        access: ProjectAccess,
        project_models_service: ProjectModelsService,
        profile_catalog: ProfileCatalog,
    ) -> ProjectModelsOut:
        settings = await project_models_service.for_project(project_id)
        return _models_out(settings, await profile_catalog.catalog(project_id))

    @put("/")
    async def put_models(
        self,
        project_id: UUID,
        access: ProjectAccess,
        data: ProjectModelsIn,
        project_models_service: ProjectModelsService,
        profile_catalog: ProfileCatalog,
    ) -> ProjectModelsOut:
        access.require(access.can_manage_project, "change the project's model settings")
        settings = await project_models_service.put(project_id, data)
        return _models_out(settings, await profile_catalog.catalog(project_id))


class RuntimeCatalogController(Controller):
    path = "/api/runtime"
    tags = ["runtime"]

    @get("/llms")
    async def list_llms(self, principal: Principal, profile_catalog: ProfileCatalog) -> LlmCatalog:
        """The project's model catalog; served from memory (no database query once cached)."""
        if not isinstance(principal, RuntimePrincipal):
            raise PermissionDeniedError(
                "this endpoint needs a runtime token", code="runtime_token_required"
            )
        catalog = await profile_catalog.catalog(principal.project_id)
        policy = principal.policy
        if not policy.limits_models:
            return catalog
        # Only what this token may call (a profile by its id or its base model).
        allowed = [
            llm for llm in catalog.llms if policy.allows_any(profile_catalog.names_of(llm.id))
        ]
        default = catalog.default_llm_id
        return msgspec.structs.replace(
            catalog,
            llms=allowed,
            default_llm_id=default if any(llm.id == default for llm in allowed) else None,
        )
