"""The price book page: the platform's prices, newest first per model, and a form that
adds one through ``ModelPriceService`` (the rules and the replication of
``/api/admin/prices``: history is never rewritten, so only prices not yet in force
can be deleted here; a change of price is a new row with a later start).

Routes::

    GET    /admin/prices          the page        GET /admin/price-rows  the rows
    POST   /admin/prices          add a price     DELETE /admin/prices/{id}  a future one
"""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from typing import Any
from uuid import UUID

import msgspec
from litestar import delete, get, post
from litestar.response import Redirect, Response, Template

from app.db.models import ModelPrice
from app.domain.dashboard.common import (
    AdminRequest,
    DashboardController,
    admin_page,
    fragment,
    notice,
    notify,
    text,
    validation_field,
)
from app.domain.prices.schemas import PriceIn
from app.domain.prices.services import ModelPriceService, price_out
from app.domain.web.pages import WebUser
from app.lib.errors import AronaError

FORM_TEMPLATE = "dashboard/partials/price_form.html"
ROWS_TEMPLATE = "dashboard/partials/price_rows.html"
PRICE_PAGE = 500
FIELDS = {
    "model": "model",
    "backend": "backend",
    "input": "input",
    "cachedInput": "cached_input",
    "output": "output",
    "embedding": "embedding",
    "currency": "currency",
    "effectiveFrom": "effective_from",
}


def _values(form: Any) -> dict[str, str]:
    return {field: text(form, field) for field in FIELDS.values()}


def _body(values: dict[str, str]) -> dict[str, Any]:
    """The form as the admin API's body: blank optional fields left out."""
    body: dict[str, Any] = {"model": values["model"], "input": values["input"]}
    body["output"] = values["output"]
    for wire, field in FIELDS.items():
        if wire not in body and wire != "effectiveFrom" and values[field]:
            body[wire] = values[field]
    if when := values["effective_from"]:
        # A datetime-local input sends minutes without a zone; the page says UTC.
        if len(when) == len("2026-01-01T00:00"):
            when += ":00"
        body["effectiveFrom"] = when if when.endswith("Z") or "+" in when else f"{when}Z"
    return body


def _required(values: dict[str, str]) -> dict[str, str]:
    errors = {}
    if not values["model"]:
        errors["model"] = "Name the model, alias or profile the price is for."
    for field, label in (("input", "input"), ("output", "output")):
        if not values[field]:
            errors[field] = f"Give the {label} price per million tokens (0 for free)."
    return errors


async def _rows(service: ModelPriceService) -> Sequence[ModelPrice]:
    rows, _ = await service.page_of(None, PRICE_PAGE, 0)
    return rows


def _row_context(rows: Sequence[ModelPrice]) -> dict[str, Any]:
    now = datetime.datetime.now(datetime.UTC)
    return {"prices": [price_out(row, now) for row in rows]}


def _form(
    admin: AdminRequest,
    *,
    values: dict[str, str] | None = None,
    errors: dict[str, str] | None = None,
    headers: dict[str, str] | None = None,
) -> Template:
    return admin.form_fragment(
        FORM_TEMPLATE,
        errors=errors or {},
        headers=headers,
        values=values or {"currency": "USD"},
    )


def _errors_of(exc: Exception) -> dict[str, str]:
    if isinstance(exc, msgspec.ValidationError):
        field, message = validation_field(exc, FIELDS)
        return {field: message}
    if isinstance(exc, AronaError):
        return {FIELDS.get(exc.param or "", "form"): exc.message}
    raise exc


class PricePages(DashboardController):
    @get("/prices")
    async def prices_page(self, web_admin: WebUser, prices_service: ModelPriceService) -> Template:
        rows, total = await prices_service.page_of(None, PRICE_PAGE, 0)
        return admin_page(
            "dashboard/prices.html",
            web_admin,
            "prices",
            total=total,
            values={"currency": "USD"},
            errors={},
            **_row_context(rows),
        )

    @get("/price-rows")
    async def price_rows(self, web_admin: WebUser, prices_service: ModelPriceService) -> Template:
        return fragment(ROWS_TEMPLATE, web_admin, **_row_context(await _rows(prices_service)))

    @post("/prices", status_code=200)
    async def add_price(
        self, admin: AdminRequest, prices_service: ModelPriceService
    ) -> Template | Redirect:
        values = _values(await admin.form())
        errors = _required(values)
        if not errors:
            try:
                row = await prices_service.add(
                    None, msgspec.convert(_body(values), PriceIn, strict=False)
                )
            except (msgspec.ValidationError, AronaError) as exc:
                errors = _errors_of(exc)
            else:
                message = f"Price of {row.model} added."
                if not admin.htmx:
                    return Redirect("/admin/prices", status_code=303)
                return _form(admin, headers=notify(message, "success", "prices-changed"))
        return _form(admin, values=values, errors=errors)

    @delete("/prices/{price_id:uuid}", status_code=200)
    async def delete_price(
        self, price_id: UUID, web_admin: WebUser, prices_service: ModelPriceService
    ) -> Response[str]:
        await prices_service.remove(None, price_id)
        return notice("Price deleted (it was not in force yet).")
