"""What the project tabs share: the caller's access to the project, rendering a tab
(the fragment for HTMX, the whole project page otherwise), reading forms, and turning
a refused write into messages next to the fields that caused it.

Every write of a tab answers with the tab re-rendered. A refused one answers 422 with
the form filled in again from what was sent (never a secret value: those inputs are
rendered empty, and marked ``hx-preserve`` so the browser keeps what was typed), the
error next to its field, and a toast. ``arona.js`` swaps 422 answers like 200s.
"""

from __future__ import annotations

import datetime
import re
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar
from uuid import UUID

import msgspec
from litestar import Controller, Request, get
from litestar.di import Provide
from litestar.handlers import HTTPRouteHandler
from litestar.response import Template
from sqlalchemy import inspect as sa_inspect
from sqlalchemy.ext.asyncio import AsyncSession

from app.domain.console.project_pages import TABS
from app.domain.projects.services import ProjectAccess, ProjectService
from app.domain.web.pages import WebUser, csrf_guard, is_htmx, provide_page_principal, render, toast
from app.lib.errors import AronaError, BadRequestError

T = TypeVar("T")
UNPROCESSABLE = 422


@dataclass(frozen=True, slots=True)
class ProjectView:
    """The project as the templates see it: plain values, safe to render after the
    request's session committed or rolled back."""

    id: UUID
    name: str
    slug: str
    owner_id: UUID
    created_at: datetime.datetime
    role: str
    can_manage_project: bool
    can_manage_credentials: bool

    @property
    def base(self) -> str:
        return f"/projects/{self.id}"

    @classmethod
    def of(cls, access: ProjectAccess) -> ProjectView:
        p = access.project
        return cls(
            id=p.id,
            name=p.name,
            slug=p.slug,
            owner_id=p.owner_id,
            created_at=p.created_at,
            role=access.role,
            can_manage_project=access.can_manage_project,
            can_manage_credentials=access.can_manage_credentials,
        )


# ------------------------------------------------------------------ forms


class FormData:
    """A submitted form: text values (stripped), secret values (as typed), lists."""

    def __init__(self, items: Iterable[tuple[str, Any]]) -> None:
        self._values: dict[str, list[str]] = {}
        for key, value in items:
            if isinstance(value, str):
                self._values.setdefault(key, []).append(value)

    def text(self, name: str) -> str:
        values = self._values.get(name)
        return values[-1].strip() if values else ""

    def secret(self, name: str) -> str:
        """A secret as typed; only surrounding line breaks are dropped (a paste)."""
        values = self._values.get(name)
        return values[-1].strip("\r\n") if values else ""

    def texts(self, *names: str) -> dict[str, str]:
        """The text values of ``names``, as the form is rendered again with them."""
        return {name: self.text(name) for name in names}

    def all(self, name: str) -> list[str]:
        return [v.strip() for v in self._values.get(name, []) if v.strip()]

    def flag(self, name: str) -> bool:
        return self.text(name).lower() in ("on", "true", "1", "yes")


@dataclass(slots=True)
class FormState:
    """One form of a tab as it is rendered again: what was sent and what was wrong."""

    values: dict[str, str] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)
    message: str | None = None
    """An error that belongs to no single field."""
    suggestions: list[str] = field(default_factory=list)
    failed: bool = False

    @property
    def focus(self) -> str | None:
        """The field to focus (the first one in error)."""
        return next(iter(self.errors), None)

    def value(self, name: str, default: str = "") -> str:
        return self.values.get(name, default)


class Forms(dict[str, FormState]):
    """The tab's forms by name; a form that was not submitted renders blank."""

    def __missing__(self, key: str) -> FormState:
        return FormState()


def plain(row: object, *names: str, **renamed: str) -> dict[str, Any]:
    """A table row of a tab: attributes of ``row`` copied out (the template must not
    touch a stored row, which a rollback expires), ``names`` under their own names and
    ``renamed`` as ``key="attribute"``."""
    values = {name: getattr(row, name) for name in names}
    values.update({key: getattr(row, attr) for key, attr in renamed.items()})
    return values


def compact(values: Mapping[str, Any]) -> dict[str, Any]:
    """The fields that were filled in (an empty input means: not given)."""
    return {k: v for k, v in values.items() if v not in ("", None)}


