"""Adapter for OpenAI-compatible upstreams (OpenAI, vLLM, GLM, custom LLMs, ...).

The client's body is relayed with its values undecoded; only ``model`` (and the
stream switches) are replaced. Answers are relayed as the upstream's bytes: a
non-streaming answer whole, a stream chunk by chunk without re-encoding, parsing
only what metering needs (``usage``). The backend's own key is sent, or the
call's override key (a project's own provider key) in its place, never both.
"""

from __future__ import annotations

import re
from typing import Any, TypeVar

import aiohttp
import msgspec

from app.lib.http import Headers, UpstreamHttp, UpstreamLimits, frozen_headers
from app.routing.backends.base import Backend, ChatStream
from app.routing.backends.failures import invalid_json, malformed
from app.routing.backends.transport import (
    JSON_HEADERS,
    UsageFields,
    fetch,
    open_response,
    probe_get,
)
from app.routing.backends.upstream_stream import UpstreamChatStream
from app.routing.errors import MAX_UPSTREAM_DETAIL_BYTES, UpstreamError
from app.routing.types import (
    AuthScheme,
    BackendSpec,
    Capability,
    ChatResult,
    EmbeddingResult,
    ProbeResult,
    UpstreamCall,
    Usage,
)
from app.routing.urls import openai_endpoint

TRUE = msgspec.Raw(b"true")
FALSE = msgspec.Raw(b"false")
INCLUDE_USAGE = msgspec.Raw(b'{"include_usage":true}')
NO_LISTING_REASON = "no model listing (404); static models only"
SSE_FIELDS = (b":", b"event:", b"id:", b"retry:")
"""What a non-data SSE line may start with (a comment or another field)."""

# Counts generated text in relayed chunks when the upstream may not report usage: the
# length of every JSON string value of a "content" key, as escaped on the wire. It
# over-counts escapes (\n, \uXXXX) and misses a value split across two network
# chunks; good enough for an estimate, and far cheaper than decoding each chunk.
_CONTENT_RE = re.compile(rb'"content":\s*"((?:[^"\\]|\\.)*)"')


class _UpstreamReply(msgspec.Struct):
    """What every answer is checked for: its usage, or the error it carries instead."""

    usage: UsageFields | None = None
    error: Any = None
    object: str | None = None
    message: str | None = None

    def reported_usage(self) -> Usage | None:
        return self.usage.to_usage() if self.usage is not None else None


class _Message(msgspec.Struct):
    content: Any = None


class _Choice(msgspec.Struct):
    message: _Message | None = None


class _Completion(_UpstreamReply):
    choices: list[_Choice] | None = None


class _Embeddings(_UpstreamReply):
    data: list[msgspec.Raw] | None = None


class _StreamChunk(_UpstreamReply):
    choices: list[msgspec.Raw] | None = None


def auth_headers(scheme: AuthScheme, key: str | None) -> dict[str, str]:
    """The header that carries ``key`` under ``scheme`` (none without a key)."""
    if not key or scheme == "none":
        return {}
    if scheme == "api-key":
        return {"api-key": key}
    if scheme == "ApiKey":
        return {"Authorization": f"ApiKey {key}"}
    return {"Authorization": f"Bearer {key}"}


def _json_headers(auth: dict[str, str]) -> Headers:
    return frozen_headers({**JSON_HEADERS, **auth})


def _stream_headers(auth: dict[str, str]) -> Headers:
    return frozen_headers({**JSON_HEADERS, **auth, "Accept": "text/event-stream"})


