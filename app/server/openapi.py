"""The error side of the OpenAPI document.

Handlers declare what they return; most errors they can answer with follow from where
they sit (auth, path parameters, writes, the database behind them), and every one has
the same body. Rather than repeating that on a hundred decorators, the document is
completed once, when the app starts, from those rules; a handler that answers more
declares it beside its code with ``opt={"errors": (404, 429)}``.

The statuses are kept complete by the test suite (``tests/support/status_contract.py``: every
error status any test sees must be documented) and by the schemathesis job
(``status_code_conformance``).
"""

from __future__ import annotations

from litestar import Litestar
from litestar.openapi.spec import (
    Components,
    OpenAPIMediaType,
    OpenAPIResponse,
    OpenAPIType,
    Operation,
    Reference,
    Schema,
)

from app.lib.errors import ERRORS_OPT

ERROR_SCHEMA = "Error"
_PUBLIC_PREFIXES = ("/api/auth/login", "/api/auth/register", "/api/auth/refresh", "/healthz")
_BACKED_PREFIXES = ("/api/", "/v1/")
"""Routes that read the database or the state store, which can be unreachable (503)."""

_OPS = ("get", "post", "put", "patch", "delete")
_WRITES = frozenset({"post", "put", "patch", "delete"})
_DESCRIPTIONS = {
    400: "Invalid input: `param` names the field, `code` says what is wrong",
    401: "Missing, malformed, expired or revoked credentials",
    403: "The credentials are valid but may not do this (`code` says why)",
    404: "Not found, or another project's (the two are not told apart)",
    409: "Conflicts with the current state (a name in use, an object still referenced)",
    413: "The request body is larger than ARONA_MAX_BODY_BYTES",
    429: "A quota or rate limit is spent; `Retry-After` says when to retry",
    500: "Every backend able to serve the call is unavailable",
    502: (
        "The upstream failed, answered past its bounds or answered garbage; "
        "`error.upstream_status` is its status, an upstream 429's `Retry-After` is "
        "forwarded, and `x-should-retry: false` marks an upstream client error"
    ),
    503: "A dependency (the database, the state store, an agent) is unreachable",
}


def _error_schema() -> Schema:
    text = Schema(type=OpenAPIType.STRING)
    nullable_text = Schema(one_of=[text, Schema(type=OpenAPIType.NULL)])
    upstream_status = Schema(
        type=OpenAPIType.INTEGER,
        description="On a 502: the HTTP status the upstream answered (absent when none did)",
    )
    detail = Schema(
        type=OpenAPIType.OBJECT,
        properties={
            "message": text,
            "type": text,
            "code": text,
            "param": nullable_text,
            "upstream_status": upstream_status,
        },
        required=["message", "type", "code", "param"],
    )
    return Schema(
        type=OpenAPIType.OBJECT,
        properties={"error": detail},
        required=["error"],
        description="The one error shape of the API",
    )


def _statuses(path: str, method: str, declared: set[int]) -> list[int]:
    statuses = {400, *declared}
    if not path.startswith(_PUBLIC_PREFIXES):
        statuses |= {401, 403}
    if "{" in path:
        statuses.add(404)
    if method in _WRITES:
        statuses |= {409, 413}
    if path.startswith(_BACKED_PREFIXES):
        statuses.add(503)
    return sorted(statuses)


def _declared(app: Litestar) -> dict[tuple[str, str], set[int]]:
    """(path, method) -> the statuses its handler declares in ``opt["errors"]``."""
    declared: dict[tuple[str, str], set[int]] = {}
    for route in app.routes:
        for handler in getattr(route, "route_handlers", ()):
            errors = handler.opt.get(ERRORS_OPT)
            if not errors:
                continue
            for method in getattr(handler, "http_methods", ()):
                key = (route.path_format, method.lower())
                declared.setdefault(key, set()).update(errors)
    return declared


def document_errors(app: Litestar) -> None:
    """Add the error responses to every operation of ``app``'s OpenAPI document."""
    schema = app.openapi_schema
    components = schema.components
    if isinstance(components, list) or components is None:
        components = Components()
        schema.components = components
    components.schemas = {**(components.schemas or {}), ERROR_SCHEMA: _error_schema()}
    reference = Reference(ref=f"#/components/schemas/{ERROR_SCHEMA}")
    declared = _declared(app)
    for path, item in (schema.paths or {}).items():
        for method in _OPS:
            operation: Operation | None = getattr(item, method, None)
            if operation is None:
                continue
            responses = dict(operation.responses or {})
            for status in _statuses(path, method, declared.get((path, method), set())):
                responses[str(status)] = OpenAPIResponse(
                    description=_DESCRIPTIONS[status],
                    content={"application/json": OpenAPIMediaType(schema=reference)},
                )
            operation.responses = responses
