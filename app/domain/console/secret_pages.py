"""The Secrets and Overrides tabs: write-only values (vault secrets and BYO override
keys). A value goes in through a password field and never comes back: the tables show
masked hints, and a refused write renders its value field empty."""

from __future__ import annotations

from typing import Any
from uuid import UUID

from litestar import post
from litestar.response import Template

from app.domain.console.tab_support import Tab, TabPages, TabScope, compact, parse, plain
from app.domain.conversations.services import ConversationService
from app.domain.overrides.schemas import OverrideCreate
from app.domain.overrides.services import OverrideService
from app.domain.profiles.catalog import ProfileCatalog
from app.domain.secrets.schemas import SecretCreate, SecretValueIn
from app.domain.secrets.services import ProjectSecretService
from app.lib.errors import AronaError, ConflictError
from app.lib.vault import Vault

SECRETS = "secrets"
OVERRIDES = "overrides"
SHOWN = 500
RECENT_CONVERSATIONS = 50


async def _secrets_context(scope: TabScope, service: ProjectSecretService) -> dict[str, Any]:
    project_id = scope.project.id
    rows, total = await service.page(project_id, SHOWN, 0)
    users = await service.users_of(project_id, [r.id for r in rows])
    secrets = [
        {
            **plain(r, "id", "name", "description", "hint", "created_at", "rotated_at"),
            "used_by": [u.name for u in users.get(r.id, [])],
        }
        for r in rows
    ]
    return {"secrets": secrets, "secrets_total": total}


async def _overrides_context(
    scope: TabScope,
    service: OverrideService,
    conversations_service: ConversationService,
    profile_catalog: ProfileCatalog,
) -> dict[str, Any]:
    project_id = scope.project.id
    rows, total = await service.page(project_id, SHOWN, 0)
    recent, _ = await conversations_service.page(project_id, RECENT_CONVERSATIONS, 0)
    catalog = await profile_catalog.catalog(project_id)
    return {
        "overrides": [
            plain(
                r, "id", "conversation_id", "created_at", model_id="model_prefix", hint="key_hint"
            )
            for r in rows
        ],
        "overrides_total": total,
        "recent_conversations": [(str(c.id), c.title) for c, _ in recent],
        "model_ids": [llm.id for llm in catalog.llms],
    }


def _secrets_tab(tab_scope: TabScope, secrets_service: ProjectSecretService) -> Tab:
    return tab_scope.tab(SECRETS, lambda: _secrets_context(tab_scope, secrets_service))


def _overrides_tab(
    tab_scope: TabScope,
    overrides_service: OverrideService,
    conversations_service: ConversationService,
    profile_catalog: ProfileCatalog,
) -> Tab:
    return tab_scope.tab(
        OVERRIDES,
        lambda: _overrides_context(
            tab_scope, overrides_service, conversations_service, profile_catalog
        ),
    )


class SecretsTab(TabPages, tab=_secrets_tab, key=SECRETS):
    @post("/secrets")
    async def add(
        self, tab: Tab, project_id: UUID, secrets_service: ProjectSecretService, vault: Vault
    ) -> Template:
        tab.scope.require_credentials("create secrets")
        form = await tab.scope.form()
        values = form.texts("name", "description")
        try:
            data = parse(SecretCreate, {**compact(values), "value": form.secret("value")})
            await secrets_service.create_secret(
                project_id,
                name=data.name,
                value=data.value,
                description=data.description,
                vault=vault,
            )
        except AronaError as exc:
            return await tab.refuse("add-secret", exc, ("name", "value", "description"), values)
        return await tab.show(f"Secret {data.name} added.")

    @post("/secrets/{secret_id:uuid}/rotate")
    async def rotate(
        self,
        tab: Tab,
        project_id: UUID,
        secret_id: UUID,
        secrets_service: ProjectSecretService,
        vault: Vault,
    ) -> Template:
        tab.scope.require_credentials("change secrets")
        form = await tab.scope.form()
        try:
            data = parse(SecretValueIn, {"value": form.secret("value")})
            row = await secrets_service.replace_value(project_id, secret_id, data.value, vault)
        except AronaError as exc:
            return await tab.refuse(f"rotate-{secret_id}", exc, ("value",))
        return await tab.show(f"Secret {row.name} has a new value.")

    @post("/secrets/{secret_id:uuid}/delete")
    async def delete(
        self, tab: Tab, project_id: UUID, secret_id: UUID, secrets_service: ProjectSecretService
    ) -> Template:
        tab.scope.require_credentials("delete secrets")
        try:
            await secrets_service.delete_secret(project_id, secret_id)
        except ConflictError as exc:
            # In use by custom LLMs: the message names them.
            return await tab.refuse(f"delete-{secret_id}", exc, ())
        return await tab.show("Secret deleted.")


class OverridesTab(TabPages, tab=_overrides_tab, key=OVERRIDES):
    @post("/overrides")
    async def add(
        self, tab: Tab, project_id: UUID, overrides_service: OverrideService, vault: Vault
    ) -> Template:
        tab.scope.require_credentials("create override keys")
        form = await tab.scope.form()
        values = form.texts("conversationId", "modelId")
        try:
            data = parse(OverrideCreate, {**values, "apiKey": form.secret("apiKey").strip()})
            await overrides_service.create_override(project_id, data, vault)
        except AronaError as exc:
            fields = ("conversationId", "modelId", "apiKey")
            return await tab.refuse("add-override", exc, fields, values)
        return await tab.show("Override key added.")

    @post("/overrides/{override_id:uuid}/delete")
    async def delete(
        self, tab: Tab, project_id: UUID, override_id: UUID, overrides_service: OverrideService
    ) -> Template:
        tab.scope.require_credentials("delete override keys")
        await overrides_service.delete_override(project_id, override_id)
        return await tab.show("Override key deleted.")
