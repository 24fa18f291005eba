"""JSON-RPC 2.0 messages: decoding, error objects, encoding.

Framework-free: bytes in, bytes out. The mapping of the project's errors to JSON-RPC
errors lives here so every transport answers a failure the same way (see the
package docstring for the table).
"""

from __future__ import annotations

import re
from typing import Any, Literal

import msgspec
from msgspec import UNSET, UnsetType

from app.lib.errors import AronaError, BadRequestError, RateLimitedError
from app.lib.input_checks import decode_json_document

VERSION = "2.0"
PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603
APPLICATION_ERROR = -32000

RequestId = str | int | float | None

_FIELD = re.compile(r"(?:missing required|unknown) field `([^`]+)`")
_PATH = re.compile(r" - at `\$((?:\.[^`]*|\[[^`]*)*)`$")


class RpcRequest(msgspec.Struct):
    """One request object; ``id`` left out (not ``null``) makes it a notification."""

    jsonrpc: Literal["2.0"]
    method: str
    params: dict[str, Any] | list[Any] | UnsetType = UNSET
    id: str | int | float | UnsetType | None = UNSET

    @property
    def is_notification(self) -> bool:
        return self.id is UNSET

    @property
    def request_id(self) -> RequestId:
        return None if isinstance(self.id, UnsetType) else self.id


class RpcError(Exception):
    """A JSON-RPC error object on its way to the client."""

    def __init__(self, code: int, message: str, data: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.data = data

    def payload(self) -> dict[str, Any]:
        error: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.data is not None:
            error["data"] = self.data
        return error


def rpc_error_of(exc: AronaError) -> RpcError:
    """The stable mapping of an application error (see the package docstring)."""
    data: dict[str, Any] = {"code": exc.code, "status": exc.status_code}
    if exc.param is not None:
        data["param"] = exc.param
    if isinstance(exc, RateLimitedError):
        data["retry_after"] = exc.retry_after
    for key, value in exc.extra.items():
        data.setdefault(key, value)
    code = INVALID_PARAMS if exc.status_code == 400 else APPLICATION_ERROR
    return RpcError(code, exc.message, data)


def invalid_request(message: str, **data: Any) -> RpcError:
    return RpcError(INVALID_REQUEST, message, {"code": "invalid_request", "status": 400, **data})


def invalid_params(message: str, param: str | None) -> RpcError:
    data: dict[str, Any] = {"code": "invalid_request", "status": 400}
    if param:
        data["param"] = param
    return RpcError(INVALID_PARAMS, message, data)


def param_of(exc: msgspec.ValidationError) -> str | None:
    """The field a msgspec error is about, as a dotted path (``images[0].mime_type``)."""
    message = str(exc)
    parts: list[str] = []
    path = _PATH.search(message)
    if path and path.group(1):
        parts.append(path.group(1).removeprefix("."))
    field = _FIELD.search(message)
    if field:
        parts.append(field.group(1))
    return ".".join(parts).replace(".[", "[") or None


def params_error(exc: msgspec.ValidationError) -> RpcError:
    detail = str(exc).split(" - at ")[0]
    return invalid_params(f"invalid params: {detail}", param_of(exc))


def decode_body(body: bytes | str) -> Any:
    """The JSON value of a message; -32700 when it is not JSON, or nested past the
    bound (``app.lib.input_checks``)."""
    raw = body.encode() if isinstance(body, str) else body
    try:
        return decode_json_document(raw)
    except BadRequestError as exc:
        detail = exc.message.removeprefix("request body is not valid JSON: ")
        raise RpcError(PARSE_ERROR, f"parse error: {detail}", {"code": exc.code}) from None


def response(request_id: RequestId, result: Any) -> dict[str, Any]:
    return {"jsonrpc": VERSION, "id": request_id, "result": result}


def error_response(request_id: RequestId, error: RpcError) -> dict[str, Any]:
    return {"jsonrpc": VERSION, "id": request_id, "error": error.payload()}


def notification(method: str, params: dict[str, Any]) -> dict[str, Any]:
    return {"jsonrpc": VERSION, "method": method, "params": params}


def encode(message: Any) -> bytes:
    """A response, a batch of them or a notification (msgspec structs included)."""
    return msgspec.json.encode(message)


def encode_error(error: RpcError, request_id: RequestId = None) -> bytes:
    return encode(error_response(request_id, error))
