"""``POST .../custom-llms/{name}/test``: one cheap, real call to a custom LLM.

``GET {base}/models`` first (free on every provider); when the endpoint has no
listing (404), a 1-token chat instead. The call goes through the SSRF-guarded pool
with the same headers the gateway will send, and redirects are not followed (the
gateway does not follow them either, so a redirecting base URL would fail there).
The report never contains the key: upstream error text is clipped and the key
masked out of it.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import msgspec

from app.domain.custom_llms.directory import CustomTarget
from app.domain.custom_llms.schemas import CustomLlmTestOut
from app.lib.http import UpstreamHttp, frozen_headers
from app.lib.ssrf import refusal_of
from app.lib.vault import MASK
from app.routing.backends.failures import HTTP_ERRORS, describe_error
from app.routing.backends.openai import discovered_models
from app.routing.backends.transport import (
    BodyTooLargeError,
    read_bounded,
    read_within,
    release_or_close,
)
from app.routing.urls import openai_endpoint

TEST_TIMEOUT_SECONDS = 10.0
MESSAGE_LIMIT = 200


@dataclass(frozen=True, slots=True)
class _Answer:
    status: int
    body: bytes
    latency_ms: int
    location: str | None


@dataclass(frozen=True, slots=True)
class _Failure:
    reason: str
    latency_ms: int


async def _call(
    http: UpstreamHttp,
    method: str,
    url: str,
    headers: dict[str, str],
    body: bytes | None,
    *,
    deadline: float,
) -> _Answer | _Failure:
    """One exchange: a 2xx body up to the pool's listing bound (a larger one fails the
    test), an error body up to its error bound."""
    started = time.perf_counter()
    limits = http.limits

    def elapsed() -> int:
        return round((time.perf_counter() - started) * 1000)

    try:
        async with asyncio.timeout(deadline):
            response = await http.session.request(
                method, url, data=body, headers=frozen_headers(headers), allow_redirects=False
            )
            try:
                if 200 <= response.status < 300:
                    content = await read_within(response, limits.max_listing_bytes)
                else:
                    content = await read_bounded(response, limits.max_error_bytes)
            finally:
                release_or_close(response)
            return _Answer(response.status, content, elapsed(), response.headers.get("Location"))
    except BodyTooLargeError as exc:
        return _Failure(f"answered more than the {exc.limit}-byte limit", elapsed())
    except TimeoutError:
        return _Failure(f"no answer within {deadline:g}s", elapsed())
    except HTTP_ERRORS as exc:
        refused = refusal_of(exc)
        if refused is not None:
            return _Failure(f"refused by the SSRF guard: {refused.reason}", elapsed())
        return _Failure(describe_error(exc), elapsed())


def _message(body: bytes) -> str:
    """The upstream's error message: ``error.message`` of a JSON body, else its text."""
    text: str | None = None
    try:
        document: Any = msgspec.json.decode(body)
    except msgspec.DecodeError:
        document = None
    if isinstance(document, dict):
        error = document.get("error")
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            text = error["message"]
        elif isinstance(error, str):
            text = error
        elif isinstance(document.get("message"), str):
            text = document["message"]
    if text is None:
        text = body.decode("utf-8", "replace")
    text = " ".join(text.split())
    return text if len(text) <= MESSAGE_LIMIT else text[:MESSAGE_LIMIT] + "…"


def _failed_status(answer: _Answer) -> str:
    status = answer.status
    if 300 <= status < 400:
        where = urlsplit(answer.location or "").netloc or "elsewhere"
        return (
            f"answered {status} (a redirect to {where}); redirects are not followed: "
            "set baseUrl to the final address"
        )
    message = _message(answer.body)
    if status in (401, 403):
        return f"answered {status}: the upstream refused the credentials ({message})"
    return f"answered {status}: {message}" if message else f"answered {status}"


def _listing_detail(answer: _Answer, model: str) -> str:
    models = discovered_models(answer.body)
    head = f"model listing answered {answer.status}"
    if not models:
        return head
    if model in models:
        return f"{head}; {model!r} is listed"
    return f"{head}; {model!r} is not among the {len(models)} listed models"


def _report(
    ok: bool, status: int | None, latency_ms: int | None, detail: str, key: str | None
) -> CustomLlmTestOut:
    if key:
        detail = detail.replace(key, MASK)
    return CustomLlmTestOut(ok=ok, status=status, latency_ms=latency_ms, detail=detail)


async def probe_custom_llm(
    http: UpstreamHttp, target: CustomTarget, *, deadline: float = TEST_TIMEOUT_SECONDS
) -> CustomLlmTestOut:
    key = target.api_key
    headers = {"Accept": "application/json", **target.auth_headers()}
    listing = await _call(
        http,
        "GET",
        openai_endpoint(target.base_url, "/models"),
        headers,
        None,
        deadline=deadline,
    )
    if isinstance(listing, _Failure):
        return _report(False, None, listing.latency_ms, listing.reason, key)
    if listing.status != 404:
        if 200 <= listing.status < 300:
            return _report(
                True,
                listing.status,
                listing.latency_ms,
                _listing_detail(listing, target.model),
                key,
            )
        return _report(False, listing.status, listing.latency_ms, _failed_status(listing), key)
    body = msgspec.json.encode(
        {
            "model": target.model,
            "messages": [{"role": "user", "content": "ping"}],
            "max_tokens": 1,
            "stream": False,
        }
    )
    chat = await _call(
        http,
        "POST",
        openai_endpoint(target.base_url, "/chat/completions"),
        {**headers, "Content-Type": "application/json"},
        body,
        deadline=deadline,
    )
    prefix = "no model listing (404); a 1-token chat "
    if isinstance(chat, _Failure):
        return _report(False, None, chat.latency_ms, prefix + "failed: " + chat.reason, key)
    if 200 <= chat.status < 300:
        return _report(True, chat.status, chat.latency_ms, f"{prefix}answered {chat.status}", key)
    return _report(False, chat.status, chat.latency_ms, prefix + _failed_status(chat), key)
