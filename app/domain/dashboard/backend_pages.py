"""The backends and aliases pages: the shared routing pool, registered, edited, removed
and probed through the same services and checks as ``/api/admin/backends``."""

from __future__ import annotations

from typing import Any

import msgspec
from litestar import delete, get, post
from litestar.di import Provide
from litestar.response import Redirect, Response, Template

from app.db.models import BackendConfig
from app.domain.backends.schemas import (
    AliasIn,
    BackendRegistration,
    ValidRegistration,
    check_kind,
    validate_alias,
    validate_registration,
)
from app.domain.backends.services import AliasService, BackendConfigService, backend_spec
from app.domain.backends.sync import EvernightUnreachableError, RoutingConfigSync
from app.domain.dashboard.backend_views import BackendView, backend_view, backend_views
from app.domain.dashboard.common import (
    ADMIN,
    AdminRequest,
    DashboardController,
    checked,
    items,
    notice,
    notify,
    optional_int,
    text,
    validation_field,
)
from app.domain.web.pages import WebUser
from app.lib.errors import BadRequestError
from app.lib.vault import Vault, VaultError
from app.routing.backends.factory import BACKEND_KINDS
from app.routing.health import HealthChecker
from app.routing.registry import BackendRegistry
from app.routing.vllm_metrics import VllmMetricsCache

FORM_TEMPLATE = "dashboard/partials/backend_form.html"
ROW_TEMPLATE = "dashboard/partials/backend_row.html"
KIND_LABELS = {
    "external": "External (OpenAI-compatible)",
    "vllm": "vLLM",
    "ollama": "Ollama",
    "engine": "CEP engine (WebSocket)",
    "minimax-cloud": "MiniMax video (cloud)",
}
TYPE_CHOICES = (*((k, KIND_LABELS[k]) for k in BACKEND_KINDS), ("comfyui", "ComfyUI"))
ALIAS_PAGE = 1000


def _form_context(
    kind: str, values: dict[str, Any], errors: dict[str, str], **extra: Any
) -> dict[str, Any]:
    refused = ""
    try:
        kind = check_kind(kind)
    except BadRequestError as exc:
        refused = exc.message
    return {
        "kind": kind,
        "kind_label": KIND_LABELS.get(kind, kind),
        "refused": refused,
        "values": values,
        "errors": errors,
        "mode": "register",
        "types": TYPE_CHOICES,
        **extra,
    }


def _values(form: Any) -> dict[str, Any]:
    return {
        "name": text(form, "name"),
        "url": text(form, "url"),
        "models": items(form, "models"),
        "tags": items(form, "tags"),
        "max_concurrency": optional_int(form, "max_concurrency"),
    }


def _registration(
    kind: str, values: dict[str, Any], api_key: str | None, errors: dict[str, str]
) -> ValidRegistration | None:
    """The checked registration, or None with ``errors`` filled in per field."""
    name, url = values["name"], values["url"]
    if not name:
        errors["name"] = "Give the backend a name."
    if not url:
        errors["url"] = "Enter the backend's base URL, such as http://10.0.0.5:8000."
    if errors:
        return None
    body = {**values, "type": kind, "api_key": api_key}
    try:
        return validate_registration(msgspec.convert(body, BackendRegistration))
    except msgspec.ValidationError as exc:
        field, message = validation_field(exc, {})
        if field == "name":
            message = "Use 1-100 letters, digits, '.', '_' or '-'."
        errors[field] = message
    except BadRequestError as exc:
        errors[exc.param or "form"] = exc.message
    return None


async def _verify_tunnel(
    routing_sync: RoutingConfigSync, registration: ValidRegistration, errors: dict[str, str]
) -> None:
    """An ``evernight://`` URL must resolve through the bridge before it is stored."""
    try:
        await routing_sync.verify_url(registration.url)
    except EvernightUnreachableError as exc:
        errors["url"] = exc.message


