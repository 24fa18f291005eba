"""Exception handlers: every error leaves in the one error shape."""

from __future__ import annotations

import json
import re
from typing import Any
from urllib.parse import urlencode

import structlog
from advanced_alchemy.exceptions import DuplicateKeyError
from advanced_alchemy.exceptions import NotFoundError as RepositoryNotFoundError
from litestar import MediaType, Request, Response
from litestar.exceptions import HTTPException, SerializationException, ValidationException
from litestar.response import Redirect, Template
from litestar.types import ExceptionHandlersMap

from app.db.outage import DatabaseUnavailableError, is_database_outage
from app.domain.web.return_to import page_to_return_to
from app.lib.errors import AronaError, error_body

logger = structlog.get_logger()

_HTTP_CODES = {
    400: "invalid_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    413: "request_too_large",
    415: "unsupported_media_type",
    429: "rate_limited",
}


def _json(
    status: int, body: dict[str, Any], headers: dict[str, str] | None = None
) -> Response[Any]:
    return Response(content=body, status_code=status, media_type=MediaType.JSON, headers=headers)


def current_request_id() -> str | None:
    value = structlog.contextvars.get_contextvars().get("request_id")
    return value if isinstance(value, str) else None


# The HTML faces; everything else (the APIs, ops endpoints) answers in JSON.
_PAGE_PREFIXES = ("/login", "/logout", "/register", "/projects", "/admin")
# Never a page, whatever the client accepts: API clients parse the one error shape,
# and ops endpoints and assets are read by machines.
_MACHINE_PREFIXES = ("/api/", "/v1/", "/ws/", "/static/", "/schema")
_MACHINE_PATHS = frozenset({"/api", "/v1", "/healthz", "/readyz", "/metrics"})
_PAGE_TITLES = {
    401: "Please log in",
    403: "Not allowed",
    404: "Not found",
    429: "Slow down",
    503: "Temporarily unavailable",
}


def _is_page(request: Request[Any, Any, Any]) -> bool:
    """A console or dashboard path, or any other non-API path a browser asked for
    (a mistyped ``/console/...`` link is a person's, and deserves a page, not JSON)."""
    path = request.url.path
    if path == "/" or path.startswith(_PAGE_PREFIXES):
        return True
    if path in _MACHINE_PATHS or path.startswith(_MACHINE_PREFIXES):
        return False
    return "text/html" in request.headers.get("accept", "")


def _way_back(path: str) -> tuple[str, str]:
    """Where the error page's link leads: the area the visitor was in."""
    if path == "/admin" or path.startswith("/admin/"):
        return "/admin", "Back to the dashboard"
    return "/projects", "Back to your projects"


def _page_error(request: Request[Any, Any, Any], status: int, message: str) -> Response[Any]:
    """Errors on the HTML faces: a login redirect, a toast for HTMX, or an error page."""
    htmx = request.headers.get("hx-request") == "true"
    if status == 401:
        target = "/login?" + urlencode({"next": page_to_return_to(request)})
        if htmx:
            # The event comes before the redirect: the console's script keeps what the
            # asking form held, to put it back once the visitor is signed in again.
            expired = json.dumps({"loginRequired": {"login": target}})
            headers = {"HX-Redirect": target, "HX-Trigger": expired}
            return Response(content=b"", status_code=200, headers=headers)
        return Redirect(target)
    if htmx:
        trigger = json.dumps({"toast": {"level": "error", "message": message}})
        return Response(content=b"", status_code=status, headers={"HX-Trigger": trigger})
    back_href, back_label = _way_back(request.url.path)
    return Template(
        template_name="error.html",
        context={
            "status": status,
            "back_href": back_href,
            "back_label": back_label,
            "title": _PAGE_TITLES.get(status, "Something went wrong"),
            "message": message,
            "web_user": None,
            "csrf_token": "",
        },
        status_code=status,
    )


def handle_arona_error(request: Request[Any, Any, Any], exc: AronaError) -> Response[Any]:
    if _is_page(request):
        return _page_error(request, exc.status_code, exc.message)
    return _json(exc.status_code, exc.body(), exc.headers or None)


# msgspec names the offending field only in the message for these (the key is "data").
_FIELD_IN_MESSAGE = re.compile(r"(?:unknown|missing required) field `([^`]+)`")