class OpenAICompatibleBackend(Backend):
    kind = "external"
    capabilities: frozenset[Capability] = frozenset({"chat", "embeddings"})

    def __init__(self, spec: BackendSpec, http: UpstreamHttp) -> None:
        super().__init__(spec)
        self._http = http
        self._accepts_stream_options = True
        """False once the upstream refused ``stream_options`` (kept per adapter, so a
        re-registration tries again)."""
        self._chat_url = openai_endpoint(spec.url, "/chat/completions")
        self._models_url = openai_endpoint(spec.url, "/models")
        self._embeddings_url = openai_endpoint(spec.url, "/embeddings")
        self._scheme = spec.auth_scheme
        auth = auth_headers(spec.auth_scheme, spec.api_key)
        self._auth = frozen_headers(auth) if auth else None
        self._json_headers = _json_headers(auth)
        self._stream_headers = _stream_headers(auth)

    def _headers(self, call: UpstreamCall, *, stream: bool) -> Headers:
        """The backend's own headers, or ones carrying the call's override key."""
        if call.api_key is None:
            return self._stream_headers if stream else self._json_headers
        auth = auth_headers(self._scheme, call.api_key)
        return _stream_headers(auth) if stream else _json_headers(auth)

    async def probe(self) -> ProbeResult:
        outcome = await probe_get(self._http, self._models_url, self._auth)
        if isinstance(outcome, str):
            return ProbeResult(False, outcome)
        if outcome.status == 404:
            return ProbeResult(True, NO_LISTING_REASON)
        if not outcome.ok:
            return ProbeResult(False, f"status {outcome.status}")
        return ProbeResult(True, "ok", discovered_models(outcome.body))

    async def _post(
        self, url: str, body: bytes, call: UpstreamCall, shape: type[R]
    ) -> tuple[int, bytes, R]:
        """A non-streaming call: the status, the answer's bytes (relayed as they came)
        and the answer checked as ``shape``."""
        status, content = await fetch(self._http, url, body, self._headers(call, stream=False))
        return status, content, _checked(content, status, shape)

    async def chat(self, call: UpstreamCall) -> ChatResult:
        status, content, reply = await self._post(
            self._chat_url, encode_body(call, stream=False), call, _Completion
        )
        if reply.choices is None:
            raise malformed(status, "a chat completion without choices")
        usage = reply.reported_usage()
        chars = 0 if usage is not None else _completion_chars(reply.choices)
        return ChatResult(content=content, usage=usage, completion_text_chars=chars)

    async def chat_stream(self, call: UpstreamCall) -> ChatStream:
        ask_usage = self._accepts_stream_options
        body = encode_body(call, stream=True, ask_usage=ask_usage)
        headers = self._headers(call, stream=True)
        try:
            response = await open_response(
                self._http, "POST", self._chat_url, data=body, headers=headers
            )
        except UpstreamError as exc:
            if not (ask_usage and _refused_stream_options(exc, call)):
                raise
            # A strict upstream refused the field we added, not the client's request:
            # stop adding it (its streams are metered by estimate) and send it as is.
            self._accepts_stream_options = False
            body = encode_body(call, stream=True, ask_usage=False)
            response = await open_response(
                self._http, "POST", self._chat_url, data=body, headers=headers
            )
        return OpenAIChatStream(response, self._http.limits, include_usage=call.include_usage)

    async def embed(self, call: UpstreamCall) -> EmbeddingResult:
        status, content, reply = await self._post(
            self._embeddings_url, encode_body(call, stream=None), call, _Embeddings
        )
        if reply.data is None:
            raise malformed(status, "an embeddings answer without data")
        return EmbeddingResult(content=content, usage=reply.reported_usage())


class OpenAIChatStream(UpstreamChatStream):
    """Relays an upstream SSE body; drops the usage-only chunk the client did not ask for.

    Bytes are passed through as received, cut only at line ends (a partial line waits
    for the rest). Each complete line is checked before it goes out, cheaply: it must
    be an SSE field, a ``data:`` payload must be ``[DONE]`` or a JSON object with
    ``choices`` (or ``usage``), and no line may pass ``max_line_bytes``. An upstream
    error chunk, a line that is none of these, or a body that ends without ``[DONE]``
    fails the stream (``StreamInterruptedError``): garbage is never relayed as an
    answer. ``count_text`` may be turned off by the caller for upstreams known to
    report usage.
    """

    def __init__(
        self, response: aiohttp.ClientResponse, limits: UpstreamLimits, *, include_usage: bool
    ) -> None:
        super().__init__(response, limits)
        self._include_usage = include_usage
        self.count_text = True
        self._saw_done = False
        self._drop_blank = False

    def _on_chunk(self, chunk: bytes) -> bytes:
        return self._relay(chunk)

    def _at_end(self) -> bytes:
        out = b""
        if self._tail:
            tail, self._tail = self._tail, b""
            out = self._relay(tail + b"\n\n")
        if not self._saw_done:
            raise self.interrupted("the upstream ended the stream without [DONE]")
        return out

    def _relay(self, chunk: bytes) -> bytes:
        data = self.whole_lines(chunk)
        if not data:
            return b""
        if self.count_text and self.usage is None:
            self.completion_text_chars += _content_chars(data)
        return self._checked(data)

    def _checked(self, data: bytes) -> bytes:
        """``data`` (whole lines) as it may go out: every line checked, usage recorded,
        the usage-only event removed when the client did not ask for it."""
        lines = data.split(b"\n")
        drop: list[int] = []
        for at, line in enumerate(lines[:-1]):  # ``data`` ends with a newline
            if len(line) > self.max_line_bytes:
                raise self.line_too_long()
            if not line or line == b"\r":
                if self._drop_blank:
                    drop.append(at)  # the dropped event's blank line
                self._drop_blank = False
                continue
            self._drop_blank = False
            if line.startswith(b"data:"):
                if self._data_line(line[5:]):
                    drop.append(at)
                    self._drop_blank = True
            elif not line.startswith(SSE_FIELDS):
                raise self.interrupted("the upstream answer is not an event stream")
        if not drop:
            return data
        return b"".join(line + b"\n" for at, line in enumerate(lines[:-1]) if at not in drop)

    def _data_line(self, payload: bytes) -> bool:
        """Check one ``data:`` payload and take its usage; True to drop it (the usage-only
        chunk the client did not ask for)."""
        payload = payload.strip()
        if payload == b"[DONE]":
            self._saw_done = True
            return False
        if self._saw_done:
            return False  # after the end: nothing the client will read
        try:
            chunk = msgspec.json.decode(payload, type=_StreamChunk)
        except (msgspec.DecodeError, msgspec.ValidationError):
            raise self.interrupted("the upstream sent a frame that is not JSON") from None
        if chunk.error is not None or chunk.object == "error":
            raise self.interrupted(f"upstream error: {_error_message(chunk)}")
        usage = chunk.reported_usage()
        if chunk.choices is None and usage is None:
            raise self.interrupted("the upstream sent a chunk without choices")
        if usage is None:
            return False
        self.usage = usage
        return not self._include_usage and not chunk.choices