async def _views(
    web_admin: WebUser,
    backend_configs_service: BackendConfigService,
    backend_registry: BackendRegistry,
    vllm_metrics: VllmMetricsCache,
) -> list[BackendView]:
    """Every stored backend with its live state, by name (the ``pool`` the page and
    its rows fragment share). It takes ``web_admin`` so that it is resolved after the
    admin check, not before it nor at the same time on the request's session."""
    rows = sorted(await backend_configs_service.get_many(), key=lambda r: r.name)
    return await backend_views(rows, backend_registry, vllm_metrics)


def _saved(admin: AdminRequest, message: str, kind: str) -> Template | Redirect:
    """A saved backend: back to the page without htmx, else a blank form and a toast."""
    headers = notify(message, "success", "backends-changed")
    return admin.saved(
        "/admin/backends", FORM_TEMPLATE, headers=headers, **_form_context(kind, {}, {})
    )


class BackendPages(DashboardController):
    dependencies = {**ADMIN, "pool": Provide(_views)}

    @get("/backends")
    async def backends_page(self, admin: AdminRequest, pool: list[BackendView]) -> Template:
        return admin.page(
            "dashboard/backends.html",
            "backends",
            backends=pool,
            **_form_context("external", {}, {}),
        )

    @get("/backend-rows")
    async def backend_rows(self, admin: AdminRequest, pool: list[BackendView]) -> Template:
        return admin.fragment("dashboard/partials/backend_rows.html", backends=pool)

    @get("/backend-form")
    async def backend_form(self, admin: AdminRequest, type: str = "external") -> Template:
        """The form of another type; what was typed so far comes along (``hx-include``)."""
        values = _values(admin.request.query_params)
        return admin.fragment(FORM_TEMPLATE, **_form_context(type[:32], values, {}))

    @post("/backends", status_code=200)
    async def register_backend(
        self,
        admin: AdminRequest,
        backend_configs_service: BackendConfigService,
        vault: Vault,
        routing_sync: RoutingConfigSync,
    ) -> Template | Redirect:
        form = await admin.form()
        kind, values = text(form, "type") or "external", _values(form)
        errors: dict[str, str] = {}
        registration = _registration(kind, values, text(form, "api_key") or None, errors)
        if registration is not None and await backend_configs_service.get_by_name(
            registration.name
        ):
            errors["name"] = f"A backend named {registration.name} exists: edit it instead."
        if registration is not None and not errors:
            await _verify_tunnel(routing_sync, registration, errors)
        if registration is None or errors:
            return admin.form_fragment(FORM_TEMPLATE, **_form_context(kind, values, errors))
        row = await backend_configs_service.register(registration, vault)
        return _saved(admin, f"Backend {row.name} registered.", registration.kind)

    @get("/backends/{name:str}/edit")
    async def edit_backend_form(
        self, name: str, admin: AdminRequest, backend_configs_service: BackendConfigService
    ) -> Template:
        row = await backend_configs_service.require(name)
        return admin.fragment(FORM_TEMPLATE, **_edit_context(row, {}, {}))

    @post("/backends/{name:str}", status_code=200)
    async def update_backend(
        self,
        name: str,
        admin: AdminRequest,
        backend_configs_service: BackendConfigService,
        vault: Vault,
        routing_sync: RoutingConfigSync,
        health_checker: HealthChecker,
        backend_registry: BackendRegistry,
    ) -> Template | Redirect:
        row = await backend_configs_service.require(name)
        form = await admin.form()
        values = {**_values(form), "name": row.name}
        errors: dict[str, str] = {}
        api_key = text(form, "api_key") or None
        if api_key is None and not checked(form, "clear_api_key"):
            try:
                api_key = backend_spec(row, vault).api_key  # kept as it is
            except VaultError:
                errors["api_key"] = "The stored key cannot be read: enter it again."
        registration = _registration(row.kind, values, api_key, errors)
        if registration is not None and not errors:
            await _verify_tunnel(routing_sync, registration, errors)
        if registration is None or errors:
            return admin.form_fragment(FORM_TEMPLATE, **_edit_context(row, values, errors))
        before = backend_registry.get(row.name)
        await backend_configs_service.register(registration, vault)
        # Saved as it was or not, it is probed at once (like a registration by the API).
        routing_sync.probe_if_kept(row.name, before, health_checker)
        return _saved(admin, f"Backend {row.name} saved.", row.kind)

    @delete("/backends/{name:str}", status_code=200)
    async def remove_backend(
        self,
        name: str,
        web_admin: WebUser,
        backend_configs_service: BackendConfigService,
    ) -> Response[str]:
        await backend_configs_service.delete_by_name(name)
        return notice(f"Backend {name} removed.")

    @post("/backends/{name:str}/probe", status_code=200)
    async def probe_backend(
        self,
        name: str,
        admin: AdminRequest,
        backend_configs_service: BackendConfigService,
        backend_registry: BackendRegistry,
        health_checker: HealthChecker,
        vllm_metrics: VllmMetricsCache,
    ) -> Template:
        row = await backend_configs_service.require(name)
        state = backend_registry.get(name)
        if state is None:
            message, level = f"{name} is not loaded on this replica (see the server log).", "error"
        else:
            health = await health_checker.probe(state, share=True)
            message = f"{name}: {health.status.value}" + (
                f" ({health.reason})" if health.reason and health.reason != "ok" else ""
            )
            level = "success" if health.healthy else "error"
        view = await backend_view(row, backend_registry, vllm_metrics)
        return admin.fragment(ROW_TEMPLATE, headers=notify(message, level), b=view)


