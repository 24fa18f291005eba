"""Route decoded JSON-RPC messages to methods; single requests, notifications, batches.

A method declares a msgspec struct for its params (by name; positional params are
refused with -32602) and an async handler taking the transport's context and the
converted params. What the handler raises becomes the error object: ``RpcError`` as
is, ``AronaError`` through ``rpc_error_of``, anything else -32603 (logged once, the
client sees only the request id of the log line). Notifications run the same way
and never get an answer, not even an error. A batch runs its members one after
another, in order (a member's side effects are visible to the next).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import msgspec
import structlog

from app.domain.rpc.protocol import (
    INTERNAL_ERROR,
    METHOD_NOT_FOUND,
    RpcError,
    RpcRequest,
    decode_body,
    encode,
    encode_error,
    error_response,
    invalid_params,
    invalid_request,
    params_error,
    response,
    rpc_error_of,
)
from app.lib.errors import AronaError
from app.lib.input_checks import unstorable, unstorable_path

logger = structlog.get_logger()

MAX_BATCH = 100
"""Members of one batch; a bigger batch is refused whole (-32600)."""

Ctx = TypeVar("Ctx")


@dataclass(frozen=True, slots=True)
class Method(Generic[Ctx]):
    name: str
    params: type[msgspec.Struct]
    handler: Callable[[Ctx, Any], Awaitable[Any]]


class Dispatcher(Generic[Ctx]):
    def __init__(
        self,
        methods: Iterable[Method[Ctx]],
        *,
        elsewhere: Mapping[str, str] | None = None,
        request_id: Callable[[], str | None] = lambda: None,
    ) -> None:
        """``elsewhere``: methods another transport offers, with the -32601 message
        that says where; ``request_id``: the log correlation id for -32603 messages."""
        self._methods = {method.name: method for method in methods}
        self._elsewhere = dict(elsewhere or {})
        self._request_id = request_id

    async def handle(self, body: bytes | str, ctx: Ctx) -> bytes | None:
        """The encoded answer to a message, or None when nothing is to be sent."""
        try:
            message = decode_body(body)
        except RpcError as exc:
            return encode_error(exc)
        if isinstance(message, list):
            if not message:
                return encode_error(invalid_request("invalid request: the batch is empty"))
            if len(message) > MAX_BATCH:
                error = invalid_request(f"invalid request: a batch holds at most {MAX_BATCH}")
                return encode_error(error)
            answers = []
            for member in message:
                answer = await self.handle_one(member, ctx)
                if answer is not None:
                    answers.append(answer)
            return encode(answers) if answers else None
        answer = await self.handle_one(message, ctx)
        return None if answer is None else encode(answer)

    async def handle_one(self, message: Any, ctx: Ctx) -> dict[str, Any] | None:
        """The response object of one decoded member, None for a notification."""
        try:
            request = msgspec.convert(message, RpcRequest)
        except msgspec.ValidationError as exc:
            # The id is echoed when it can be read; anything else answers with null.
            found = message.get("id") if isinstance(message, dict) else None
            request_id = found if _valid_id(found) else None
            return error_response(request_id, invalid_request(f"invalid request: {exc}"))
        try:
            result = await self._call(request, ctx)
        except RpcError as exc:
            error = exc
        except AronaError as exc:
            error = rpc_error_of(exc)
        except Exception as exc:
            error = self._internal(request, exc)
        else:
            return None if request.is_notification else response(request.request_id, result)
        return None if request.is_notification else error_response(request.request_id, error)

    async def _call(self, request: RpcRequest, ctx: Ctx) -> Any:
        method = self._methods.get(request.method)
        if method is None:
            hint = self._elsewhere.get(request.method)
            message = hint or f"method not found: {request.method[:100]}"
            raise RpcError(METHOD_NOT_FOUND, message)
        if isinstance(request.params, list):
            raise invalid_params("invalid params: pass params by name (an object)", None)
        raw = {} if isinstance(request.params, msgspec.UnsetType) else request.params
        where = unstorable_path(raw)
        if where is not None:
            # Params end up in rows (a job's prompt): refused before any method runs.
            raise rpc_error_of(unstorable(where))
        try:
            params = msgspec.convert(raw, method.params)
        except msgspec.ValidationError as exc:
            raise params_error(exc) from None
        return await method.handler(ctx, params)

    def _internal(self, request: RpcRequest, exc: Exception) -> RpcError:
        # A bug: the trace goes to the log once, the client gets a correlation id.
        logger.exception("rpc method failed", method=request.method, error_type=type(exc).__name__)
        request_id = self._request_id()
        message = "internal error" + (f" (request id {request_id})" if request_id else "")
        return RpcError(INTERNAL_ERROR, message, {"code": "internal_error", "status": 500})


def _valid_id(value: Any) -> bool:
    return value is None or (isinstance(value, str | int | float) and not isinstance(value, bool))
