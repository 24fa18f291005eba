"""The Models and Conversations tabs.

Models: which model profiles the project enables and its default (owners change
them), and the catalog exactly as the project's runtimes get it from
``GET /api/runtime/llms``. Conversations: the project's conversations with their
profile, priority flag and any sticky fallback pin (read-only here).
"""

from __future__ import annotations

from typing import Any
from uuid import UUID

import msgspec
from litestar import Controller, get, post
from litestar.response import Template

from app.domain.console.tab_support import (
    TAB_SCOPE,
    Forms,
    FormState,
    TabScope,
    failure,
    parse,
)
from app.domain.conversations.services import ConversationService
from app.domain.paging import OffsetQuery
from app.domain.profiles.catalog import ProfileCatalog
from app.domain.profiles.schemas import ProjectModelsIn
from app.domain.profiles.services import ProjectModelsService
from app.domain.web.pages import csrf_guard
from app.lib.errors import AronaError
from app.routing.profiles import ProfileTable

MODELS = "models"
CONVERSATIONS = "conversations"
FORM = "models"
PAGE = 50


async def _models_context(
    scope: TabScope,
    models_service: ProjectModelsService,
    catalog: ProfileCatalog,
    table: ProfileTable,
    *,
    state: FormState | None = None,
    mode: str | None = None,
    checked: list[str] | None = None,
) -> dict[str, Any]:
    project_id = scope.project.id
    settings = await models_service.for_project(project_id)
    runtime_view = await catalog.catalog(project_id)
    stored = settings.enabled_profile_ids
    if checked is not None:
        chosen = set(checked)
    elif stored is None:
        chosen = {p.id for p in table}
    else:
        chosen = set(stored)
    profiles = [
        {
            "id": p.id,
            "name": p.name,
            "base_model": p.base_model,
            "platform_enabled": p.enabled,
            "checked": p.id in chosen,
            "tags": sorted(p.tags),
        }
        for p in table
    ]
    if state is None:
        state = FormState(values={"defaultProfileId": settings.default_profile_id or ""})
    forms = Forms({FORM: state})
    return {
        "profiles": profiles,
        "mode": mode or ("all" if stored is None else "selected"),
        "stored_default": settings.default_profile_id,
        "catalog": runtime_view,
        "catalog_json": msgspec.json.format(msgspec.json.encode(runtime_view), indent=2).decode(),
        "forms": forms,
    }


class ModelsTab(Controller):
    path = "/projects/{project_id:uuid}"
    include_in_schema = False
    guards = [csrf_guard]
    dependencies = TAB_SCOPE

    @get("/tabs/models")
    async def show(
        self,
        tab_scope: TabScope,
        project_models_service: ProjectModelsService,
        profile_catalog: ProfileCatalog,
        profile_table: ProfileTable,
    ) -> Template:
        ctx = await _models_context(
            tab_scope, project_models_service, profile_catalog, profile_table
        )
        return await tab_scope.render(MODELS, **ctx)

    @post("/models")
    async def save(
        self,
        tab_scope: TabScope,
        project_id: UUID,
        project_models_service: ProjectModelsService,
        profile_catalog: ProfileCatalog,
        profile_table: ProfileTable,
    ) -> Template:
        tab_scope.require_project("change the project's model settings")
        form = await tab_scope.form()
        mode = "selected" if form.text("mode") == "selected" else "all"
        checked = form.all("enabledProfileIds")
        default = form.text("defaultProfileId")
        try:
            data = parse(
                ProjectModelsIn,
                {
                    "defaultProfileId": default or None,
                    "enabledProfileIds": checked if mode == "selected" else None,
                },
            )
            await project_models_service.put(project_id, data)
        except AronaError as exc:
            state = failure(
                exc, ("defaultProfileId", "enabledProfileIds"), {"defaultProfileId": default}
            )
            ctx = await _models_context(
                tab_scope,
                project_models_service,
                profile_catalog,
                profile_table,
                state=state,
                mode=mode,
                checked=checked,
            )
            return await tab_scope.refused(MODELS, FORM, state, **ctx)
        ctx = await _models_context(
            tab_scope, project_models_service, profile_catalog, profile_table
        )
        return await tab_scope.render(MODELS, message="Model settings saved.", **ctx)


class ConversationsTab(Controller):
    path = "/projects/{project_id:uuid}"
    include_in_schema = False
    guards = [csrf_guard]
    dependencies = TAB_SCOPE

    @get("/tabs/conversations")
    async def show(
        self,
        tab_scope: TabScope,
        project_id: UUID,
        conversations_service: ConversationService,
        offset: OffsetQuery = 0,
        priority: bool | None = None,
    ) -> Template:
        offset = max(0, offset)
        rows, total = await conversations_service.page(project_id, PAGE, offset, priority=priority)
        conversations = [
            {
                "id": c.id,
                "title": c.title,
                "profile": c.model_profile_id,
                "priority": c.priority,
                "messages": c.message_count,
                "forked_from": c.forked_from_id,
                "created_at": c.created_at,
                "updated_at": c.updated_at,
                "pin": None
                if pin is None
                else {
                    "from": pin.from_profile_id,
                    "to": pin.to_profile_id,
                    "reason": pin.reason.replace("_", " "),
                    "backend": pin.backend,
                    "since": pin.created_at,
                },
            }
            for c, pin in rows
        ]
        return await tab_scope.render(
            CONVERSATIONS,
            conversations=conversations,
            total=total,
            offset=offset,
            page_size=PAGE,
            priority=priority,
        )
