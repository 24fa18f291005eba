"""What a server answers while its database is down, and how long it may wait.

An app served for real (uvicorn in the test's loop) on a PostgreSQL server of this
module's own, which the test stops (``immediate``: a crash as clients see it):

- writes that need the database (admin and project API, registration) are a 503
  ``database_unavailable`` in the error shape with ``Retry-After``, never a 500;
  console pages show a readable error page, HTMX requests get a toast;
- ``/readyz`` says ``degraded`` (with the check that failed): 503 plainly, 200 with
  ``allow_degraded=true`` (the load balancer's view);
- once the server is back the same writes succeed (the pool recovers by itself).

And the waits are bounded: a database that accepts connections but never answers
fails a connect after ``ARONA_DB_CONNECT_TIMEOUT_SECONDS`` (a ratio of two settings
measured in the same run, no wall-clock bound), and a pool with no free connection
gives up after ``ARONA_DB_POOL_TIMEOUT_SECONDS``; both count as an outage (503).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from collections.abc import AsyncIterator

import httpx
import pytest
from sqlalchemy import exc as sa_exc
from sqlalchemy import text

from app.db.config import build_db_config
from app.db.outage import is_database_outage
from app.lib.passwords import PasswordHasher
from app.server.app import create_app
from tests.faults.pg_fixtures import DATABASE, pg, pg_running
from tests.support.cluster import ADMIN, ADMIN_TOKEN, unique
from tests.support.helpers import PASSWORD, assert_error, bearer, console_login, unique_email
from tests.support.live_server import live_server
from tests.support.pg_instance import PostgresInstance
from tests.support.settings import REDIS_URL, base_settings

pytestmark = pytest.mark.faults
__all__ = ["pg", "pg_running"]  # fixtures


@pytest.fixture
async def served(pg_running: PostgresInstance, fast_hasher: PasswordHasher) -> AsyncIterator[str]:
    settings = base_settings(
        database_url=pg_running.sqlalchemy_url(DATABASE),
        redis_url=REDIS_URL,
        redis_prefix=f"test:faults:{uuid.uuid4().hex}:",
        db_pool_size=3,
        admin_token=ADMIN_TOKEN,
    )
    async with live_server(create_app(settings, password_hasher=fast_hasher)) as url:
        yield url


def assert_database_unavailable(response: httpx.Response) -> None:
    error = assert_error(response, 503, "database_unavailable")
    assert error["type"] == "api_error"
    assert "database is unreachable" in error["message"], error
    assert "not saved" in error["message"], error
    assert response.headers["retry-after"] == "5"


async def test_writes_are_a_clear_503_while_the_database_is_down(
    served: str, pg_running: PostgresInstance
) -> None:
    pg = pg_running
    async with httpx.AsyncClient(base_url=served, timeout=30) as http:
        email = unique_email("down")
        assert (
            await http.post("/api/auth/register", json={"email": email, "password": PASSWORD})
        ).status_code == 201
        tokens = await http.post("/api/auth/login", json={"email": email, "password": PASSWORD})
        user = bearer(tokens.json()["accessToken"])
        # A console session too (the session lives in Redis, which stays up).
        assert (await console_login(http, email)).status_code == 303
        assert (await http.get("/projects")).status_code == 200
        assert (await http.get("/readyz")).json()["status"] == "ready"

        await asyncio.to_thread(pg.stop, "immediate")

        backend = {"name": unique("b"), "type": "external", "url": "http://127.0.0.1:9/v1"}
        assert_database_unavailable(
            await http.post("/api/admin/backends", json=backend, headers=ADMIN)
        )
        assert_database_unavailable(
            await http.post(
                "/api/projects", json={"name": "Down", "slug": unique("p")}, headers=user
            )
        )
        assert_database_unavailable(
            await http.post(
                "/api/auth/register", json={"email": unique_email("x"), "password": PASSWORD}
            )
        )
        # A console page: a readable error page, and a toast for an HTMX request.
        page = await http.get("/projects")
        assert page.status_code == 503, page.text
        assert page.headers["content-type"].startswith("text/html")
        assert "Temporarily unavailable" in page.text
        assert "database is unreachable" in page.text
        fragment = await http.get("/projects", headers={"HX-Request": "true"})
        assert fragment.status_code == 503
        toast = json.loads(fragment.headers["HX-Trigger"])["toast"]
        assert toast["level"] == "error"
        assert "database is unreachable" in toast["message"]

        strict = await http.get("/readyz")
        assert strict.status_code == 503
        ready = await http.get("/readyz", params={"allow_degraded": "true"})
        assert ready.status_code == 200
        body = ready.json()
        assert strict.json()["status"] == body["status"]
        assert body["status"] == "degraded", body
        assert body["checks"]["database"].startswith("unreachable"), body
        assert body["checks"]["redis"] == "ok"
        assert isinstance(body["checks"]["usage_buffered"], int)
        assert (await http.get("/healthz")).status_code == 200

        await asyncio.to_thread(pg.start)
        created = await http.post(
            "/api/projects", json={"name": "Back", "slug": unique("p")}, headers=user
        )
        assert created.status_code == 201, created.text
        assert (await http.get("/readyz")).json()["status"] == "ready"


@contextlib.asynccontextmanager
async def silent_server() -> AsyncIterator[int]:
    """Accepts connections and never answers: a black-holed database as a client sees
    it (no refusal, no reply)."""
    held: list[asyncio.StreamWriter] = []

    async def hold(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)

    server = await asyncio.start_server(hold, "127.0.0.1", 0)
    try:
        yield int(server.sockets[0].getsockname()[1])
    finally:
        for writer in held:
            writer.close()
        server.close()
        await server.wait_closed()


async def _connect_once(port: int, connect_timeout: float) -> tuple[float, BaseException]:
    settings = base_settings(
        database_url=f"postgresql+asyncpg://postgres@127.0.0.1:{port}/arona",
        db_connect_timeout_seconds=connect_timeout,
    )
    engine = build_db_config(settings).get_engine()
    started = time.monotonic()
    try:
        async with engine.connect() as connection:
            await connection.execute(text("SELECT 1"))
    except Exception as exc:
        return time.monotonic() - started, exc
    finally:
        await engine.dispose()
    raise AssertionError("a silent server let a connection through")


async def test_a_database_that_never_answers_fails_after_the_connect_timeout() -> None:
    async with silent_server() as port:
        short, short_error = await _connect_once(port, 0.5)
        long, long_error = await _connect_once(port, 4.0)
    for error in (short_error, long_error):
        assert isinstance(error, sa_exc.OperationalError), repr(error)
        # SQLAlchemy's error wraps the driver's, which says why: the timeout.
        assert error.orig is not None
        assert isinstance(error.orig.__cause__, TimeoutError), repr(error.orig)
        assert is_database_outage(error)
    print(f"connect gave up after {short:.2f}s (timeout 0.5) and {long:.2f}s (timeout 4.0)")
    # The wait follows the setting (asyncpg's own default is 60 s); a loaded machine
    # only adds to each wait, far less than the 3.5 s between them.
    assert long >= 3.9, (short, long)
    assert short < long - 2.0, (short, long)


async def test_a_pool_with_no_free_connection_gives_up_as_an_outage(
    pg_running: PostgresInstance,
) -> None:
    settings = base_settings(
        database_url=pg_running.sqlalchemy_url(DATABASE),
        db_pool_size=1,
        db_pool_timeout_seconds=1,
    )
    engine = build_db_config(settings).get_engine()
    try:
        # Pool of one plus one overflow: both held, a third checkout must wait.
        async with engine.connect() as first, engine.connect() as second:
            await first.execute(text("SELECT 1"))
            await second.execute(text("SELECT 1"))
            with pytest.raises(sa_exc.TimeoutError) as raised:
                async with engine.connect() as third:
                    await third.execute(text("SELECT 1"))
        assert is_database_outage(raised.value)
    finally:
        await engine.dispose()
