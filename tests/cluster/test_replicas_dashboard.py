"""A dashboard stream served by replica C shows a health change that replica A's
prober detected.

Only A probes on a short interval here; B and C probe a backend once when they load it
and then not again for ten minutes. So once the backend fails, the "unhealthy" that
C's stream sends can only have come from A's probe, over the event bus.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import httpx
import pytest

from app.cli.bootstrap import create_admin
from app.db.config import build_db_config
from app.fakes.openai_upstream import FakeOpenAI
from app.fakes.serve import serve_asgi
from app.lib.passwords import PasswordHasher
from tests.support.cluster import (
    ADMIN,
    Cluster,
    backend_status,
    register_backend,
    unique,
    wait_healthy_everywhere,
)
from tests.support.helpers import PASSWORD, console_login, unique_email
from tests.support.settings import base_settings

pytestmark = pytest.mark.cluster

REPLICA_ENV = [
    {"ARONA_HEALTH_INTERVAL_SECONDS": "0.3"},
    {"ARONA_HEALTH_INTERVAL_SECONDS": "600"},
    {"ARONA_HEALTH_INTERVAL_SECONDS": "600"},
]


class Frames:
    """SSE frames off a streamed response: (event name, data)."""

    def __init__(self, response: httpx.Response) -> None:
        self._chunks = response.aiter_text()
        self._buffer = ""

    async def next(self) -> tuple[str | None, str]:
        while "\n\n" not in self._buffer:
            self._buffer += await anext(self._chunks)
        block, self._buffer = self._buffer.split("\n\n", 1)
        name, data = None, []
        for line in block.split("\n"):
            if line.startswith("event: "):
                name = line[7:]
            elif line.startswith("data: "):
                data.append(line[6:])
        return name, "\n".join(data)

    async def until(self, name: str, containing: str = "", within: float = 5.0) -> str:
        async with asyncio.timeout(within):
            while True:
                got, data = await self.next()
                if got == name and containing in data:
                    return data


@pytest.fixture
async def admin_session(
    cluster: Cluster, fast_hasher: PasswordHasher
) -> AsyncIterator[httpx.AsyncClient]:
    """A console session on replica C, as a browser holds it."""
    email = unique_email("cluster-admin")
    db_config = build_db_config(base_settings(database_url=cluster.database_url))
    try:
        await create_admin(db_config, fast_hasher, email=email, password=PASSWORD)
    finally:
        await db_config.get_engine().dispose()
    async with httpx.AsyncClient(base_url=cluster.replicas[2].url, timeout=30) as http:
        response = await console_login(http, email)
        assert response.status_code == 303, response.text
        http.cookies.set("arona_session", response.cookies["arona_session"])
        yield http


async def test_cs_backends_stream_shows_a_failure_detected_by_a(
    cluster: Cluster, admin_session: httpx.AsyncClient
) -> None:
    fake = FakeOpenAI(unique("watched"), models=[unique("model")])
    async with serve_asgi(fake) as url:
        name = unique("backend")
        await register_backend(cluster.a, name, url)
        await wait_healthy_everywhere(cluster, name)

        async with admin_session.stream("GET", "/admin/stream/backends") as response:
            assert response.status_code == 200
            assert response.headers["content-type"].startswith("text/event-stream")
            frames = Frames(response)
            table = await frames.until("backends")
            assert f'sse-swap="backend-{name}-health"' in table

            fake.control.fail_status = 503
            cell = await frames.until(
                f"backend-{name}-health", containing=">unhealthy<", within=5.0
            )
            assert "health-badge" in cell

        # A's prober is what saw it: A itself says unhealthy, and the fake answered a
        # probe with its failure (only A probes on a timer; nothing else calls it).
        assert await backend_status(cluster.a, name) == "unhealthy"
        assert fake.stats.failures > 0
        assert fake.stats.chats == fake.stats.streams == 0
        fake.control.fail_status = None
        await cluster.a.delete(f"/api/admin/backends/{name}", headers=ADMIN)
