"""The model profiles page: create, change and delete profiles (preference chains for
latency failover, slow thresholds, sticky fallbacks) through ``ModelProfileService``
and ``ProfileSync``, exactly as ``/api/admin/model-profiles`` does."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import msgspec
from litestar import delete, get, post
from litestar.response import Redirect, Response, Template
from litestar.status_codes import HTTP_303_SEE_OTHER

from app.db.models import ModelProfile
from app.domain.dashboard.common import (
    AdminRequest,
    DashboardController,
    admin_page,
    checked,
    fragment,
    items,
    notice,
    notify,
    optional_int,
    text,
    validation_field,
)
from app.domain.profiles.schemas import ProfileCreate, ProfileUpdate
from app.domain.profiles.services import ModelProfileService
from app.domain.web.pages import WebUser
from app.lib.errors import AronaError

FORM_TEMPLATE = "dashboard/partials/profile_form.html"
PROFILE_PAGE = 1000
# Wire names (errors name these) to form fields.
FIELDS = {
    "id": "id",
    "name": "name",
    "baseModel": "base_model",
    "tags": "tags",
    "supportsTools": "supports_tools",
    "supportsImages": "supports_images",
    "contextWindowTokens": "context_window_tokens",
    "maxOutputTokens": "max_output_tokens",
    "enabled": "enabled",
    "fallbackProfileId": "fallback_profile_id",
    "slowThresholdMs": "slow_threshold_ms",
    "failoverChain": "failover_chain",
    "routingScore": "routing_score",
}
SCORE_CHOICES = (
    ("", "Platform default (ARONA_ROUTING_SCORE)"),
    ("capacity", "Capacity: a free batch slot first, then the shortest wait"),
    ("seed", "Seed: running + 10 * waiting"),
)


def _values(form: Any) -> dict[str, Any]:
    """The form as typed, to show back when it has mistakes."""
    values: dict[str, Any] = {field: text(form, field) for field in FIELDS.values()}
    for flag in ("supports_tools", "supports_images", "enabled"):
        values[flag] = checked(form, flag)
    return values


def _body(form: Any) -> dict[str, Any]:
    """The form as the admin API's body (camelCase); blank numbers keep their default."""
    body: dict[str, Any] = {
        "name": text(form, "name"),
        "baseModel": text(form, "base_model"),
        "tags": items(form, "tags"),
        "supportsTools": checked(form, "supports_tools"),
        "supportsImages": checked(form, "supports_images"),
        "enabled": checked(form, "enabled"),
        "fallbackProfileId": text(form, "fallback_profile_id") or None,
        "slowThresholdMs": optional_int(form, "slow_threshold_ms"),
        "failoverChain": items(form, "failover_chain"),
        "routingScore": text(form, "routing_score") or None,
    }
    for wire, field in (
        ("contextWindowTokens", "context_window_tokens"),
        ("maxOutputTokens", "max_output_tokens"),
    ):
        number = optional_int(form, field)
        if number is not None:
            body[wire] = number
    return body


def _required(values: dict[str, Any], *, creating: bool) -> dict[str, str]:
    errors = {}
    if creating and not values["id"]:
        errors["id"] = "Give the profile an id, such as llm-smart."
    if not values["name"]:
        errors["name"] = "Give the profile a name."
    if not values["base_model"]:
        errors["base_model"] = "Name the model (or alias) it serves."
    return errors


def _row_values(row: ModelProfile) -> dict[str, Any]:
    return {
        "id": row.id,
        "name": row.name,
        "base_model": row.base_model,
        "tags": ", ".join(row.tags or ()),
        "supports_tools": row.supports_tools,
        "supports_images": row.supports_images,
        "context_window_tokens": str(row.context_window_tokens),
        "max_output_tokens": str(row.max_output_tokens),
        "enabled": row.enabled,
        "fallback_profile_id": row.fallback_profile_id or "",
        "slow_threshold_ms": "" if row.slow_threshold_ms is None else str(row.slow_threshold_ms),
        "failover_chain": ", ".join(row.failover_chain or ()),
        "routing_score": row.routing_score or "",
    }


def _blank() -> dict[str, Any]:
    return {"enabled": True, "context_window_tokens": "8192", "max_output_tokens": "2048"}


async def _profiles(service: ModelProfileService) -> Sequence[ModelProfile]:
    rows, _ = await service.page(PROFILE_PAGE, 0)
    return rows


def _form_context(
    profiles: Sequence[ModelProfile],
    mode: str,
    values: dict[str, Any] | None,
    errors: dict[str, str] | None,
) -> dict[str, Any]:
    """What the form shows; ``profiles`` are the fallback choices."""
    return {
        "mode": mode,
        "values": values if values is not None else _blank(),
        "errors": errors or {},
        "choices": [p.id for p in profiles],
        "score_choices": SCORE_CHOICES,
    }


