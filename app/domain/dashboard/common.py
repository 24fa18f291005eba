"""What every dashboard page shares: the section nav, rendering, form fields, toasts.

Forms are sent by HTMX (the CSRF token travels in the ``X-CSRF-Token`` header from
<body>; the hidden ``csrf_token`` field covers a post made before htmx loaded). A form
with mistakes comes back as the same fragment with each message next to its field:
status 200 for HTMX (which swaps only 2xx answers), 400 otherwise.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import msgspec
from advanced_alchemy.extensions.litestar import SQLAlchemyAsyncConfig
from litestar import Controller, Request
from litestar.datastructures import FormMultiDict
from litestar.di import Provide
from litestar.response import Redirect, Response, Template
from litestar.status_codes import HTTP_303_SEE_OTHER

from app.domain.dashboard.feeds import Render
from app.domain.web.pages import WebUser, csrf_guard, is_htmx, render
from app.lib.clock import utcnow

SECTIONS = (
    ("overview", "/admin", "Overview"),
    ("backends", "/admin/backends", "Backends"),
    ("aliases", "/admin/aliases", "Aliases"),
    ("profiles", "/admin/profiles", "Model profiles"),
    ("failover", "/admin/failover", "Failover"),
    ("projects", "/admin/projects", "Projects and quotas"),
    ("usage", "/admin/usage", "Usage"),
    ("budgets", "/admin/budgets", "Budgets"),
    ("prices", "/admin/prices", "Prices"),
)
_LIST_SPLIT = re.compile(r"[,\n]")
_FIELD_IN_PATH = re.compile(r"at `\$\.([A-Za-z_]+)")
_BOUND = re.compile(r"Expected `(int|str|array)`(?: of length)? (>=|<=|>|<) (\d+)")


@dataclass(frozen=True, slots=True)
class AdminRequest:
    """One request of a platform admin to a dashboard page, and how it is answered: a
    fragment for htmx, the page again (or a 400 form) without it. Handlers that read a
    form or answer with a fragment take ``admin`` rather than the request and
    ``web_admin`` separately, so the helpers below need not be handed both."""

    request: Request[Any, Any, Any]
    user: WebUser

    @property
    def htmx(self) -> bool:
        return is_htmx(self.request)

    @property
    def db_config(self) -> SQLAlchemyAsyncConfig:
        return db_config_of(self.request)

    def page(self, template: str, section: str, **context: Any) -> Template:
        return admin_page(template, self.user, section, **context)

    async def form(self) -> FormMultiDict:
        return await self.request.form()

    def fragment(
        self,
        template: str,
        *,
        status_code: int = 200,
        headers: Mapping[str, str] | None = None,
        **context: Any,
    ) -> Template:
        return fragment(template, self.user, status_code=status_code, headers=headers, **context)

    def form_fragment(
        self,
        template: str,
        *,
        errors: Mapping[str, str],
        headers: Mapping[str, str] | None = None,
        **context: Any,
    ) -> Template:
        """A form's fragment with each error next to its field (see ``form_status``)."""
        status = form_status(self.request, errors)
        return self.fragment(
            template, status_code=status, headers=headers, errors=errors, **context
        )

    def saved(
        self, page: str, template: str, *, headers: Mapping[str, str], **context: Any
    ) -> Template | Redirect:
        """A write that succeeded: without htmx, ``page`` again (post/redirect/get);
        with it, ``template`` and the toast in ``headers``."""
        if not self.htmx:
            return Redirect(page, status_code=HTTP_303_SEE_OTHER)
        return self.fragment(template, headers=headers, **context)


def _admin_request(request: Request[Any, Any, Any], web_admin: WebUser) -> AdminRequest:
    return AdminRequest(request, web_admin)


ADMIN = {"admin": Provide(_admin_request, sync_to_thread=False)}
"""The dependencies of every dashboard controller (a controller with more spreads it)."""


class DashboardController(Controller):
    """Dashboard pages: under ``/admin``, out of the OpenAPI schema, unsafe methods
    checked by ``csrf_guard``, handlers given ``admin`` (an ``AdminRequest``)."""

    path = "/admin"
    include_in_schema = False
    guards = [csrf_guard]
    dependencies = ADMIN


