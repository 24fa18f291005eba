"""The MiniMax video adapter's failure paths against real servers: ``base_resp`` codes
at each step with their retryable verdicts, HTTP errors, broken bodies, transport
failures and deadlines."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from app.fakes.serve import serve_asgi
from app.lib.http import UpstreamHttp
from app.routing.backends.minimax import MAX_ANSWER_BYTES, MinimaxVideoBackend
from app.routing.errors import UpstreamError
from app.routing.types import BackendSpec, VideoTask
from tests.support.upstreams import MINIMAX_KEY, ScriptedUpstream, ServedMinimax

KEY = MINIMAX_KEY
MODEL = "MiniMax-Hailuo-02"

Build = Callable[..., MinimaxVideoBackend]


MINIMAX_PROCESSING_POLLS = 0
"""Read by the ``_minimax_server`` fixture (tests/routing/conftest.py)."""


@pytest.fixture
def build(http: UpstreamHttp, minimax: ServedMinimax) -> Build:
    def make(
        url: str | None = None, *, api_key: str | None = KEY, client: UpstreamHttp | None = None
    ) -> MinimaxVideoBackend:
        spec = BackendSpec(
            "mm", "minimax-cloud", url or minimax.url, api_key=api_key, models=(MODEL,)
        )
        return MinimaxVideoBackend(spec, client or http)

    return make


def task(prompt: str = "a fox in snow") -> VideoTask:
    return VideoTask(model=MODEL, prompt=prompt, duration_seconds=6, width=1280, height=720)


async def failure(call: Awaitable[Any]) -> UpstreamError:
    with pytest.raises(UpstreamError) as caught:
        await call
    return caught.value


async def finished_file(backend: MinimaxVideoBackend, prompt: str) -> str:
    task_id = await backend.submit_video(task(prompt))
    for _ in range(5):
        poll = await backend.poll_video(task_id)
        if poll.file_id is not None:
            return poll.file_id
    raise AssertionError("the task did not succeed")


CODES = [
    (1002, True),  # rate limit
    (1039, True),  # token rate limit
    (1000, True),  # unknown server error
    (1013, True),  # internal server error
    (1004, False),  # authentication
    (2049, False),  # invalid API key
    (1008, False),  # insufficient balance
    (1026, False),  # sensitive input
    (1027, False),  # sensitive output
    (2013, False),  # invalid parameters
    (4242, False),  # unknown, answered with HTTP 200
]


# ------------------------------------------------------------------- base_resp codes


@pytest.mark.parametrize(("code", "retryable"), CODES)
async def test_create_error_codes(
    build: Build, minimax: ServedMinimax, code: int, retryable: bool
) -> None:
    error = await failure(build().submit_video(task(f"[error:{code}] a fox")))
    assert (error.provider_code, error.retryable) == (code, retryable)
    assert error.message == f"fake error {code}"
    assert error.upstream_status == 200
    assert error.status_code == 502
    assert minimax.fake.tasks == {}


@pytest.mark.parametrize(("code", "retryable"), CODES)
async def test_poll_error_codes(build: Build, code: int, retryable: bool) -> None:
    backend = build()
    task_id = await backend.submit_video(task(f"[poll-error:{code}] a fox"))
    error = await failure(backend.poll_video(task_id))
    assert (error.provider_code, error.retryable, error.message) == (
        code,
        retryable,
        f"fake error {code}",
    )


@pytest.mark.parametrize(("code", "retryable"), CODES)
async def test_retrieve_error_codes(build: Build, code: int, retryable: bool) -> None:
    backend = build()
    file_id = await finished_file(backend, f"[retrieve-error:{code}] a fox")
    error = await failure(backend.video_url(file_id))
    assert (error.provider_code, error.retryable) == (code, retryable)


async def test_a_wrong_key_is_a_non_retryable_auth_error(
    build: Build, minimax: ServedMinimax
) -> None:
    error = await failure(build(api_key="nope").submit_video(task()))
    assert (error.provider_code, error.retryable) == (1004, False)
    assert error.message.startswith("login fail")
    assert minimax.fake.stats.unauthorized == 1


async def test_an_unknown_task_is_a_non_retryable_invalid_params_error(build: Build) -> None:
    error = await failure(build().poll_video("no-such-task"))
    assert (error.provider_code, error.retryable) == (2013, False)
    assert error.message == "invalid params, task not found"


async def test_an_unknown_file_is_a_non_retryable_error(build: Build) -> None:
    error = await failure(build().video_url("no-such-file"))
    assert (error.provider_code, error.retryable) == (2013, False)


async def test_a_request_the_provider_refuses_is_not_retried(build: Build) -> None:
    bad = VideoTask(
        model=MODEL, prompt="p", duration_seconds=6, width=None, height=None, extra={"duration": 7}
    )
    error = await failure(build().submit_video(bad))
    assert (error.provider_code, error.retryable) == (2013, False)
    assert error.message == "invalid params, duration 7 is not supported"


async def test_a_poll_fault_limited_to_one_attempt_then_the_task_goes_on(build: Build) -> None:
    backend = build()
    task_id = await backend.submit_video(task("[poll-error:1002*1] a fox"))
    error = await failure(backend.poll_video(task_id))
    assert (error.provider_code, error.retryable) == (1002, True)
    statuses = [(await backend.poll_video(task_id)).provider_status for _ in range(3)]
    assert statuses == ["Preparing", "Queueing", "Success"]


# ------------------------------------------------------------------- HTTP statuses


@pytest.mark.parametrize(
    ("status", "code", "retryable"),
    [
        (500, None, True),
        (503, None, True),
        (429, None, True),
        (408, None, True),
        (401, None, False),
        (400, None, False),
        (502, 4242, True),  # an unknown code is retryable on a 5xx...
        (400, 4242, False),  # ...and not otherwise
        (503, 1026, False),  # a known code keeps its verdict whatever the status
        (400, 1002, True),
    ],
)
async def test_http_errors(
    build: Build, minimax: ServedMinimax, status: int, code: int | None, retryable: bool
) -> None:
    minimax.fake.control.fail_status = status
    minimax.fake.control.fail_code = code
    backend = build()
    for call in (backend.submit_video(task()), backend.poll_video("t"), backend.video_url("f")):
        error = await failure(call)
        assert (error.upstream_status, error.provider_code, error.retryable) == (
            status,
            code,
            retryable,
        )
        if code is None:
            assert error.message.startswith(f"upstream {status}: ")
        else:
            assert error.message == "fake failure"


@pytest.mark.parametrize("code", [None, 1002])
async def test_a_429s_retry_after_travels_with_the_error(
    build: Build, minimax: ServedMinimax, code: int | None
) -> None:
    """As from an OpenAI-compatible upstream, with or without a ``base_resp`` code."""
    control = minimax.fake.control
    control.fail_status, control.fail_code, control.retry_after = 429, code, "19"
    backend = build()
    for call in (backend.submit_video(task()), backend.poll_video("t"), backend.video_url("f")):
        error = await failure(call)
        assert (error.upstream_status, error.provider_code, error.retryable) == (429, code, True)
        assert error.headers == {"Retry-After": "19"}


@pytest.mark.parametrize("prefix", ["", "poll-", "retrieve-"])
async def test_a_500_at_each_step_is_retryable(build: Build, prefix: str) -> None:
    backend = build()
    marker = f"[{prefix}http500]"
    if prefix == "":
        error = await failure(backend.submit_video(task(f"{marker} a fox")))
    elif prefix == "poll-":
        error = await failure(backend.poll_video(await backend.submit_video(task(marker))))
    else:
        error = await failure(backend.video_url(await finished_file(backend, marker)))
    assert (error.upstream_status, error.retryable, error.provider_code) == (500, True, None)


@pytest.mark.parametrize("prefix", ["", "poll-", "retrieve-"])
async def test_malformed_json_at_each_step_is_retryable(build: Build, prefix: str) -> None:
    backend = build()
    marker = f"[{prefix}malformed]"
    if prefix == "":
        error = await failure(backend.submit_video(task(f"{marker} a fox")))
    elif prefix == "poll-":
        error = await failure(backend.poll_video(await backend.submit_video(task(marker))))
    else:
        error = await failure(backend.video_url(await finished_file(backend, marker)))
    assert error.message == "upstream 200: invalid JSON body"
    assert (error.retryable, error.provider_code) == (True, None)


async def test_success_without_a_file_id_is_a_non_retryable_error(build: Build) -> None:
    backend = build()
    task_id = await backend.submit_video(task("[nofile] a fox"))
    assert (await backend.poll_video(task_id)).phase == "queued"
    assert (await backend.poll_video(task_id)).phase == "queued"
    error = await failure(backend.poll_video(task_id))
    assert error.retryable is False
    assert error.message == f"task {task_id} reported Success without a file_id"


# --------------------------------------------------------- answers of the wrong shape


@pytest.mark.parametrize(
    ("answer", "step", "message"),
    [
        (b'{"task_id":"t"}', "submit", "upstream 200: no base_resp in the answer"),
        (b'{"base_resp":{"status_code":0}}', "submit", "upstream 200: no task_id in the answer"),
        (b'{"base_resp":{"status_code":0}}', "poll", "upstream 200: no status in the answer"),
        (
            b'{"file":{},"base_resp":{"status_code":0}}',
            "url",
            "upstream 200: no file.download_url in the answer",
        ),
        (b'["a list"]', "submit", "upstream 200: invalid JSON body"),
        (b'{"base_resp":{"status_code":"zero"}}', "poll", "upstream 200: invalid JSON body"),
    ],
)
async def test_answers_missing_what_the_step_needs_are_retryable(
    http: UpstreamHttp, answer: bytes, step: str, message: str
) -> None:
    upstream = ScriptedUpstream([answer], content_type=b"application/json", pause=0)
    async with serve_asgi(upstream) as url:
        backend = MinimaxVideoBackend(BackendSpec("v", "minimax-cloud", url, api_key=KEY), http)
        call: Awaitable[Any]
        if step == "submit":
            call = backend.submit_video(task())
        elif step == "poll":
            call = backend.poll_video("t")
        else:
            call = backend.video_url("f")
        error = await failure(call)
    assert (error.message, error.retryable) == (message, True)


async def test_an_oversized_answer_is_a_retryable_error(http: UpstreamHttp) -> None:
    pieces = [b'{"base_resp":{"status_code":0},"pad":"', b"x" * MAX_ANSWER_BYTES, b'"}']
    upstream = ScriptedUpstream(pieces, content_type=b"application/json", pause=0)
    async with serve_asgi(upstream) as url:
        backend = MinimaxVideoBackend(BackendSpec("v", "minimax-cloud", url, api_key=KEY), http)
        error = await failure(backend.poll_video("t"))
    assert (error.message, error.retryable) == ("upstream 200: answer too large", True)


# ---------------------------------------------------------------- transport, deadline


async def test_an_unreachable_upstream_is_retryable(build: Build, refused_url: str) -> None:
    backend = build(refused_url)
    for call in (backend.submit_video(task()), backend.poll_video("t"), backend.video_url("f")):
        error = await failure(call)
        assert error.message == "could not connect to the upstream: connection refused"
        assert (error.retryable, error.upstream_status, error.provider_code) == (True, None, None)


async def test_a_hung_upstream_hits_the_call_deadline(
    http: UpstreamHttp, minimax: ServedMinimax
) -> None:
    minimax.fake.control.hang = True
    spec = BackendSpec("mm", "minimax-cloud", minimax.url, api_key=KEY, models=(MODEL,))
    backend = MinimaxVideoBackend(spec, http, deadline=0.2)
    error = await failure(backend.submit_video(task()))
    assert error.message == "the upstream did not complete its answer within 0.2s"
    assert error.retryable is True
    minimax.fake.release()