def _form(
    admin: AdminRequest,
    profiles: Sequence[ModelProfile],
    *,
    mode: str = "create",
    values: dict[str, Any] | None = None,
    errors: dict[str, str] | None = None,
    headers: dict[str, str] | None = None,
) -> Template:
    """The form (400 without htmx when it has ``errors``)."""
    context = _form_context(profiles, mode, values, errors)
    return admin.form_fragment(FORM_TEMPLATE, headers=headers, **context)


def _schema_error(exc: Exception) -> dict[str, str]:
    if isinstance(exc, msgspec.ValidationError):
        field, message = validation_field(exc, FIELDS)
        return {field: message}
    if isinstance(exc, AronaError):
        return {FIELDS.get(exc.param or "", exc.param or "form"): exc.message}
    raise exc


async def _submit(
    admin: AdminRequest,
    service: ModelProfileService,
    values: dict[str, Any],
    save: Callable[[], Awaitable[str]],
    *,
    editing: str | None = None,
) -> Template | Redirect:
    """Create (``editing`` None) or save a profile: ``save`` stores it and returns the
    toast. Saved: back to the page without htmx, else a blank form and the toast;
    refused: the form again with each mistake next to its field."""
    errors = _required(values, creating=editing is None)
    if not errors:
        try:
            message = await save()
        except (msgspec.ValidationError, AronaError) as exc:
            errors = _schema_error(exc)
        else:
            # Not ``admin.saved``: the blank form's choices are read only for htmx.
            if not admin.htmx:
                return Redirect("/admin/profiles", status_code=HTTP_303_SEE_OTHER)
            headers = notify(message, "success", "profiles-changed")
            return _form(admin, await _profiles(service), headers=headers)
    return _form(
        admin,
        [p for p in await _profiles(service) if p.id != editing],
        mode="create" if editing is None else "edit",
        values=values,
        errors=errors,
    )


class ProfilePages(DashboardController):
    @get("/profiles")
    async def profiles_page(
        self, web_admin: WebUser, model_profiles_service: ModelProfileService
    ) -> Template:
        rows, total = await model_profiles_service.page(PROFILE_PAGE, 0)
        return admin_page(
            "dashboard/profiles.html",
            web_admin,
            "profiles",
            profiles=rows,
            total=total,
            **_form_context(rows, "create", None, None),
        )

    @get("/profile-rows")
    async def profile_rows(
        self, web_admin: WebUser, model_profiles_service: ModelProfileService
    ) -> Template:
        rows = await _profiles(model_profiles_service)
        return fragment("dashboard/partials/profile_rows.html", web_admin, profiles=rows)

    @get("/profile-form")
    async def new_profile_form(
        self, admin: AdminRequest, model_profiles_service: ModelProfileService
    ) -> Template:
        return _form(admin, await _profiles(model_profiles_service))

    @post("/profiles", status_code=200)
    async def create_profile(
        self, admin: AdminRequest, model_profiles_service: ModelProfileService
    ) -> Template | Redirect:
        form = await admin.form()
        values = _values(form)

        async def create() -> str:
            data = msgspec.convert({**_body(form), "id": values["id"]}, ProfileCreate)
            row = await model_profiles_service.create_profile(data)
            return f"Profile {row.id} created."

        return await _submit(admin, model_profiles_service, values, create)

    @get("/profiles/{profile_id:str}/edit")
    async def edit_profile_form(
        self, profile_id: str, admin: AdminRequest, model_profiles_service: ModelProfileService
    ) -> Template:
        row = await model_profiles_service.require(profile_id)
        others = [p for p in await _profiles(model_profiles_service) if p.id != row.id]
        return _form(admin, others, mode="edit", values=_row_values(row))

    @post("/profiles/{profile_id:str}", status_code=200)
    async def update_profile(
        self,
        profile_id: str,
        admin: AdminRequest,
        model_profiles_service: ModelProfileService,
    ) -> Template | Redirect:
        await model_profiles_service.require(profile_id)
        form = await admin.form()
        values = {**_values(form), "id": profile_id}

        async def save() -> str:
            await model_profiles_service.update_profile(
                profile_id, msgspec.convert(_body(form), ProfileUpdate)
            )
            return f"Profile {profile_id} saved."

        return await _submit(admin, model_profiles_service, values, save, editing=profile_id)

    @delete("/profiles/{profile_id:str}", status_code=200)
    async def delete_profile(
        self,
        profile_id: str,
        web_admin: WebUser,
        model_profiles_service: ModelProfileService,
    ) -> Response[str]:
        await model_profiles_service.delete_profile(profile_id)
        return notice(f"Profile {profile_id} deleted.")
