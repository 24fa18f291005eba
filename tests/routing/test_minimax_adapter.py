"""The MiniMax video adapter against the fake MiniMax server: probe, request mapping,
URLs and the task lifecycle. Failure paths are in ``test_minimax_errors.py``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import pytest

from app.fakes.minimax_upstream import VIDEO_BYTES
from app.fakes.serve import serve_asgi
from app.lib.http import UpstreamHttp
from app.routing.backends.factory import build_backend
from app.routing.backends.minimax import (
    PROBE_TASK_ID,
    MinimaxVideoBackend,
    create_body,
    duration_of,
    resolution_of,
)
from app.routing.types import BackendSpec, VideoPoll, VideoTask
from tests.support.upstreams import MINIMAX_KEY, ScriptedUpstream, ServedMinimax

KEY = MINIMAX_KEY
MODEL = "MiniMax-Hailuo-02"
PNG_DATA_URL = "data:image/png;base64,iVBORw0KGgo="

Build = Callable[..., MinimaxVideoBackend]


@pytest.fixture
def build(http: UpstreamHttp, minimax: ServedMinimax) -> Build:
    def make(url: str | None = None, *, api_key: str | None = KEY) -> MinimaxVideoBackend:
        spec = BackendSpec(
            "mm", "minimax-cloud", url or minimax.url, api_key=api_key, models=(MODEL,)
        )
        return MinimaxVideoBackend(spec, http)

    return make


def task(prompt: str = "a cat surfing", **fields: Any) -> VideoTask:
    values: dict[str, Any] = {"duration_seconds": 6.0, "width": 1280, "height": 720}
    values.update(fields)
    return VideoTask(model=MODEL, prompt=prompt, **values)


async def run_to_end(
    backend: MinimaxVideoBackend, task_id: str, limit: int = 20
) -> list[VideoPoll]:
    polls: list[VideoPoll] = []
    for _ in range(limit):
        poll = await backend.poll_video(task_id)
        polls.append(poll)
        if poll.phase in ("succeeded", "failed"):
            return polls
    raise AssertionError(f"task {task_id} did not finish: {polls[-1]}")


# ------------------------------------------------------------------------ kind, URLs


async def test_the_factory_builds_a_video_only_backend(http: UpstreamHttp) -> None:
    spec = BackendSpec("v", " MiniMax-Cloud ", "https://api.minimax.io", api_key="k")
    adapter = build_backend(spec, http)
    assert isinstance(adapter, MinimaxVideoBackend)
    assert adapter.kind == "minimax-cloud"
    assert adapter.capabilities == frozenset({"video"})
    with pytest.raises(NotImplementedError):
        await adapter.chat(None)  # type: ignore[arg-type]
    with pytest.raises(NotImplementedError):
        await adapter.embed(None)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("base", "prefix"),
    [
        ("https://api.minimax.io", "https://api.minimax.io/v1"),
        ("https://api.minimax.io/", "https://api.minimax.io/v1"),
        ("https://api.minimax.io/v1", "https://api.minimax.io/v1"),
        ("https://gw.example.com/minimax/v1/", "https://gw.example.com/minimax/v1"),
    ],
)
def test_urls_follow_root_and_path_style_bases(http: UpstreamHttp, base: str, prefix: str) -> None:
    adapter = MinimaxVideoBackend(BackendSpec("v", "minimax-cloud", base, api_key="k"), http)
    assert adapter.create_url == f"{prefix}/video_generation"
    assert adapter.query_url("t 1&x") == f"{prefix}/query/video_generation?task_id=t%201%26x"
    assert adapter.retrieve_url("f/2") == f"{prefix}/files/retrieve?file_id=f%2F2"


async def test_a_path_style_base_reaches_the_same_endpoints(
    build: Build, minimax: ServedMinimax
) -> None:
    backend = build(f"{minimax.url}/v1/")
    task_id = await backend.submit_video(task())
    assert (await backend.poll_video(task_id)).provider_status == "Preparing"
    assert [r.path.split("?")[0] for r in minimax.fake.requests] == [
        "/v1/video_generation",
        "/v1/query/video_generation",
    ]


# ---------------------------------------------------------------------------- probe


async def test_probe_is_an_authenticated_query_that_creates_nothing(
    build: Build, minimax: ServedMinimax
) -> None:
    result = await build().probe()
    assert (result.healthy, result.reason, result.models) == (True, "ok", ())
    [request] = minimax.fake.requests
    assert request.path == f"/v1/query/video_generation?task_id={PROBE_TASK_ID}"
    assert request.headers["authorization"] == f"Bearer {KEY}"
    assert minimax.fake.stats.creates == 0
    assert minimax.fake.tasks == {}


@pytest.mark.parametrize("api_key", ["wrong-key", None])
async def test_probe_with_a_bad_or_missing_key_is_unhealthy(
    build: Build, minimax: ServedMinimax, api_key: str | None
) -> None:
    result = await build(api_key=api_key).probe()
    assert not result.healthy
    assert result.reason.startswith("authentication failed (1004): login fail")
    assert minimax.fake.stats.unauthorized == 1


async def test_probe_of_a_server_that_is_down(http: UpstreamHttp, refused_url: str) -> None:
    spec = BackendSpec("v", "minimax-cloud", refused_url, api_key=KEY, models=(MODEL,))
    result = await MinimaxVideoBackend(spec, http).probe()
    assert (result.healthy, result.reason) == (False, "connection refused")


@pytest.mark.parametrize(
    ("code", "healthy", "reason"),
    [
        (2013, True, "ok"),  # task not found: an authenticated, well-formed answer
        (1002, True, "ok"),  # rate limited now; the breaker handles calls
        (1008, False, "insufficient balance (1008): fake error 1008"),
        (2049, False, "authentication failed (2049): fake error 2049"),
        (1013, False, "server error (1013): fake error 1013"),
    ],
)
async def test_probe_verdict_by_provider_code(
    build: Build, minimax: ServedMinimax, code: int, healthy: bool, reason: str
) -> None:
    minimax.fake.control.poll_error = code
    result = await build().probe()
    assert (result.healthy, result.reason) == (healthy, reason)


@pytest.mark.parametrize(
    ("switch", "reason"),
    [
        ({"fail_status": 500}, "status 500"),
        ({"fail_status": 401}, "status 401"),
        ({"malformed": True}, "not a MiniMax answer (invalid JSON)"),
    ],
)
async def test_probe_of_a_broken_upstream_is_unhealthy(
    build: Build, minimax: ServedMinimax, switch: dict[str, Any], reason: str
) -> None:
    for name, value in switch.items():
        setattr(minimax.fake.control, name, value)
    result = await build().probe()
    assert (result.healthy, result.reason) == (False, reason)


async def test_probe_of_a_wrong_base_url_is_unhealthy(build: Build, minimax: ServedMinimax) -> None:
    result = await build(f"{minimax.url}/not-minimax").probe()
    assert (result.healthy, result.reason) == (False, "status 404")


# ---------------------------------------------------------------------- body mapping


@pytest.mark.parametrize(
    ("seconds", "expected"),
    [(0.5, 6), (1, 6), (5, 6), (6, 6), (7.9, 6), (8, 6), (8.01, 10), (10, 10), (60, 10)],
)
def test_duration_snaps_to_what_minimax_accepts(seconds: float, expected: int) -> None:
    assert duration_of(seconds) == expected


@pytest.mark.parametrize(
    ("width", "height", "expected"),
    [
        (1280, 720, "720P"),
        (720, 1280, "720P"),
        (1920, 1080, "1080P"),
        (4096, 2160, "1080P"),
        (512, 512, "512P"),
        (640, 480, "512P"),
        (64, 64, "512P"),
        (1344, 768, "768P"),
        (744, 1000, "768P"),  # halfway between 720 and 768: the larger
        (616, 800, "720P"),  # halfway between 512 and 720: the larger
        (None, 1000, "1080P"),
        (700, None, "720P"),
        (None, None, None),
    ],
)
def test_resolution_is_the_nearest_to_the_short_side(
    width: int | None, height: int | None, expected: str | None
) -> None:
    assert resolution_of(width, height) == expected


def test_create_body_maps_every_field() -> None:
    body = create_body(
        task(
            duration_seconds=9.0,
            width=1920,
            height=1080,
            negative_prompt="blurry",
            first_frame_image=PNG_DATA_URL,
            extra={"prompt_optimizer": False, "callback_url": "https://hooks.example/v"},
        )
    )
    assert body == {
        "model": MODEL,
        "prompt": "a cat surfing",
        "duration": 10,
        "resolution": "1080P",
        "first_frame_image": PNG_DATA_URL,
        "prompt_optimizer": False,
        "callback_url": "https://hooks.example/v",
    }


def test_negative_prompt_is_sent_only_through_extra() -> None:
    assert "negative_prompt" not in create_body(task(negative_prompt="blurry"))
    body = create_body(task(negative_prompt="blurry", extra={"negative_prompt": "no text"}))
    assert body["negative_prompt"] == "no text"


def test_extra_overrides_duration_and_resolution_but_never_model_or_prompt() -> None:
    body = create_body(
        task(extra={"duration": 8, "resolution": "768P", "model": "other", "prompt": "x"})
    )
    assert (body["duration"], body["resolution"]) == (8, "768P")
    assert (body["model"], body["prompt"]) == (MODEL, "a cat surfing")


def test_no_size_means_no_resolution_and_no_image_means_no_first_frame() -> None:
    body = create_body(task(width=None, height=None))
    assert body == {"model": MODEL, "prompt": "a cat surfing", "duration": 6}


async def test_submit_sends_the_mapped_body_with_the_key(
    build: Build, minimax: ServedMinimax
) -> None:
    video = task(
        duration_seconds=5.0,
        width=720,
        height=1280,
        first_frame_image=PNG_DATA_URL,
        extra={"prompt_optimizer": True},
    )
    task_id = await build().submit_video(video)
    assert task_id in minimax.fake.tasks
    [request] = minimax.fake.requests_for("/v1/video_generation")
    assert request.headers["authorization"] == f"Bearer {KEY}"
    assert request.headers["content-type"] == "application/json"
    assert request.body == {
        "model": MODEL,
        "prompt": "a cat surfing",
        "duration": 6,
        "resolution": "720P",
        "first_frame_image": PNG_DATA_URL,
        "prompt_optimizer": True,
    }


# ------------------------------------------------------------------------- lifecycle


async def test_a_task_runs_queued_running_succeeded_and_its_file_downloads(
    build: Build, minimax: ServedMinimax, web: httpx.AsyncClient
) -> None:
    backend = build()
    task_id = await backend.submit_video(task())
    polls = await run_to_end(backend, task_id)
    assert [(p.phase, p.provider_status) for p in polls] == [
        ("queued", "Preparing"),
        ("queued", "Queueing"),
        ("running", "Processing"),
        ("running", "Processing"),
        ("succeeded", "Success"),
    ]
    fake_task = minimax.fake.tasks[task_id]
    assert polls[-1].file_id == fake_task.file_id
    assert polls[-1].error is None
    assert fake_task.polls == 5
    url = await backend.video_url(fake_task.file_id)
    assert url == f"{minimax.url}/files/{fake_task.file_id}.mp4"
    download = await web.get(url)
    assert download.status_code == 200
    assert download.content == VIDEO_BYTES
    assert minimax.fake.stats.downloads == 1


async def test_processing_length_follows_the_slow_marker(build: Build) -> None:
    backend = build()
    quick = await run_to_end(backend, await backend.submit_video(task("quick [slow:0]")))
    assert [p.provider_status for p in quick] == ["Preparing", "Queueing", "Success"]
    slow = await run_to_end(backend, await backend.submit_video(task("slow [slow:4]")))
    assert [p.provider_status for p in slow].count("Processing") == 4


async def test_a_failed_task_carries_the_providers_message(build: Build) -> None:
    backend = build()
    polls = await run_to_end(backend, await backend.submit_video(task("x [fail:scene too dark]")))
    last = polls[-1]
    assert (last.phase, last.provider_status, last.error) == ("failed", "Fail", "scene too dark")
    assert last.file_id is None
    plain = await run_to_end(backend, await backend.submit_video(task("y [fail]")))
    assert plain[-1].error == "fake generation failed"


async def test_a_stuck_task_keeps_running(build: Build, minimax: ServedMinimax) -> None:
    backend = build()
    task_id = await backend.submit_video(task("[stuck] forever"))
    phases = [(await backend.poll_video(task_id)).phase for _ in range(12)]
    assert phases[:2] == ["queued", "queued"]
    assert set(phases[2:]) == {"running"}
    assert minimax.fake.tasks[task_id].polls == 12


async def test_markers_can_be_queued_for_the_next_task(
    build: Build, minimax: ServedMinimax
) -> None:
    minimax.fake.control.next_markers = ["[fail:queued failure]"]
    backend = build()
    first = await run_to_end(backend, await backend.submit_video(task("plain prompt")))
    second = await run_to_end(backend, await backend.submit_video(task("plain prompt")))
    assert first[-1].error == "queued failure"
    assert second[-1].phase == "succeeded"


async def test_an_unknown_status_is_taken_as_running(http: UpstreamHttp) -> None:
    answer = b'{"task_id":"t","status":"Rendering","file_id":"","base_resp":{"status_code":0}}'
    upstream = ScriptedUpstream([answer], content_type=b"application/json", pause=0)
    async with serve_asgi(upstream) as url:
        spec = BackendSpec("v", "minimax-cloud", url, api_key=KEY, models=(MODEL,))
        poll = await MinimaxVideoBackend(spec, http).poll_video("t")
    assert (poll.phase, poll.provider_status) == ("running", "Rendering")
