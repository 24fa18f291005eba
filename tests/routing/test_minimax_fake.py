"""The fake MiniMax server itself: HTTP control, stats, recording, validation, the CLI."""

from __future__ import annotations

import asyncio
import signal
import sys
from typing import Any

import httpx
import pytest

from app.fakes.__main__ import build_fake, parse_args
from app.fakes.minimax_scripts import script_of
from app.fakes.minimax_upstream import DEFAULT_MODELS, VIDEO_BYTES, FakeMinimax
from tests.support.upstreams import MINIMAX_KEY, ServedMinimax

KEY = MINIMAX_KEY
AUTH = {"Authorization": f"Bearer {KEY}"}
CREATE = {"model": "MiniMax-Hailuo-02", "prompt": "a heron", "duration": 6, "resolution": "768P"}


MINIMAX_PROCESSING_POLLS = 1
"""Read by the ``_minimax_server`` fixture (tests/routing/conftest.py)."""


async def create(web: httpx.AsyncClient, url: str, **fields: object) -> dict[str, Any]:
    response = await web.post(f"{url}/v1/video_generation", json={**CREATE, **fields}, headers=AUTH)
    assert response.status_code == 200
    body: dict[str, Any] = response.json()
    return body


def test_markers_parse_into_scripts() -> None:
    script = script_of("[fail:too dark] [slow:3] [poll-error:1002*2] [retrieve-http500]", 2)
    assert (script.fail_message, script.processing_polls, script.stuck) == ("too dark", 3, False)
    assert script.poll is not None
    assert (script.poll.kind, script.poll.code) == ("error", 1002)
    assert script.poll.times == 2
    assert script.retrieve is not None
    assert script.retrieve.kind == "http500"
    assert script.retrieve.times is None
    assert script.create is None
    plain = script_of("a [bracketed] prompt with [error:x]", 4)
    assert (plain.processing_polls, plain.fail_message, plain.create) == (4, None, None)


async def test_the_wire_format_of_a_whole_lifecycle(
    minimax: ServedMinimax, web: httpx.AsyncClient
) -> None:
    url = minimax.url
    created = await create(web, url)
    assert created["base_resp"] == {"status_code": 0, "status_msg": "success"}
    task_id = created["task_id"]
    seen = []
    for _ in range(4):
        answer = (
            await web.get(f"{url}/v1/query/video_generation?task_id={task_id}", headers=AUTH)
        ).json()
        seen.append((answer["status"], answer["file_id"]))
    file_id = minimax.fake.tasks[str(task_id)].file_id
    assert seen == [
        ("Preparing", ""),
        ("Queueing", ""),
        ("Processing", ""),
        ("Success", file_id),
    ]
    retrieved = (await web.get(f"{url}/v1/files/retrieve?file_id={file_id}", headers=AUTH)).json()
    assert retrieved["file"]["download_url"] == f"{url}/files/{file_id}.mp4"
    assert retrieved["file"]["bytes"] == len(VIDEO_BYTES)
    video = await web.get(retrieved["file"]["download_url"])  # a signed URL: no key
    assert (video.status_code, video.headers["content-type"]) == (200, "video/mp4")
    assert (await web.get(f"{url}/files/nope.mp4")).status_code == 404
    stats = minimax.fake.stats
    assert (stats.creates, stats.polls, stats.retrieves, stats.downloads) == (1, 4, 1, 1)
    assert minimax.fake.task_for("heron") is minimax.fake.tasks[str(task_id)]
    assert len(minimax.fake.requests_for("/v1/query/video_generation")) == 4


async def test_a_missing_key_is_answered_like_minimax(
    minimax: ServedMinimax, web: httpx.AsyncClient
) -> None:
    response = await web.post(f"{minimax.url}/v1/video_generation", json=CREATE)
    assert response.status_code == 200
    assert response.json()["base_resp"]["status_code"] == 1004
    assert minimax.fake.stats.unauthorized == 1
    assert minimax.fake.stats.creates == 0


@pytest.mark.parametrize(
    ("fields", "problem"),
    [
        ({"model": "other-model"}, "model 'other-model' is not supported"),
        ({"prompt": "  "}, "prompt is required"),
        ({"duration": 5}, "duration 5 is not supported"),
        ({"resolution": "4K"}, "resolution '4K' is not supported"),
        ({"first_frame_image": "iVBORw0KGgo="}, "first_frame_image must be a URL or a data URL"),
    ],
)
async def test_creates_are_validated(
    minimax: ServedMinimax, web: httpx.AsyncClient, fields: dict[str, object], problem: str
) -> None:
    body = await create(web, minimax.url, **fields)
    assert body["base_resp"] == {"status_code": 2013, "status_msg": f"invalid params, {problem}"}
    assert minimax.fake.tasks == {}


async def test_control_endpoint_steers_the_minimax_fake(
    minimax: ServedMinimax, web: httpx.AsyncClient
) -> None:
    url = minimax.url
    changed = await web.post(
        f"{url}/__fake/control", json={"create_error": 1008, "next_markers": ["[stuck]"]}
    )
    assert changed.status_code == 200
    assert changed.json()["control"]["create_error"] == 1008
    refused = await create(web, url)
    assert refused["base_resp"]["status_code"] == 1008
    await web.post(f"{url}/__fake/control", json={"create_error": None})
    stuck = await create(web, url)
    assert minimax.fake.tasks[str(stuck["task_id"])].script.stuck is True
    bad = await web.post(f"{url}/__fake/control", json={"create_error": "x"})
    assert bad.status_code == 400
    reset = await web.post(f"{url}/__fake/control", json={"reset": True, "processing_polls": 7})
    snapshot = reset.json()
    assert snapshot["control"]["processing_polls"] == 7
    assert snapshot["control"]["create_error"] is None
    assert snapshot["stats"]["creates"] == 0
    assert snapshot["tasks"] == {}
    # A reset restores the constructor's switches, not the last patch.
    minimax.fake.reset()
    assert minimax.fake.control.processing_polls == 1
    assert minimax.fake.control.next_markers == []


def test_the_cli_builds_a_minimax_fake() -> None:
    fake = build_fake(parse_args(["--kind", "minimax", "--api-key", "k", "--polls", "3"]))
    assert isinstance(fake, FakeMinimax)
    assert (fake.name, fake.api_key, fake.control.processing_polls) == ("fake-minimax", "k", 3)
    assert fake.control.models == list(DEFAULT_MODELS)
    named = build_fake(parse_args(["--kind", "minimax", "--name", "n", "--models", "a, b"]))
    assert isinstance(named, FakeMinimax)
    assert (named.name, named.control.models, named.api_key) == ("n", ["a", "b"], None)


async def test_python_m_app_fakes_runs_a_minimax_fake(web: httpx.AsyncClient) -> None:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "app.fakes",
        "--kind",
        "minimax",
        "--port",
        "0",
        "--api-key",
        KEY,
        stdout=asyncio.subprocess.PIPE,
    )
    try:
        assert process.stdout is not None
        async with asyncio.timeout(30):
            line = (await process.stdout.readline()).decode()
        url = line.strip().rsplit(" ", 1)[-1]
        assert url.startswith("http://127.0.0.1:")
        created = await create(web, url)
        assert created["base_resp"] == {"status_code": 0, "status_msg": "success"}
        stats = (await web.get(f"{url}/__fake/stats")).json()
        assert stats["stats"]["creates"] == 1
    finally:
        if process.returncode is None:
            process.send_signal(signal.SIGTERM)
        async with asyncio.timeout(15):
            code = await process.wait()
    assert code == 0
