"""Fixtures and helpers of the video job tests.

Apps run on real loopback ports (``live_server``) in the test's own event loop, next
to a real fake MiniMax server; both talk HTTP. Each test registers its own
``minimax-cloud`` backend for a model name of its own (the fake accepts any model),
so backends left over from earlier tests in the module's database never serve it.

``PollWatch`` wraps the fake's ASGI app (it is part of the server, not a patched
client): it counts the polls of each task in flight at once, and can hold polls so a
test can act while a poller step is mid-call.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections import defaultdict
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs

import httpx
import pytest
from sqlalchemy import select

from app.db.models import UsageRecord, VideoJob
from app.domain.video.views import parse_public_id
from app.fakes.asgi_io import Receive, Scope, Send
from app.fakes.minimax_upstream import FakeMinimax
from app.fakes.serve import serve_asgi
from app.lib.events.redis import RedisEventBus
from app.lib.redis_client import build_redis
from app.lib.settings import Settings
from tests.support.api import create_api_key, db_session, eventually
from tests.support.auth import fresh_database
from tests.support.helpers import bearer, new_project, new_user
from tests.support.routing import ADMIN, ADMIN_TOKEN, register_backend, wait_healthy
from tests.support.settings import with_settings

MINIMAX_KEY = "mm-key-" + "k" * 24
POLL_PATH = "/v1/query/video_generation"
FINAL = ("done", "failed", "cancelled")
# Fast polls keep the tests short; the lease is long enough that a healthy replica
# never loses it, short enough that a dead one's job moves on within a test.
VIDEO_TEST_SETTINGS: dict[str, Any] = {
    "admin_token": ADMIN_TOKEN,
    "video_poll_seconds": 0.05,
    "video_lease_seconds": 3.0,
}


@dataclass(slots=True)
class PollWatch:
    """An ASGI wrapper around the fake MiniMax that watches the polls of its tasks."""

    app: FakeMinimax
    in_flight: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    most_at_once: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    polls: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    holding: bool = False
    held: asyncio.Event = field(default_factory=asyncio.Event)
    _gate: asyncio.Event = field(default_factory=asyncio.Event)

    def hold(self) -> None:
        """Polls arriving from now on wait until ``release``."""
        self.holding = True
        self.held.clear()
        self._gate.clear()

    def release(self) -> None:
        self.holding = False
        self._gate.set()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        task_id = polled_task(scope)
        if task_id not in self.app.tasks:  # not a poll of a task (health probes are not)
            await self.app(scope, receive, send)
            return
        self.in_flight[task_id] += 1
        self.most_at_once[task_id] = max(self.most_at_once[task_id], self.in_flight[task_id])
        try:
            if self.holding:
                self.held.set()
                await self._gate.wait()
            await self.app(scope, receive, send)
        finally:
            self.in_flight[task_id] -= 1
            self.polls[task_id] += 1


@dataclass(slots=True)
class Minimax:
    fake: FakeMinimax
    watch: PollWatch
    url: str


@dataclass(slots=True)
class Tenant:
    owner: dict[str, str]
    """The project owner's user token."""
    project_id: str
    key: dict[str, str]
    """Headers with the project's API key."""
    key_id: str


@pytest.fixture(scope="module")
async def video_pg_settings(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Settings]:
    async with fresh_database("postgres", tmp_path_factory.mktemp("video-pg")) as settings:
        yield with_settings(settings, **VIDEO_TEST_SETTINGS)


@pytest.fixture(scope="module")
async def video_sqlite_settings(
    tmp_path_factory: pytest.TempPathFactory,
) -> AsyncIterator[Settings]:
    async with fresh_database("sqlite", tmp_path_factory.mktemp("video-sqlite")) as settings:
        yield with_settings(settings, **VIDEO_TEST_SETTINGS)


@pytest.fixture
async def minimax() -> AsyncIterator[Minimax]:
    """A fake MiniMax (any model, 2 Processing polls) on a loopback port."""
    fake = FakeMinimax("minimax", models=[], api_key=MINIMAX_KEY, processing_polls=2)
    watch = PollWatch(fake)
    async with serve_asgi(watch) as url:
        yield Minimax(fake, watch, url)
        watch.release()  # a held poll must not keep the server from stopping


def unique_model(tag: str = "video") -> str:
    return f"{tag}-{uuid.uuid4().hex[:10]}"


async def add_minimax_backend(client: httpx.AsyncClient, minimax: Minimax, model: str) -> str:
    name = f"mm-{uuid.uuid4().hex[:10]}"
    response = await register_backend(
        client,
        name=name,
        type="minimax-cloud",
        url=minimax.url,
        api_key=MINIMAX_KEY,
        models=[model],
    )
    assert response.status_code == 201, response.text
    await wait_healthy(client, name)
    return name


async def new_tenant(client: httpx.AsyncClient) -> Tenant:
    _, owner = await new_user(client, "video")  # type: ignore[arg-type]
    project = await new_project(client, owner)  # type: ignore[arg-type]
    key = await create_api_key(client, project["id"], owner)  # type: ignore[arg-type]
    return Tenant(owner, project["id"], bearer(key["key"]), key["id"])


async def create_job(
    client: httpx.AsyncClient, headers: dict[str, str], model: str, prompt: str, **fields: Any
) -> dict[str, Any]:
    response = await client.post(
        "/v1/video/generations", json={"model": model, "prompt": prompt, **fields}, headers=headers
    )
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


async def get_job(
    client: httpx.AsyncClient, headers: dict[str, str], job_id: str
) -> dict[str, Any]:
    response = await client.get(f"/v1/video/generations/{job_id}", headers=headers)
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


async def wait_status(
    client: httpx.AsyncClient,
    headers: dict[str, str],
    job_id: str,
    statuses: tuple[str, ...],
    within: float = 20.0,
) -> dict[str, Any]:
    """Poll the API until the job is in one of ``statuses``; returns its last body."""
    last: dict[str, Any] = {}

    async def reached() -> bool:
        last.update(await get_job(client, headers, job_id))
        return last["status"] in statuses

    await eventually(reached, within=within, interval=0.02)
    return last


@contextlib.asynccontextmanager
async def bus_of(settings: Settings) -> AsyncIterator[RedisEventBus]:
    """An event bus of its own on the apps' Redis (what another replica would see)."""
    assert settings.redis_url is not None
    redis = build_redis(settings.redis_url)
    bus = RedisEventBus(redis, prefix=f"{settings.redis_prefix}events:")
    try:
        yield bus
    finally:
        await bus.close()
        await redis.aclose()


async def job_row(settings: Settings, job_id: str) -> VideoJob:
    parsed = parse_public_id(job_id)
    assert parsed is not None
    async with db_session(settings) as session:
        return (await session.execute(select(VideoJob).where(VideoJob.id == parsed))).scalar_one()


async def usage_rows(settings: Settings, key_id: str, model: str) -> list[UsageRecord]:
    query = select(UsageRecord).where(
        UsageRecord.api_key_id == uuid.UUID(key_id), UsageRecord.model_requested == model
    )
    async with db_session(settings) as session:
        return list((await session.execute(query)).scalars())


__all__ = ["ADMIN", "video_pg_settings", "video_sqlite_settings"]


def polled_task(scope: Scope) -> str:
    """The task id a request to the fake MiniMax polls ("" when it is not a poll)."""
    if scope["type"] != "http" or scope["path"] != POLL_PATH:
        return ""
    query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
    return str(query.get("task_id", [""])[0])
