"""One raw ASGI middleware for the per-request basics: request id, metrics, access log.

Raw ASGI (not a Litestar middleware class) keeps it to a few dict operations per
request, which matters on the hot path.
"""

from __future__ import annotations

import re
import time

import structlog
from litestar.enums import ScopeType
from litestar.types import ASGIApp, HTTPScope, Message, Receive, Scope, Send

from app.lib.ids import request_id as new_request_id
from app.lib.log_budget import RepeatBudget
from app.server.metrics import HttpMetrics

_VALID_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:\-]{1,128}$")
# Pages load only what Arona serves itself: no inline script or style, no framing.
_PAGE_SECURITY_HEADERS = (
    (
        b"content-security-policy",
        b"default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        b"connect-src 'self'; frame-ancestors 'none'; base-uri 'self'; form-action 'self'",
    ),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"same-origin"),
)
_API_PREFIXES = ("/v1/", "/api/")


def _is_page(path: str) -> bool:
    return not path.startswith(_API_PREFIXES)


logger = structlog.get_logger("arona.access")


def _incoming_request_id(scope: Scope) -> str | None:
    for name, value in scope.get("headers", ()):
        if name == b"x-request-id":
            candidate = value.decode("latin-1")
            return candidate if _VALID_REQUEST_ID.match(candidate) else None
    return None


def request_context_middleware(metrics: HttpMetrics) -> type:
    # One budget per app: a flood of failures of one route writes one line per
    # interval (with the count held back), not one per request.
    failure_lines = RepeatBudget()

    class RequestContextMiddleware:
        def __init__(self, app: ASGIApp) -> None:
            self.app = app

        async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
            if scope["type"] != ScopeType.HTTP:
                await self.app(scope, receive, send)
                return
            http_scope: HTTPScope = scope
            method = http_scope["method"]
            request_id = _incoming_request_id(scope) or new_request_id()
            header = (b"x-request-id", request_id.encode("latin-1"))
            extra = (header, *_PAGE_SECURITY_HEADERS) if _is_page(http_scope["path"]) else (header,)
            structlog.contextvars.clear_contextvars()
            structlog.contextvars.bind_contextvars(request_id=request_id)
            started = time.perf_counter()
            status = 500

            async def send_with_id(message: Message) -> None:
                nonlocal status
                if message["type"] == "http.response.start":
                    status = message["status"]
                    message["headers"] = [*message.get("headers", ()), *extra]
                await send(message)

            try:
                await self.app(scope, receive, send_with_id)
            finally:
                elapsed = time.perf_counter() - started
                route = scope.get("path_template") or "unmatched"
                metrics.observe(method, route, status, elapsed)
                if status >= 500:
                    held_back = failure_lines.admit((method, route, status))
                    if held_back is not None:
                        logger.warning(
                            "request failed",
                            method=method,
                            route=route,
                            status=status,
                            similar_not_logged=held_back,
                        )

    return RequestContextMiddleware
