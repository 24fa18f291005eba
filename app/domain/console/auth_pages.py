"""Logging in and out of the console, and registering when registration is open."""

from __future__ import annotations

from typing import Any
from uuid import UUID

from litestar import Controller, Request, get, post
from litestar.datastructures import Cookie
from litestar.response import Redirect, Template
from litestar.status_codes import HTTP_303_SEE_OTHER

from app.domain.accounts.controllers import client_address
from app.domain.accounts.services import AuthService
from app.domain.web.pages import CSRF_FIELD, csrf_guard, render
from app.domain.web.presession import PRESESSION_COOKIE, PresessionTokens, private_cookie
from app.domain.web.return_to import DEFAULT_PAGE, safe_next
from app.domain.web.sessions import COOKIE_NAME, WebSession, WebSessions
from app.lib.errors import AronaError
from app.lib.ids import uuid7
from app.lib.settings import Settings


def _safe_next(target: str | None) -> str:
    return safe_next(target) or DEFAULT_PAGE


def session_cookie(request: Request[Any, Any, Any], token: str, max_age: int) -> Cookie:
    return private_cookie(request, COOKIE_NAME, token, max_age)


def _text(form: Any, name: str) -> str:
    value = form.get(name)
    return value.strip() if isinstance(value, str) else ""


STALE_FORM = "This form has expired or was not sent by this site: reload the page and try again."


def _page(
    request: Request[Any, Any, Any], settings: Settings, template: str, **context: Any
) -> Template:
    """A pre-session form page, carrying its CSRF token and (re)setting its cookie."""
    token, cookie = PresessionTokens(settings.jwt_secret).issue(request)
    page = render(template, csrf_token=token, **context)
    page.set_cookie(cookie)
    return page


def _login_page(
    request: Request[Any, Any, Any],
    settings: Settings,
    next: str | None,
    *,
    status_code: int = 200,
    error: str | None = None,
    email: str = "",
) -> Template:
    return _page(
        request,
        settings,
        "console/login.html",
        status_code=status_code,
        error=error,
        email=email,
        next=next,
        registration_open=settings.registration_open,
    )


def _register_page(
    request: Request[Any, Any, Any],
    settings: Settings,
    *,
    status_code: int = 200,
    errors: dict[str, str] | None = None,
    error: str | None = None,
    email: str = "",
    name: str = "",
) -> Template:
    return _page(
        request,
        settings,
        "console/register.html",
        status_code=status_code,
        errors=errors or {},
        error=error,
        email=email,
        name=name,
    )


async def _signed_in(
    request: Request[Any, Any, Any],
    web_sessions: WebSessions,
    settings: Settings,
    user_id: UUID,
    target: str,
) -> Redirect:
    """A new session for ``user_id``, its cookie set on the way to ``target``."""
    token, _ = await web_sessions.create(user_id, uuid7())
    return Redirect(
        target,
        status_code=HTTP_303_SEE_OTHER,
        cookies=[session_cookie(request, token, settings.session_idle_seconds)],
    )


async def _form_is_ours(request: Request[Any, Any, Any], settings: Settings) -> bool:
    form = await request.form()
    sent = form.get(CSRF_FIELD)
    cookie = request.cookies.get(PRESESSION_COOKIE)
    return PresessionTokens(settings.jwt_secret).valid(
        cookie, sent if isinstance(sent, str) else None
    )


class ConsoleAuthPages(Controller):
    include_in_schema = False
    guards = [csrf_guard]

    @get("/")
    async def home(self, web_session: WebSession | None) -> Redirect:
        return Redirect("/projects" if web_session else "/login")

    @get("/login")
    async def login_form(
        self,
        request: Request[Any, Any, Any],
        settings: Settings,
        web_session: WebSession | None,
        next: str | None = None,
    ) -> Template | Redirect:
        if web_session is not None:
            return Redirect(_safe_next(next))
        # A refused target never reaches the form, so the post cannot carry it either.
        return _login_page(request, settings, safe_next(next))

    @post("/login", status_code=HTTP_303_SEE_OTHER)
    async def login(
        self,
        request: Request[Any, Any, Any],
        auth_service: AuthService,
        web_sessions: WebSessions,
        settings: Settings,
    ) -> Template | Redirect:
        form = await request.form()
        email, next_path = _text(form, "email"), _text(form, "next")
        if not await _form_is_ours(request, settings):
            # Login CSRF: a post from another site would sign this browser in as them.
            return _login_page(
                request, settings, next_path, status_code=403, error=STALE_FORM, email=email
            )
        try:
            user = await auth_service.authenticate(
                email=email,
                password=str(form.get("password") or ""),
                client=client_address(request),
            )
        except AronaError as exc:
            # The email stays in the form; the message says what to do.
            return _login_page(
                request,
                settings,
                next_path,
                status_code=exc.status_code,
                error=exc.message,
                email=email,
            )
        return await _signed_in(request, web_sessions, settings, user.id, _safe_next(next_path))

    @post("/logout", status_code=HTTP_303_SEE_OTHER)
    async def logout(self, web_session: WebSession | None, web_sessions: WebSessions) -> Redirect:
        if web_session is not None:
            await web_sessions.destroy(web_session)
        return Redirect(
            "/login",
            status_code=HTTP_303_SEE_OTHER,
            cookies=[Cookie(key=COOKIE_NAME, value="", max_age=0, path="/")],
        )

    @get("/register")
    async def register_form(self, request: Request[Any, Any, Any], settings: Settings) -> Template:
        if not settings.registration_open:
            return render(
                "error.html",
                status_code=403,
                status=403,
                title="Registration is closed",
                message="Ask an administrator for an account.",
            )
        return _register_page(request, settings)

    @post("/register", status_code=HTTP_303_SEE_OTHER)
    async def register(
        self,
        request: Request[Any, Any, Any],
        auth_service: AuthService,
        web_sessions: WebSessions,
        settings: Settings,
    ) -> Template | Redirect:
        form = await request.form()
        email, name = _text(form, "email"), _text(form, "name")
        password = str(form.get("password") or "")
        if not await _form_is_ours(request, settings):
            return _register_page(
                request, settings, status_code=403, error=STALE_FORM, email=email, name=name
            )
        errors: dict[str, str] = {}
        if "@" not in email:
            errors["email"] = "Enter an email address."
        if len(password) < 8:
            errors["password"] = "Use at least 8 characters."  # noqa: S105 (a message)
        if errors:
            return _register_page(
                request, settings, status_code=400, errors=errors, email=email, name=name
            )
        try:
            user = await auth_service.register(email=email, password=password, name=name)
        except AronaError as exc:
            field = exc.param or ""
            return _register_page(
                request,
                settings,
                status_code=exc.status_code,
                errors={field: exc.message} if field else {},
                error=None if field else exc.message,
                email=email,
                name=name,
            )
        return await _signed_in(request, web_sessions, settings, user.id, "/projects")
