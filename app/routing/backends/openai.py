"""Adapter for OpenAI-compatible upstreams (OpenAI, vLLM, GLM, custom LLMs, ...).

The client's body is relayed with its values undecoded; only ``model`` (and the
stream switches) are replaced. Answers are relayed as the upstream's bytes: a
non-streaming answer whole, a stream chunk by chunk without re-encoding, parsing
only what metering needs (``usage``). The backend's own key is sent, or the
call's override key (a project's own provider key) in its place, never both.
"""

from __future__ import annotations

import re
from typing import Any

import aiohttp
import msgspec

from app.lib.http import Headers, UpstreamHttp, frozen_headers
from app.routing.backends.base import Backend, ChatStream
from app.routing.backends.transport import (
    JSON_HEADERS,
    UpstreamChatStream,
    UsageFields,
    fetch,
    invalid_json,
    open_response,
    probe_get,
)
from app.routing.errors import UpstreamError
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
DONE_FRAME = b"data: [DONE]\n\n"
NO_LISTING_REASON = "no model listing (404); static models only"
MAX_PENDING_LINE_BYTES = 8 * 1024 * 1024
"""A partial SSE line longer than this is relayed unscanned rather than buffered."""

# Counts generated text in relayed chunks when the upstream may not report usage: the
# length of every JSON string value of a "content" key, as escaped on the wire. It
# over-counts escapes (\n, \uXXXX) and misses a value split across two network
# chunks; good enough for an estimate, and far cheaper than decoding each chunk.
_CONTENT_RE = re.compile(rb'"content":\s*"((?:[^"\\]|\\.)*)"')


class _UsageOnly(msgspec.Struct):
    usage: UsageFields | None = None


class _Message(msgspec.Struct):
    content: str | None = None


class _Choice(msgspec.Struct):
    message: _Message | None = None


class _ChoicesOnly(msgspec.Struct):
    choices: list[_Choice] = []


class _StreamChunk(msgspec.Struct):
    choices: list[msgspec.Raw] = []
    usage: UsageFields | None = None


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

    async def chat(self, call: UpstreamCall) -> ChatResult:
        body = encode_body(call, stream=False)
        headers = self._headers(call, stream=False)
        status, content = await fetch(self._http, self._chat_url, body, headers)
        usage = _usage_of(content, status)
        chars = 0 if usage is not None else _completion_chars(content)
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
        return OpenAIChatStream(response, include_usage=call.include_usage)

    async def embed(self, call: UpstreamCall) -> EmbeddingResult:
        body = encode_body(call, stream=None)
        headers = self._headers(call, stream=False)
        status, content = await fetch(self._http, self._embeddings_url, body, headers)
        return EmbeddingResult(content=content, usage=_usage_of(content, status))


class OpenAIChatStream(UpstreamChatStream):
    """Relays an upstream SSE body; drops the usage-only chunk the client did not ask for.

    Bytes are passed through as received, cut only at line ends (a partial line waits
    for the rest, so a usage line is always scanned whole). ``count_text`` may be
    turned off by the caller for upstreams known to report usage.
    """

    def __init__(self, response: aiohttp.ClientResponse, *, include_usage: bool) -> None:
        super().__init__(response)
        self._include_usage = include_usage
        self.count_text = True
        self._tail = b""
        self._saw_done = False
        self._ends_event = True
        self._drop_blank = False

    def _on_chunk(self, chunk: bytes) -> bytes:
        return self._relay(chunk)

    def _at_end(self) -> bytes:
        return self._finish()

    def _relay(self, chunk: bytes) -> bytes:
        data = self._tail + chunk if self._tail else chunk
        cut = data.rfind(b"\n") + 1
        if cut == 0:
            if len(data) > MAX_PENDING_LINE_BYTES:
                self._tail = b""
                return data
            self._tail = data
            return b""
        if cut < len(data):
            self._tail = data[cut:]
            data = data[:cut]
        else:
            self._tail = b""
        if self.count_text and self.usage is None:
            self.completion_text_chars += _content_chars(data)
        if not self._saw_done and (b"data: [DONE]" in data or b"data:[DONE]" in data):
            self._saw_done = True
        if self._drop_blank and data[:1] not in (b"\n", b"\r"):
            self._drop_blank = False  # the dropped event's blank line is not next
        if self._drop_blank or (b'"usage"' in data and _mentions_usage_values(data)):
            data = self._take_usage(data)
        if data:
            self._ends_event = data.endswith((b"\n\n", b"\r\n\r\n"))
        return data

    def _take_usage(self, data: bytes) -> bytes:
        """Record reported usage; cut the usage-only event when the client did not ask."""
        lines = data.split(b"\n")
        kept: list[bytes] = []
        dropped = False
        for line in lines[:-1]:  # ``data`` ends with a newline: the last item is empty
            if self._drop_blank:
                self._drop_blank = False
                if not line.strip():
                    dropped = True
                    continue
            if line.startswith(b"data:") and b'"usage"' in line and self._usage_only(line[5:]):
                self._drop_blank = dropped = True
                continue
            kept.append(line)
        if not dropped:
            return data
        return b"\n".join(kept) + b"\n" if kept else b""

    def _usage_only(self, payload: bytes) -> bool:
        """Take the usage of one chunk; True if it is the usage-only chunk to drop."""
        try:
            chunk = msgspec.json.decode(payload, type=_StreamChunk)
        except msgspec.DecodeError:
            return False
        usage = chunk.usage.to_usage() if chunk.usage is not None else None
        if usage is None:
            return False
        self.usage = usage
        return not self._include_usage and not chunk.choices

    def _finish(self) -> bytes:
        """What to add once the upstream closed normally: its last line, then [DONE]."""
        out = b""
        if self._tail:
            tail, self._tail = self._tail, b""
            out = self._relay(tail + b"\n\n")
        if not self._saw_done:
            # A bare newline first closes an event the upstream left open.
            out += (b"" if self._ends_event else b"\n") + DONE_FRAME
        return out


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


def _mentions_usage_values(data: bytes) -> bool:
    # OpenAI repeats "usage":null in every chunk once usage is requested; only a
    # non-null usage is worth decoding.
    nulls = data.count(b'"usage":null') + data.count(b'"usage": null')
    return data.count(b'"usage"') > nulls


def _usage_of(content: bytes, status: int) -> Usage | None:
    try:
        fields = msgspec.json.decode(content, type=_UsageOnly).usage
    except msgspec.ValidationError:
        return None  # valid JSON of an unexpected shape: relay it, estimate usage
    except msgspec.DecodeError as exc:
        raise invalid_json(status) from exc
    return fields.to_usage() if fields is not None else None


def _completion_chars(content: bytes) -> int:
    try:
        choices = msgspec.json.decode(content, type=_ChoicesOnly).choices
    except msgspec.DecodeError:
        return 0
    return sum(len(c.message.content or "") for c in choices if c.message is not None)
