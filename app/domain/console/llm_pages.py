"""The Custom LLMs tab: the project's own endpoints, added from the Bob or the Custom
template, switched on and off, tested, deleted.

The rules (which fields a template locks, credentials, free names on a conflict, the
SSRF check) are ``CustomLlmService``'s; this page only decides which fields to send:
for Bob none of the technical ones, which it shows read-only instead.
"""

from __future__ import annotations

from typing import Any
from uuid import UUID

from litestar import Request, get, post
from litestar.response import Template

from app.db.models import CustomLlm
from app.domain.console.tab_support import (
    Forms,
    FormState,
    Tab,
    TabPages,
    TabScope,
    compact,
    failure,
    parse,
    plain,
    template_helpers,
)
from app.domain.custom_llms.names import llm_id
from app.domain.custom_llms.schemas import CustomLlmCreate, CustomLlmUpdate
from app.domain.custom_llms.services import CustomLlmService, credential_of
from app.domain.custom_llms.setup import CustomLlms
from app.domain.custom_llms.templates import AUTH_SCHEMES, BOB, BOB_DEFAULT_NAME, TEMPLATES
from app.domain.secrets.services import ProjectSecretService
from app.domain.web.pages import WebUser, render
from app.lib.errors import AronaError
from app.lib.vault import Vault

KEY = "custom-llms"
FORM = "add-llm"
SHOWN = 200
CUSTOM_FIELDS = ("baseUrl", "model", "authScheme", "provider", "maxInputTokens", "maxOutputTokens")
FIELDS = ("template", "name", "apiKey", "secretId", "enabled", *CUSTOM_FIELDS)
AUTH_LABELS = {
    "bearer": "Authorization: Bearer <key>",
    "api-key": "api-key: <key> (Azure style)",
    "ApiKey": "Authorization: ApiKey <key>",
    "none": "No key",
}


def _template_of(value: str | None) -> str:
    return value if value in TEMPLATES else "bob"


async def _secrets(secrets_service: ProjectSecretService, project_id: UUID) -> list[Any]:
    rows, _ = await secrets_service.page(project_id, 500, 0)
    return [{"id": str(r.id), "name": r.name, "hint": r.hint} for r in rows]


def _row(row: CustomLlm, secret_names: dict[str, str]) -> dict[str, Any]:
    credential = credential_of(row)
    if credential == "secret":
        shown = f"secret {secret_names.get(str(row.secret_id), '(unknown)')}"
    elif credential == "apiKey":
        shown = f"key {row.api_key_hint or ''}"
    else:
        shown = "none"
    return {
        **plain(
            row,
            "name",
            "template",
            "base_url",
            "model",
            "auth_scheme",
            "provider",
            "max_input_tokens",
            "max_output_tokens",
            "enabled",
        ),
        "llm_id": llm_id(row.name),
        "credential": shown,
    }


def _form_context(
    secrets: list[Any], template: str, state: FormState | None = None
) -> dict[str, Any]:
    return {
        "llm_template": template,
        "llm_state": state or FormState(),
        "secrets": secrets,
        "bob": BOB,
        "bob_name": BOB_DEFAULT_NAME,
        "auth_schemes": [(s, AUTH_LABELS.get(s, s)) for s in AUTH_SCHEMES],
    }


async def _context(
    scope: TabScope,
    service: CustomLlmService,
    secrets_service: ProjectSecretService,
    *,
    template: str = "bob",
    state: FormState | None = None,
) -> dict[str, Any]:
    project_id = scope.project.id
    rows, total = await service.page(project_id, SHOWN, 0)
    secrets = await _secrets(secrets_service, project_id)
    names = {s["id"]: s["name"] for s in secrets}
    forms = Forms()
    if state is not None:
        forms[FORM] = state
    return {
        "llms": [_row(r, names) for r in rows],
        "llms_total": total,
        "forms": forms,
        **_form_context(secrets, template, state),
    }


def _tab_of(
    scope: TabScope,
    service: CustomLlmService,
    secrets_service: ProjectSecretService,
    template: str,
) -> Tab:
    """The tab with the add form of ``template``."""
    return scope.tab(KEY, lambda: _context(scope, service, secrets_service, template=template))


def _tab(
    tab_scope: TabScope,
    custom_llms_service: CustomLlmService,
    secrets_service: ProjectSecretService,
) -> Tab:
    return _tab_of(tab_scope, custom_llms_service, secrets_service, "bob")