def admin_page(template: str, web_user: WebUser, section: str, **context: Any) -> Template:
    """A full dashboard page: the site nav on Dashboard, the section nav on ``section``."""
    return render(
        template,
        web_user,
        nav="admin",
        section=section,
        sections=SECTIONS,
        now=utcnow(),
        **context,
    )


def fragment(
    template: str,
    web_user: WebUser,
    *,
    status_code: int = 200,
    headers: Mapping[str, str] | None = None,
    **context: Any,
) -> Template:
    response = render(template, web_user, status_code=status_code, **context)
    if headers:
        response.headers.update(headers)
    return response


def form_status(request: Request[Any, Any, Any], errors: Mapping[str, str]) -> int:
    if not errors or is_htmx(request):
        return 200
    return 400


def notify(message: str, level: str = "success", *events: str) -> dict[str, str]:
    """``HX-Trigger``: a toast, and events other parts of the page refresh on."""
    trigger: dict[str, Any] = {"toast": {"level": level, "message": message}}
    trigger.update({event: True for event in events})
    return {"HX-Trigger": json.dumps(trigger)}


def notice(message: str) -> Response[str]:
    """An empty answer with a toast: the button's row is removed, or nothing is swapped."""
    return Response("", headers=notify(message))


def text(form: Mapping[str, Any], name: str) -> str:
    value = form.get(name)
    return value.strip() if isinstance(value, str) else ""


def items(form: Mapping[str, Any], name: str) -> list[str]:
    """A list typed as comma- or line-separated text; blanks dropped, order kept."""
    return [part.strip() for part in _LIST_SPLIT.split(text(form, name)) if part.strip()]


def checked(form: Mapping[str, Any], name: str) -> bool:
    return text(form, name) in ("on", "true", "1")


def optional_int(form: Mapping[str, Any], name: str) -> int | str | None:
    """An integer field: None when blank; the raw text when it is not a whole number
    (the schema then refuses it with a message naming the field)."""
    raw = text(form, name).replace("_", "").replace(" ", "")
    if not raw:
        return None
    return int(raw) if raw.isdigit() else raw


def validation_field(exc: msgspec.ValidationError, fields: Mapping[str, str]) -> tuple[str, str]:
    """The form field a schema error is about and a message a person can act on."""
    message = str(exc)
    found = _FIELD_IN_PATH.search(message)
    wire = found.group(1) if found else ""
    field = fields.get(wire, wire) or "form"
    return field, _plain(message.split(" - at ")[0])


def _plain(detail: str) -> str:
    """msgspec's wording (``Expected `int` >= 1``) in words."""
    if (bound := _BOUND.search(detail)) is not None:
        kind, op, limit = bound.groups()
        number = f"{int(limit):,}"
        if kind == "int":
            return {
                ">=": f"Enter a whole number of at least {number}.",
                ">": f"Enter a whole number above {number}.",
                "<=": f"Enter a whole number no larger than {number}.",
                "<": f"Enter a whole number below {number}.",
            }[op]
        unit = "characters" if kind == "str" else "entries"
        return f"Use {'at most' if op.startswith('<') else 'at least'} {number} {unit}."
    if "got `str`" in detail and "`int" in detail:
        return "Enter a whole number."
    if "matching regex" in detail:
        return "Use letters, digits, '.', '_' or '-', starting with a letter or digit."
    return f"{detail}."


def db_config_of(request: Request[Any, Any, Any]) -> SQLAlchemyAsyncConfig:
    """The database config, for short sessions of their own (a stream lives for
    minutes and must not hold the request's session and its connection)."""
    config: SQLAlchemyAsyncConfig = request.app.state.resources.db_config
    return config


def template_renderer(request: Request[Any, Any, Any]) -> Render:
    engine = request.app.template_engine
    if engine is None:
        raise RuntimeError("the app has no template engine")

    def render_template(name: str, context: Mapping[str, Any]) -> str:
        return str(engine.get_template(name).render(**context)).strip()

    return render_template