_AT = re.compile(r" - at `\$\.([A-Za-z0-9_]+)(?:\[\d+\])?`$")
_MISSING = re.compile(r"missing required field `([^`]+)`")
_LENGTH = re.compile(r"of length ([<>]=) (\d+)")
_BOUND = re.compile(r"`int` ([<>]=?) (-?\d+)")


def _friendly(detail: str) -> str:
    if (m := _LENGTH.search(detail)) is not None:
        op, n = m.group(1), int(m.group(2))
        if op == ">=":
            return "Required." if n <= 1 else f"Use at least {n} characters."
        return f"Use at most {n} characters."
    if "matching regex" in detail:
        return "This value is not in the expected format (see the hint)."
    if (m := _BOUND.search(detail)) is not None:
        op, n = m.group(1), int(m.group(2))
        if op == ">":
            n, op = n + 1, ">="
        return f"Enter a whole number of at least {n}." if op == ">=" else f"Enter at most {n}."
    if "`int" in detail:
        return "Enter a whole number."
    if "UUID" in detail or "enum" in detail:
        return "Choose one of the offered values."
    return "This value is not valid."


def parse(schema: type[T], data: Mapping[str, Any]) -> T:
    """``data`` checked by the API's own schema; a refusal names the field (the form
    uses the API's field names) and says in plain words what is wrong."""
    try:
        return msgspec.convert(dict(data), schema, strict=False)
    except msgspec.ValidationError as exc:
        text = str(exc)
        missing = _MISSING.search(text)
        at = _AT.search(text)
        param = missing.group(1) if missing else at.group(1) if at else None
        message = "Required." if missing else _friendly(text)
        raise BadRequestError(message, code="invalid_request", param=param) from None


def failure(
    exc: AronaError, fields: Iterable[str], values: Mapping[str, str] | None = None
) -> FormState:
    """A refused write as a form state, or ``exc`` itself when it is not about the
    form (not allowed, not found): the error handlers answer those with a toast."""
    if exc.param is None and exc.status_code not in (400, 409, 422):
        raise exc
    state = FormState(values=dict(values or {}), failed=True)
    if exc.param is not None and exc.param in set(fields):
        state.errors[exc.param] = exc.message
    else:
        state.message = exc.message
    suggestions = exc.extra.get("suggestions")
    if isinstance(suggestions, list):
        state.suggestions = [str(s) for s in suggestions]
    return state


# ------------------------------------------------------------------ the scope


@dataclass(slots=True)
class TabScope:
    """One request to a project's tab: who asks, with what access."""

    request: Request[Any, Any, Any]
    web_user: WebUser
    access: ProjectAccess
    project: ProjectView
    session: AsyncSession

    @property
    def fragment(self) -> bool:
        """An HTMX swap (not a history restore, which needs the whole page)."""
        return (
            is_htmx(self.request)
            and self.request.headers.get("hx-history-restore-request") != "true"
        )

    def require_project(self, action: str) -> None:
        self.access.require(self.access.can_manage_project, action)

    def require_credentials(self, action: str) -> None:
        self.access.require(self.access.can_manage_credentials, action)

    async def form(self) -> FormData:
        form = await self.request.form()
        return FormData(form.multi_items())

    async def render(
        self,
        key: str,
        *,
        status: int = 200,
        message: str | None = None,
        level: str = "success",
        **context: Any,
    ) -> Template:
        """The tab ``key``; ``message`` becomes a toast."""
        # A rollback (a write that lost a race) expires what the session had loaded,
        # the signed-in user included; rendering must not lazy-load.
        user_state = sa_inspect(self.web_user.user)
        if user_state.expired_attributes and user_state.session is not None:
            await self.session.refresh(self.web_user.user)
        shared: dict[str, Any] = {
            "project": self.project,
            "tabs": TABS,
            "tab": key,
            "base": self.project.base,
            "forms": context.pop("forms", Forms()),
            **template_helpers(),
        }
        template = f"console/tabs/{key}.html"
        # A swap gets the tab alone; otherwise the project page has it in it.
        page = {} if self.fragment else {"nav": "projects", "tab_template": template}
        response = render(
            template if self.fragment else "console/project.html",
            self.web_user,
            status_code=status,
            oob=self.fragment,
            **page,
            **shared,
            **context,
        )
        if message:
            response.headers.update(toast(message, level))
        return response

    async def refused(self, key: str, name: str, state: FormState, **context: Any) -> Template:
        """The tab again with form ``name`` in ``state`` (422, and the error as a toast)."""
        forms = context.pop("forms", Forms())
        forms[name] = state
        first = state.message or next(iter(state.errors.values()), "The form has errors.")
        return await self.render(
            key, status=UNPROCESSABLE, message=first, level="error", forms=forms, **context
        )

    def tab(self, key: str, load: Callable[[], Awaitable[dict[str, Any]]]) -> Tab:
        """The tab ``key`` whose context ``load`` reads (again for every answer)."""
        return Tab(self, key, load)