class CustomLlmTab(TabPages, tab=_tab):
    @get("/tabs/custom-llms")
    async def show(
        self,
        tab_scope: TabScope,
        custom_llms_service: CustomLlmService,
        secrets_service: ProjectSecretService,
        template: str | None = None,
    ) -> Template:
        chosen = _template_of(template)
        return await _tab_of(tab_scope, custom_llms_service, secrets_service, chosen).show()

    @get("/custom-llms/form")
    async def form_for_template(
        self,
        tab_scope: TabScope,
        request: Request[Any, Any, Any],
        project_id: UUID,
        web_user: WebUser,
        secrets_service: ProjectSecretService,
        template: str | None = None,
    ) -> Template:
        """The add form for another template, keeping what was typed (the picker
        sends the form's fields but never the key)."""
        chosen = _template_of(template)
        values = {
            name: request.query_params.get(name, "")
            for name in ("name", "secretId", "enabled", *CUSTOM_FIELDS)
        }
        # ``failed`` keeps the browser's typed key (hx-preserve) across the swap.
        state = FormState(values=values, failed=True)
        secrets = await _secrets(secrets_service, project_id)
        return render(
            "console/partials/llm_form.html",
            web_user,
            project=tab_scope.project,
            base=tab_scope.project.base,
            **template_helpers(),
            **_form_context(secrets, chosen, state),
        )

    @post("/custom-llms")
    async def create(
        self,
        tab_scope: TabScope,
        project_id: UUID,
        custom_llms_service: CustomLlmService,
        secrets_service: ProjectSecretService,
        custom_llms: CustomLlms,
        vault: Vault,
    ) -> Template:
        tab_scope.require_credentials("create custom LLMs")
        form = await tab_scope.form()
        template = _template_of(form.text("template"))
        # A suggested name (one click on a conflict) replaces the typed one.
        name = form.text("useName") or form.text("name")
        values = {
            "template": template,
            "name": name,
            "secretId": form.text("secretId"),
            "enabled": "on" if form.flag("enabled") else "",
        }
        if template == "custom":
            values.update(form.texts(*CUSTOM_FIELDS))
        body: dict[str, Any] = compact({k: v for k, v in values.items() if k != "enabled"})
        body["apiKey"] = form.secret("apiKey").strip()
        body = compact(body)
        body["enabled"] = form.flag("enabled")
        try:
            data = parse(CustomLlmCreate, body)
            row = await custom_llms_service.create_llm(
                tab_scope.access.project, data, vault=vault, guard=custom_llms.guard
            )
        except AronaError as exc:
            state = failure(exc, FIELDS, values)
            ctx = await _context(
                tab_scope, custom_llms_service, secrets_service, template=template, state=state
            )
            return await tab_scope.refused(KEY, FORM, state, **ctx)
        created = row.name
        tab = _tab_of(tab_scope, custom_llms_service, secrets_service, template)
        return await tab.show(f"Custom LLM {created} added.", created=created)

    @post("/custom-llms/{name:str}/enabled")
    async def set_enabled(
        self,
        tab: Tab,
        name: str,
        custom_llms_service: CustomLlmService,
        custom_llms: CustomLlms,
        vault: Vault,
    ) -> Template:
        tab.scope.require_credentials("change custom LLMs")
        enabled = (await tab.scope.form()).flag("enabled")
        await custom_llms_service.update_llm(
            tab.scope.access.project,
            name,
            CustomLlmUpdate(enabled=enabled),
            vault=vault,
            guard=custom_llms.guard,
        )
        return await tab.show(f"{name} is {'enabled' if enabled else 'disabled'}.")

    @post("/custom-llms/{name:str}/test")
    async def test_call(
        self,
        tab: Tab,
        project_id: UUID,
        name: str,
        web_user: WebUser,
        custom_llms_service: CustomLlmService,
        custom_llms: CustomLlms,
    ) -> Template:
        """One real call to the endpoint; the answer is the result line alone."""
        tab.scope.require_credentials("test custom LLMs")
        result = await custom_llms.test(custom_llms_service, project_id, name)
        if tab.scope.fragment:
            return render("console/partials/llm_test.html", web_user, result=result)
        return await tab.show(results={name: result})

    @post("/custom-llms/{name:str}/delete")
    async def delete(
        self, tab: Tab, project_id: UUID, name: str, custom_llms_service: CustomLlmService
    ) -> Template:
        tab.scope.require_credentials("delete custom LLMs")
        await custom_llms_service.delete_llm(project_id, name)
        return await tab.show(f"Custom LLM {name} deleted.")
