"""What every HTML handler shares: the signed-in user, CSRF, rendering, toasts.

A page handler takes ``web_user`` (the session's user, or a redirect to the login
page), renders with ``render`` (the full page, or a fragment for an HTMX request),
and reports outcomes with ``toast``. Every unsafe request is checked by
``csrf_guard``: the session's token must come back in the ``csrf_token`` form field
or the ``X-CSRF-Token`` header (HTMX sends it from the ``hx-headers`` of <body>).
"""

from __future__ import annotations

import hmac
import json
from dataclasses import dataclass
from typing import Any

from litestar import Request
from litestar.connection import ASGIConnection
from litestar.handlers.base import BaseRouteHandler
from litestar.response import Template

from app.db.models import User
from app.domain.accounts.principals import UserPrincipal
from app.domain.accounts.services import UserService
from app.domain.web.sessions import COOKIE_NAME, WebSession, WebSessions
from app.lib.errors import AronaError, PermissionDeniedError

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
CSRF_HEADER = "x-csrf-token"
CSRF_FIELD = "csrf_token"


class LoginRequiredError(AronaError):
    """No live session: pages answer with a redirect to the login page."""

    status_code = 401
    default_code = "login_required"


@dataclass(frozen=True, slots=True)
class WebUser:
    user: User
    session: WebSession

    @property
    def principal(self) -> UserPrincipal:
        return self.session.principal()

    @property
    def is_admin(self) -> bool:
        return self.user.is_admin


def is_htmx(request: Request[Any, Any, Any]) -> bool:
    return request.headers.get("hx-request") == "true"


_SESSION_STATE_KEY = "web_session"


async def _session_of(
    connection: ASGIConnection[Any, Any, Any, Any], web_sessions: WebSessions
) -> WebSession | None:
    """The request's session, read from the store once per request (the CSRF guard
    and the handler's dependencies both need it)."""
    state = connection.state
    if _SESSION_STATE_KEY not in state:
        state[_SESSION_STATE_KEY] = await web_sessions.load(connection.cookies.get(COOKIE_NAME))
    session: WebSession | None = state[_SESSION_STATE_KEY]
    return session


async def provide_web_session(
    request: Request[Any, Any, Any], web_sessions: WebSessions
) -> WebSession | None:
    return await _session_of(request, web_sessions)


async def provide_web_user(web_session: WebSession | None, users_service: UserService) -> WebUser:
    if web_session is None:
        raise LoginRequiredError("please log in")
    user = await users_service.get_one_or_none(User.id == web_session.user_id)
    if user is None or user.disabled:
        raise LoginRequiredError("this account can no longer log in")
    return WebUser(user=user, session=web_session)


async def provide_page_principal(web_user: WebUser) -> UserPrincipal:
    """The caller of a page is the session's user: set as ``principal`` on pages that
    take the projects area's ``access``, so they share the REST API's one check."""
    return web_user.principal


async def provide_web_admin(web_user: WebUser) -> WebUser:
    if not web_user.is_admin:
        raise PermissionDeniedError("platform admins only", code="admin_required")
    return web_user


async def csrf_guard(connection: ASGIConnection[Any, Any, Any, Any], _: BaseRouteHandler) -> None:
    """Refuse an unsafe request whose CSRF token does not match its session's."""
    if connection.scope.get("method", "GET") in SAFE_METHODS:
        return
    web_sessions: WebSessions = connection.app.state.resources.web_sessions
    session = await _session_of(connection, web_sessions)
    if session is None:
        return  # the handler's own web_user check answers (a redirect to log in)
    sent = connection.headers.get(CSRF_HEADER)
    if sent is None and isinstance(connection, Request):
        form = await connection.form()
        value = form.get(CSRF_FIELD)
        sent = value if isinstance(value, str) else None
    if not sent or not hmac.compare_digest(sent, session.csrf):
        raise PermissionDeniedError(
            "the form is stale or was not sent by this site; reload the page",
            code="csrf_failed",
        )


def render(
    template: str, web_user: WebUser | None = None, *, status_code: int = 200, **context: Any
) -> Template:
    """A template with what every page needs: the user, the CSRF token, the nav."""
    return Template(
        template_name=template,
        context={
            "web_user": web_user,
            "csrf_token": web_user.session.csrf if web_user else "",
            **context,
        },
        status_code=status_code,
    )


def toast(message: str, level: str = "success") -> dict[str, str]:
    """An ``HX-Trigger`` header that makes the page show ``message`` as a toast."""
    return {"HX-Trigger": json.dumps({"toast": {"level": level, "message": message}})}