@dataclass(slots=True)
class Tab:
    """One tab of the scope, as its writes answer: re-rendered with a toast after a
    write, or with the refused form. Its context is read after the write (or its
    rollback), so the tables show what is stored now."""

    scope: TabScope
    key: str
    load: Callable[[], Awaitable[dict[str, Any]]]

    async def show(self, message: str | None = None, **extra: Any) -> Template:
        """The tab; ``message`` becomes a toast."""
        return await self.scope.render(self.key, message=message, **await self.load(), **extra)

    async def refuse(
        self,
        name: str,
        exc: AronaError,
        fields: Iterable[str] = (),
        values: Mapping[str, str] | None = None,
    ) -> Template:
        """Form ``name`` refused with ``exc`` (see :func:`failure`), shown in the tab."""
        return await self.reject(name, failure(exc, fields, values))

    async def reject(self, name: str, state: FormState) -> Template:
        """Form ``name`` shown in the tab in ``state`` (a refusal the page decided)."""
        return await self.scope.refused(self.key, name, state, **await self.load())


async def open_tab(
    request: Request[Any, Any, Any],
    web_user: WebUser,
    access: ProjectAccess,
    projects_service: ProjectService,
) -> TabScope:
    """The caller's view of a project (a project they cannot see is a 404)."""
    return TabScope(
        request=request,
        web_user=web_user,
        access=access,
        project=ProjectView.of(access),
        session=projects_service.repository.session,
    )


# A tab's handlers take ``tab_scope`` (``scope`` is Litestar's name for the ASGI scope).
TAB_SCOPE = {"tab_scope": Provide(open_tab), "principal": Provide(provide_page_principal)}


def _tab_page(key: str) -> HTTPRouteHandler:
    """``GET /tabs/{key}``: the tab as loaded now."""

    async def show(self: Controller, tab: Tab) -> Template:
        return await tab.show()

    return get(f"/tabs/{key}")(show)


class TabPages(Controller):
    """The controller of a tab: under the project's address, out of the API schema,
    writes checked by ``csrf_guard``, handlers given ``tab_scope``.

    ``class KeysTab(TabPages, tab=provide, key="keys")``: its handlers also take ``tab``,
    which ``provide`` builds from ``tab_scope`` and the services it names, and with
    ``key`` it answers ``GET /tabs/keys`` with that tab.
    """

    path = "/projects/{project_id:uuid}"
    include_in_schema = False
    guards = [csrf_guard]
    dependencies = TAB_SCOPE

    def __init_subclass__(
        cls, *, tab: Callable[..., Tab] | None = None, key: str = "", **kwargs: Any
    ) -> None:
        super().__init_subclass__(**kwargs)
        if tab is not None:
            cls.dependencies = {**TAB_SCOPE, "tab": Provide(tab, sync_to_thread=False)}
        if key:
            setattr(cls, "show", _tab_page(key))  # noqa: B010 (a handler the class lacks)


def template_helpers() -> dict[str, Any]:
    """Formatting functions every tab template may call."""
    return {"when": when, "num": number}


def number(value: int | None) -> str:
    return "" if value is None else f"{value:,}"


def when(moment: datetime.datetime | None) -> str:
    """A time as the tables show it (UTC, to the minute)."""
    if moment is None:
        return ""
    return moment.astimezone(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
