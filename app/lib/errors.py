"""The one error shape of the API: ``{"error": {"message", "type", "code", "param"}}``.

Domain code raises ``AronaError`` subclasses; the exception handlers in
``app.server.errors`` turn them (and framework errors) into this shape.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

ERROR_TYPES: Mapping[int, str] = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    409: "conflict_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    422: "invalid_request_error",
    429: "rate_limit_error",
    500: "api_error",
    502: "api_error",
    503: "api_error",
    504: "api_error",
}


ERRORS_OPT = "errors"
"""Route handlers list the error statuses they answer beyond the usual ones under this
key of their ``opt`` (``opt={ERRORS_OPT: (404, 429)}``); the OpenAPI document lists
them (``app.server.openapi``)."""


def error_type_for(status: int) -> str:
    if status in ERROR_TYPES:
        return ERROR_TYPES[status]
    return "invalid_request_error" if status < 500 else "api_error"


def error_body(
    status: int,
    message: str,
    code: str,
    param: str | None = None,
    extra: Mapping[str, Any] | None = None,
) -> dict[str, dict[str, Any]]:
    """The error shape; ``extra`` adds fields next to the four standard ones (it
    cannot replace them), e.g. the free names of a 409 ``custom_llm_exists``."""
    error: dict[str, Any] = {
        "message": message,
        "type": error_type_for(status),
        "code": code,
        "param": param,
    }
    for key, value in (extra or {}).items():
        error.setdefault(key, value)
    return {"error": error}


class AronaError(Exception):
    """An error with a stable HTTP status and machine-readable code."""

    status_code: int = 500
    default_code: str = "internal_error"

    def __init__(
        self,
        message: str,
        *,
        code: str | None = None,
        param: str | None = None,
        headers: Mapping[str, str] | None = None,
        extra: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.code = code or self.default_code
        self.param = param
        self.headers: dict[str, str] = dict(headers or {})
        self.extra: dict[str, Any] = dict(extra or {})
        """Fields added to the error object beside the standard four."""

    def body(self) -> dict[str, dict[str, Any]]:
        return error_body(self.status_code, self.message, self.code, self.param, self.extra)


class BadRequestError(AronaError):
    status_code = 400
    default_code = "invalid_request"


class AuthenticationError(AronaError):
    status_code = 401
    default_code = "unauthorized"

    def __init__(self, message: str = "authentication required", **kwargs: Any) -> None:
        kwargs.setdefault("headers", {"WWW-Authenticate": "Bearer"})
        super().__init__(message, **kwargs)


class PermissionDeniedError(AronaError):
    status_code = 403
    default_code = "forbidden"


class NotFoundError(AronaError):
    status_code = 404
    default_code = "not_found"


class ConflictError(AronaError):
    status_code = 409
    default_code = "conflict"


class PayloadTooLargeError(AronaError):
    status_code = 413
    default_code = "request_too_large"


class RateLimitedError(AronaError):
    status_code = 429
    default_code = "rate_limited"

    def __init__(self, message: str, *, retry_after: float, **kwargs: Any) -> None:
        seconds = max(1, int(retry_after + 0.999))
        headers = dict(kwargs.pop("headers", None) or {})
        headers["Retry-After"] = str(seconds)
        super().__init__(message, headers=headers, **kwargs)
        self.retry_after = seconds


class ServiceUnavailableError(AronaError):
    status_code = 503
    default_code = "service_unavailable"