def _edit_context(
    row: BackendConfig, values: dict[str, Any], errors: dict[str, str]
) -> dict[str, Any]:
    shown = values or {
        "name": row.name,
        "url": row.url,
        "models": list(row.models),
        "tags": list(row.tags or ()),
        "max_concurrency": row.max_concurrency,
    }
    return _form_context(
        row.kind, shown, errors, mode="edit", has_key=row.api_key_encrypted is not None
    )


class AliasPages(DashboardController):
    path = "/admin/aliases"

    @get("/")
    async def aliases_page(self, admin: AdminRequest, aliases_service: AliasService) -> Template:
        rows, total = await aliases_service.page(ALIAS_PAGE, 0)
        return admin.page(
            "dashboard/aliases.html",
            "aliases",
            aliases=rows,
            total=total,
            values={},
            errors={},
        )

    @post("/", status_code=200)
    async def add_alias(self, admin: AdminRequest, aliases_service: AliasService) -> Template:
        form = await admin.form()
        values = {"alias": text(form, "alias"), "target": text(form, "target")}
        errors: dict[str, str] = {}
        for field, label in (("alias", "the alias"), ("target", "the model it stands for")):
            if not values[field]:
                errors[field] = f"Enter {label}."
        headers = None
        if not errors:
            try:
                alias, target = validate_alias(msgspec.convert(values, AliasIn))
            except msgspec.ValidationError as exc:
                field, message = validation_field(exc, {})
                errors[field] = message
            except BadRequestError as exc:
                errors[exc.param or "alias"] = exc.message
            else:
                await aliases_service.set_alias(alias, target)
                headers, values = notify(f"{alias} now stands for {target}."), {}
        rows, total = await aliases_service.page(ALIAS_PAGE, 0)
        return admin.form_fragment(
            "dashboard/partials/alias_section.html",
            headers=headers,
            aliases=rows,
            total=total,
            values=values,
            errors=errors,
        )

    # A path parameter: aliases often look like Hugging Face ids (``org/model``).
    @delete("/{alias:path}", status_code=200)
    async def remove_alias(
        self,
        alias: str,
        web_admin: WebUser,
        aliases_service: AliasService,
    ) -> Response[str]:
        name = alias.removeprefix("/")
        await aliases_service.delete_by_alias(name)
        return notice(f"Alias {name} removed.")