def _validation_param(extra: Any) -> tuple[str | None, str | None]:
    if isinstance(extra, list) and extra and isinstance(extra[0], dict):
        first = extra[0]
        key = first.get("key")
        message = first.get("message")
        if key == "data" and isinstance(message, str):
            named = _FIELD_IN_MESSAGE.search(message)
            if named:
                key = named.group(1)
        if key == "data" and first.get("source") == "body":
            # The body as a whole is wrong (not an object, say): no field to name, and
            # `data` is only the handler's argument name.
            key = None
        return (str(key) if key else None, str(message) if message else None)
    return None, None


def _body_missing(extra: Any) -> bool:
    """Litestar reports an absent body as a KeyError for the ``data`` argument."""
    return (
        isinstance(extra, list)
        and len(extra) == 1
        and isinstance(extra[0], dict)
        and extra[0].get("key") == "data"
        and extra[0].get("message") == "'data'"
    )


def handle_validation_error(_: Request[Any, Any, Any], exc: ValidationException) -> Response[Any]:
    if _body_missing(exc.extra):
        message = "request body is missing: expected a JSON object"
        return _json(400, error_body(400, message, "invalid_json"))
    param, detail = _validation_param(exc.extra)
    if detail and param:
        message = f"invalid value for `{param}`: {detail}"
    elif detail:
        message = detail
    else:
        message = "request body is not valid JSON or does not match the expected schema"
    code = "invalid_json" if detail and "malformed" in detail.lower() else "invalid_request"
    return _json(400, error_body(400, message, code, param))


def handle_http_exception(request: Request[Any, Any, Any], exc: HTTPException) -> Response[Any]:
    status = exc.status_code
    if status >= 500:
        return handle_unexpected(request, exc)
    if _is_page(request) and status in (403, 404, 405):
        return _page_error(
            request, status, "There is no such page." if status == 404 else str(exc.detail)
        )
    code = _HTTP_CODES.get(status, "invalid_request")
    message = exc.detail or "request failed"
    if status == 404:
        message = "no such route" if exc.detail in ("", "Not Found") else exc.detail
    if status == 413:
        message = "request body is larger than the limit"
    if status == 400 and isinstance(exc.__cause__, SerializationException):
        # Litestar's wrapper for a body msgspec could not decode.
        code = "invalid_json"
        if "JSON" not in message:
            message = f"request body is not valid JSON: {message}"
    headers = dict(exc.headers) if exc.headers else None
    return _json(status, error_body(status, message, code), headers)


def handle_repository_not_found(
    request: Request[Any, Any, Any], exc: RepositoryNotFoundError
) -> Response[Any]:
    if _is_page(request):
        return _page_error(request, 404, "There is no such page.")
    return _json(404, error_body(404, "not found", "not_found"))


def handle_duplicate(_: Request[Any, Any, Any], exc: DuplicateKeyError) -> Response[Any]:
    return _json(409, error_body(409, "a record with these values already exists", "conflict"))


def handle_database_outage(request: Request[Any, Any, Any], exc: Exception) -> Response[Any]:
    """The database is unreachable: a 503 the client can retry, not an internal error.

    Logged as a one-line warning without a trace: during an outage every write
    fails the same way, and the replica keeps serving what its caches hold.
    """
    logger.warning("database unreachable", error_type=type(exc).__name__, path=request.url.path)
    unavailable = exc if isinstance(exc, DatabaseUnavailableError) else DatabaseUnavailableError()
    return handle_arona_error(request, unavailable)


def handle_unexpected(request: Request[Any, Any, Any], exc: Exception) -> Response[Any]:
    if is_database_outage(exc):
        return handle_database_outage(request, exc)
    request_id = current_request_id()
    # Unexpected errors are bugs: log the trace once, server side only.
    logger.exception("unhandled error", error_type=type(exc).__name__)
    message = "internal error"
    if request_id:
        message = f"internal error (request id {request_id})"
    return _json(500, error_body(500, message, "internal_error"))


def exception_handlers() -> ExceptionHandlersMap:
    return {
        AronaError: handle_arona_error,
        ValidationException: handle_validation_error,
        HTTPException: handle_http_exception,
        RepositoryNotFoundError: handle_repository_not_found,
        DuplicateKeyError: handle_duplicate,
        Exception: handle_unexpected,
    }
