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
from litestar import get, post
from litestar.response import Template

from app.domain.console.tab_support import Forms, FormState, Tab, TabPages, TabScope, parse, plain
from app.domain.conversations.services import ConversationService
from app.domain.paging import OffsetQuery
from app.domain.profiles.catalog import ProfileCatalog
from app.domain.profiles.schemas import ProjectModelsIn
from app.domain.profiles.services import ProjectModelsService
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
    state = FormState(values={"defaultProfileId": settings.default_profile_id or ""})
    return {
        "profiles": profiles,
        "mode": mode or ("all" if stored is None else "selected"),
        "stored_default": settings.default_profile_id,
        "catalog": runtime_view,
        "catalog_json": msgspec.json.format(msgspec.json.encode(runtime_view), indent=2).decode(),
        "forms": Forms({FORM: state}),
    }


def _models_tab(
    tab_scope: TabScope,
    project_models_service: ProjectModelsService,
    profile_catalog: ProfileCatalog,
    profile_table: ProfileTable,
) -> Tab:
    return tab_scope.tab(
        MODELS,
        lambda: _models_context(tab_scope, project_models_service, profile_catalog, profile_table),
    )


class ModelsTab(TabPages, tab=_models_tab, key=MODELS):
    @post("/models")
    async def save(
        self,
        tab: Tab,
        project_id: UUID,
        project_models_service: ProjectModelsService,
        profile_catalog: ProfileCatalog,
        profile_table: ProfileTable,
    ) -> Template:
        tab.scope.require_project("change the project's model settings")
        form = await tab.scope.form()
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
            # The refused choice is shown, not the stored one.
            refused = tab.scope.tab(
                MODELS,
                lambda: _models_context(
                    tab.scope,
                    project_models_service,
                    profile_catalog,
                    profile_table,
                    mode=mode,
                    checked=checked,
                ),
            )
            fields = ("defaultProfileId", "enabledProfileIds")
            return await refused.refuse(FORM, exc, fields, {"defaultProfileId": default})
        return await tab.show("Model settings saved.")


class ConversationsTab(TabPages):
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
                **plain(
                    c,
                    "id",
                    "title",
                    "priority",
                    "created_at",
                    "updated_at",
                    profile="model_profile_id",
                    messages="message_count",
                    forked_from="forked_from_id",
                ),
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