def encode_body(call: UpstreamCall, *, stream: bool | None, ask_usage: bool = True) -> bytes:
    """The client's body with the backend's model name; ``stream`` None leaves it as is."""
    body: dict[str, msgspec.Raw] = dict(call.body)
    body["model"] = msgspec.Raw(msgspec.json.encode(call.model))
    if stream is True:
        body["stream"] = TRUE
        if ask_usage:
            # Ask for usage so metering never has to guess; the relay hides the usage
            # chunk again from a client that did not ask for it.
            body["stream_options"] = _with_include_usage(call.body.get("stream_options"))
    elif stream is False:
        body.pop("stream_options", None)
        if "stream" in body:
            body["stream"] = FALSE
    return msgspec.json.encode(body)


def _refused_stream_options(exc: UpstreamError, call: UpstreamCall) -> bool:
    return (
        exc.upstream_status in (400, 422)
        and "stream_options" in exc.message
        and "stream_options" not in call.body
    )


def _with_include_usage(raw: msgspec.Raw | None) -> msgspec.Raw:
    if raw is None:
        return INCLUDE_USAGE
    try:
        options = msgspec.json.decode(raw)
    except msgspec.DecodeError:
        return INCLUDE_USAGE
    if not isinstance(options, dict):
        return INCLUDE_USAGE
    options["include_usage"] = True
    return msgspec.Raw(msgspec.json.encode(options))


def discovered_models(body: bytes) -> tuple[str, ...]:
    """Model ids from a listing: ``data`` or ``models`` arrays of objects or strings."""
    try:
        document: Any = msgspec.json.decode(body)
    except msgspec.DecodeError:
        return ()
    arrays: list[Any] = []
    if isinstance(document, list):
        arrays.append(document)
    elif isinstance(document, dict):
        arrays.extend(document.get(key) for key in ("data", "models"))
    names: list[str] = []
    for array in arrays:
        if not isinstance(array, list):
            continue
        for item in array:
            name = item
            if isinstance(item, dict):
                name = item.get("id") if isinstance(item.get("id"), str) else item.get("name")
            if isinstance(name, str) and name.strip():
                names.append(name.strip())
    return tuple(dict.fromkeys(names))


def _content_chars(data: bytes) -> int:
    return sum(match.end(1) - match.start(1) for match in _CONTENT_RE.finditer(data))


def _error_message(chunk: _UpstreamReply) -> str:
    error = chunk.error
    if isinstance(error, dict) and isinstance(error.get("message"), str):
        text: str = error["message"]
    elif isinstance(error, str):
        text = error
    else:
        text = chunk.message or "unspecified"
    return text[:MAX_UPSTREAM_DETAIL_BYTES]


R = TypeVar("R", bound=_UpstreamReply)


def _checked(content: bytes, status: int, shape: type[R]) -> R:
    """``content`` decoded as ``shape``; an ``UpstreamError`` for a body that is not JSON,
    not of that shape, or an error object sent with a 2xx status."""
    try:
        reply = msgspec.json.decode(content, type=shape)
    except msgspec.ValidationError as exc:
        raise malformed(status, f"an answer of the wrong shape ({exc})") from None
    except msgspec.DecodeError:
        raise invalid_json(status) from None
    if reply.error is not None or reply.object == "error":
        raise UpstreamError(
            f"upstream {status}: {_error_message(reply)}", status=status, retryable=True
        )
    return reply


def _completion_chars(choices: list[_Choice]) -> int:
    return sum(
        len(c.message.content)
        for c in choices
        if c.message is not None and isinstance(c.message.content, str)
    )
