"""Adapter for the MiniMax Open Platform video API (kind ``minimax-cloud``).

Task-style generation over the shared aiohttp pool, Bearer auth with the backend's own
key (a project's override key is not used for video):

- create ``POST {base}/v1/video_generation`` -> ``task_id``;
- poll ``GET {base}/v1/query/video_generation?task_id=`` -> ``status``, ``file_id``;
- resolve ``GET {base}/v1/files/retrieve?file_id=`` -> ``file.download_url``.

URLs follow the other kinds (``app.routing.urls``): a root-style base
(``https://api.minimax.io``) gets ``/v1/...``; a base with a path
(``https://api.minimax.io/v1``) gets the endpoint appended directly.

The backend serves its static model list alone: there is no model discovery, and the
probe returns no models. It serves neither chat nor embeddings (capability ``video``
only), so routing never sends it a chat call.

Decisions, in the order of the request body:

- ``model``: the name the chosen backend advertises. ``model`` and ``prompt`` keys in
  ``extra`` are ignored: routing and validation decided those.
- ``prompt``: sent as given. MiniMax has no negative prompt, and appending one to the
  prompt ("avoid: ...") tends to summon what it names, so ``negative_prompt`` is *not*
  sent; a client that wants a provider-native field sends it in ``extra``, which is
  passed through verbatim (``extra: {"negative_prompt": "..."}`` reaches MiniMax as is).
- ``duration``: MiniMax's video models take 6 or 10 seconds. The requested seconds snap
  to the nearest of ``SUPPORTED_DURATIONS``, a tie going to the shorter (cheaper) one:
  1-8 s -> 6, above 8 s -> 10. An integer ``extra["duration"]`` wins over the mapping,
  for durations a newer model accepts.
- ``resolution``: from the short side of ``width``/``height`` (the one given, if only
  one is), the nearest of 512P, 720P, 768P and 1080P; a tie goes to the larger.
  Neither given: no ``resolution`` is sent and MiniMax uses the model's default.
  ``extra["resolution"]`` wins over the mapping.
- ``first_frame_image``: the data URL as given (MiniMax accepts data URLs).
- every other ``extra`` key (``prompt_optimizer``, ``callback_url``, ...) passes through.

Answers: every body carries ``base_resp.status_code``; non-zero is an
``UpstreamError`` whose message is ``status_msg`` and whose ``provider_code`` is the
code. Retryable: the rate-limit and server codes in ``RETRYABLE_CODES``; not retryable:
``NON_RETRYABLE_CODES`` (auth, balance, sensitive content, invalid parameters); any
other code is retryable only when the HTTP status is 5xx. A non-2xx answer without a
readable ``base_resp`` follows ``UpstreamError.from_status`` (5xx/408/429 retryable).
A 429's ``Retry-After`` travels with the error either way, as for OpenAI-compatible
upstreams, so the client hears when to come back.
A 2xx body that is not JSON, or lacks what the step needs (``task_id``, ``status``,
``download_url``), is a retryable error: a broken answer, not a verdict. Transport
failures are retryable. Each call has an overall deadline of
``VIDEO_CALL_DEADLINE_SECONDS`` (60 s: these answers are small; a generation's length
is the poller's business, not one call's).

Status mapping: ``Preparing``/``Queueing`` -> queued, ``Processing`` -> running,
``Success`` -> succeeded (a ``file_id`` is required: a Success without one is a
non-retryable error, since polling again will not grow one), ``Fail`` -> failed with
the provider's ``error_message`` (or a ``status_msg`` other than "success", else a
generic message). An unknown status is taken as running, so a status MiniMax adds
later does not fail jobs; the poller's overall timeout bounds it.

Probe: ``GET {base}/v1/query/video_generation?task_id=arona-probe``, which creates
nothing. Healthy: any well-formed answer to an authenticated call, including a "task
not found" code and rate limiting. Unhealthy: transport errors, non-2xx statuses (a
wrong base URL answers 404), bodies without ``base_resp``, the auth codes, the server
codes, and 1008 insufficient balance: the upstream is reachable but cannot generate,
and marking it unhealthy sends video to the other MiniMax backends and shows the
reason on the dashboard instead of failing each job on submit.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

import aiohttp
import msgspec

from app.lib.http import Headers, UpstreamHttp, frozen_headers
from app.routing.backends.base import VideoBackend
from app.routing.backends.failures import HTTP_ERRORS, exchange_error
from app.routing.backends.openai import auth_headers
from app.routing.backends.transport import (
    JSON_HEADERS,
    probe_get,
    read_bounded,
    release_or_close,
)
from app.routing.errors import MAX_UPSTREAM_DETAIL_BYTES, UpstreamError, bounded_text
from app.routing.types import BackendSpec, ProbeResult, VideoPhase, VideoPoll, VideoTask
from app.routing.urls import openai_endpoint

KIND = "minimax-cloud"
VIDEO_CALL_DEADLINE_SECONDS = 60.0
MAX_ANSWER_BYTES = 1024 * 1024
"""A create, query or retrieve answer is a few hundred bytes; more is a broken upstream."""
PROBE_TASK_ID = "arona-probe"

SUPPORTED_DURATIONS = (6, 10)
RESOLUTIONS = ((512, "512P"), (720, "720P"), (768, "768P"), (1080, "1080P"))
RESERVED_EXTRA_KEYS = frozenset({"model", "prompt"})

RATE_LIMIT_CODES = frozenset({1002, 1039})
SERVER_CODES = frozenset({1000, 1001, 1013})
AUTH_CODES = frozenset({1004, 2049})
BALANCE_CODE = 1008
RETRYABLE_CODES = RATE_LIMIT_CODES | SERVER_CODES
NON_RETRYABLE_CODES = AUTH_CODES | frozenset({BALANCE_CODE, 1026, 1027, 2013})

PHASES: Mapping[str, VideoPhase] = {
    "Preparing": "queued",
    "Queueing": "queued",
    "Processing": "running",
    "Success": "succeeded",
    "Fail": "failed",
}
GENERIC_FAILURE = "video generation failed"


class _BaseResp(msgspec.Struct):
    status_code: int = 0
    status_msg: str = ""


class _File(msgspec.Struct):
    download_url: str | None = None


class _Answer(msgspec.Struct):
    """The fields of the three answers this adapter reads (others are ignored)."""

    base_resp: _BaseResp | None = None
    task_id: str | None = None
    status: str | None = None
    file_id: str | int | None = None
    error_message: str | None = None
    file: _File | None = None


def duration_of(seconds: float) -> int:
    """The supported duration nearest to ``seconds`` (a tie goes to the shorter)."""
    return min(SUPPORTED_DURATIONS, key=lambda d: (abs(d - seconds), d))


def resolution_of(width: int | None, height: int | None) -> str | None:
    """The supported resolution nearest to the short side (a tie goes to the larger);
    None when neither side is given."""
    sides = [side for side in (width, height) if side is not None]
    if not sides:
        return None
    short = min(sides)
    return min(RESOLUTIONS, key=lambda r: (abs(r[0] - short), -r[0]))[1]


def create_body(task: VideoTask) -> dict[str, Any]:
    """The ``POST /v1/video_generation`` body for ``task`` (see the module docstring)."""
    body: dict[str, Any] = {
        "model": task.model,
        "prompt": task.prompt,
        "duration": duration_of(task.duration_seconds),
    }
    resolution = resolution_of(task.width, task.height)
    if resolution is not None:
        body["resolution"] = resolution
    if task.first_frame_image:
        body["first_frame_image"] = task.first_frame_image
    for key, value in task.extra.items():
        if key not in RESERVED_EXTRA_KEYS:
            body[key] = value
    return body


def error_of(
    code: int, message: str, http_status: int, *, retry_after: str | None = None
) -> UpstreamError:
    """The ``UpstreamError`` for a non-zero ``base_resp.status_code``; ``retry_after`` is
    the answer's ``Retry-After`` header (forwarded on a 429, as for any upstream)."""
    if code in RETRYABLE_CODES:
        retryable = True
    elif code in NON_RETRYABLE_CODES:
        retryable = False
    else:
        retryable = http_status >= 500
    text = message.strip()[:MAX_UPSTREAM_DETAIL_BYTES] or f"MiniMax error {code}"
    return UpstreamError(
        text,
        status=http_status,
        retryable=retryable,
        provider_code=code,
        retry_after=retry_after,
    )


def malformed(status: int, what: str) -> UpstreamError:
    # A broken answer from a reachable upstream: asking again (or elsewhere) may do better.
    return UpstreamError(f"upstream {status}: {what}", status=status, retryable=True)


class MinimaxVideoBackend(VideoBackend):
    kind = KIND

    def __init__(
        self,
        spec: BackendSpec,
        http: UpstreamHttp,
        *,
        deadline: float = VIDEO_CALL_DEADLINE_SECONDS,
    ) -> None:
        super().__init__(spec)
        self._http = http
        self._deadline = deadline
        self._create_url = openai_endpoint(spec.url, "/video_generation")
        self._query_url = openai_endpoint(spec.url, "/query/video_generation")
        self._retrieve_url = openai_endpoint(spec.url, "/files/retrieve")
        auth = auth_headers("bearer", spec.api_key)
        self._headers: Headers = frozen_headers({**JSON_HEADERS, **auth})

    def query_url(self, task_id: str) -> str:
        return f"{self._query_url}?task_id={quote(task_id, safe='')}"

    def retrieve_url(self, file_id: str) -> str:
        return f"{self._retrieve_url}?file_id={quote(file_id, safe='')}"

    @property
    def create_url(self) -> str:
        return self._create_url

    async def probe(self) -> ProbeResult:
        outcome = await probe_get(self._http, self.query_url(PROBE_TASK_ID), self._headers)
        if isinstance(outcome, str):
            return ProbeResult(False, outcome)
        if not outcome.ok:
            return ProbeResult(False, f"status {outcome.status}")
        try:
            answer = msgspec.json.decode(outcome.body, type=_Answer)
        except (msgspec.DecodeError, msgspec.ValidationError):
            return ProbeResult(False, "not a MiniMax answer (invalid JSON)")
        if answer.base_resp is None:
            return ProbeResult(False, "not a MiniMax answer (no base_resp)")
        code = answer.base_resp.status_code
        message = answer.base_resp.status_msg.strip()[:200]
        if code in AUTH_CODES:
            return ProbeResult(False, f"authentication failed ({code}): {message}")
        if code == BALANCE_CODE:
            return ProbeResult(False, f"insufficient balance ({code}): {message}")
        if code in SERVER_CODES:
            return ProbeResult(False, f"server error ({code}): {message}")
        return ProbeResult(True, "ok")

    async def submit_video(self, task: VideoTask) -> str:
        data = msgspec.json.encode(create_body(task))
        status, answer = await self._call("POST", self._create_url, data)
        if not answer.task_id:
            raise malformed(status, "no task_id in the answer")
        return answer.task_id

    async def poll_video(self, task_id: str) -> VideoPoll:
        status, answer = await self._call("GET", self.query_url(task_id))
        provider_status = answer.status
        if not provider_status:
            raise malformed(status, "no status in the answer")
        phase = PHASES.get(provider_status, "running")
        if phase == "succeeded":
            file_id = str(answer.file_id) if answer.file_id not in (None, "") else None
            if file_id is None:
                raise UpstreamError(
                    f"task {task_id} reported Success without a file_id",
                    status=status,
                    retryable=False,
                )
            return VideoPoll(phase, provider_status, file_id=file_id)
        if phase == "failed":
            return VideoPoll(phase, provider_status, error=_failure_message(answer))
        return VideoPoll(phase, provider_status)

    async def video_url(self, file_id: str) -> str:
        status, answer = await self._call("GET", self.retrieve_url(file_id))
        url = answer.file.download_url if answer.file is not None else None
        if not url:
            raise malformed(status, "no file.download_url in the answer")
        return url

    async def _call(self, method: str, url: str, data: bytes | None = None) -> tuple[int, _Answer]:
        """One exchange within the deadline: the HTTP status and the decoded answer,
        whose ``base_resp`` reported success; raises ``UpstreamError`` otherwise."""
        scope = asyncio.timeout(self._deadline)
        try:
            async with scope:
                status, body, complete, retry_after = await self._exchange(method, url, data)
        except HTTP_ERRORS as exc:
            if scope.expired():
                message = f"the upstream did not complete its answer within {self._deadline:g}s"
                raise UpstreamError(message, status=None, retryable=True) from exc
            raise exchange_error(exc, self._http) from exc
        answer = _decode(body) if complete else None
        if not 200 <= status < 300:
            if answer is not None and answer.base_resp and answer.base_resp.status_code != 0:
                base = answer.base_resp
                raise error_of(base.status_code, base.status_msg, status, retry_after=retry_after)
            raise UpstreamError.from_status(status, bounded_text(body), retry_after=retry_after)
        if answer is None:
            raise malformed(status, "invalid JSON body" if complete else "answer too large")
        if answer.base_resp is None:
            raise malformed(status, "no base_resp in the answer")
        if answer.base_resp.status_code != 0:
            raise error_of(answer.base_resp.status_code, answer.base_resp.status_msg, status)
        return status, answer

    async def _exchange(
        self, method: str, url: str, data: bytes | None
    ) -> tuple[int, bytes, bool, str | None]:
        """Status, body (bounded), whether the body was read whole, and a 429's
        ``Retry-After`` header."""
        response: aiohttp.ClientResponse = await self._http.session.request(
            method, url, data=data, headers=self._headers, allow_redirects=False
        )
        retry_after = response.headers.get("Retry-After") if response.status == 429 else None
        try:
            limit = MAX_ANSWER_BYTES if 200 <= response.status < 300 else MAX_UPSTREAM_DETAIL_BYTES
            body = await read_bounded(response, limit)
        finally:
            release_or_close(response)
        return response.status, body, len(body) <= limit, retry_after


def _decode(body: bytes) -> _Answer | None:
    try:
        return msgspec.json.decode(body, type=_Answer)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None


def _failure_message(answer: _Answer) -> str:
    if answer.error_message and answer.error_message.strip():
        return answer.error_message.strip()[:MAX_UPSTREAM_DETAIL_BYTES]
    message = answer.base_resp.status_msg.strip() if answer.base_resp is not None else ""
    if message and message.lower() != "success":
        return message[:MAX_UPSTREAM_DETAIL_BYTES]
    return GENERIC_FAILURE
