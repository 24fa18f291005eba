"""Helpers shared by the Projects API and credential tests.

The app under test runs in the test client's own thread and event loop, so tests
that look at the database directly open their own short-lived engine.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any
from uuid import UUID

from litestar import Litestar
from litestar.testing import AsyncTestClient
from sqlalchemy import update
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker, create_async_engine

from app.db.models import User
from app.lib.settings import Settings
from app.server.resources import Resources
from tests.support.helpers import bearer, login, register, unique_email

Client = AsyncTestClient[Litestar]


@asynccontextmanager
async def db_session(settings: Settings) -> AsyncIterator[AsyncSession]:
    engine = create_async_engine(settings.database_url)
    try:
        async with async_sessionmaker(engine, expire_on_commit=False)() as session:
            yield session
    finally:
        await engine.dispose()


def resources_of(client: Client) -> Resources:
    resources: Resources = client.app.state.resources
    return resources


def settings_of(client: Client) -> Settings:
    return resources_of(client).settings


async def user_with_id(client: Client, tag: str = "user") -> tuple[str, dict[str, str], UUID]:
    """A fresh signed-in user: (email, auth headers, user id)."""
    email = unique_email(tag)
    await register(client, email)
    headers = bearer((await login(client, email))["accessToken"])
    me = await client.get("/api/auth/me", headers=headers)
    assert me.status_code == 200, me.text
    return email, headers, UUID(me.json()["id"])


async def set_user_flags(settings: Settings, user_id: UUID, **values: bool) -> None:
    async with db_session(settings) as session:
        await session.execute(update(User).where(User.id == user_id).values(**values))
        await session.commit()


async def create_api_key(
    client: Client, project_id: str, headers: dict[str, str], name: str = "ci"
) -> dict[str, Any]:
    response = await client.post(
        f"/api/projects/{project_id}/api-keys", json={"name": name}, headers=headers
    )
    assert response.status_code == 201, response.text
    body: dict[str, Any] = response.json()
    return body


async def create_runtime_token(
    client: Client, project_id: str, headers: dict[str, str], **fields: Any
) -> dict[str, Any]:
    response = await client.post(
        f"/api/projects/{project_id}/runtime-tokens", json=fields, headers=headers
    )
    assert response.status_code == 201, response.text
    body: dict[str, Any] = response.json()
    return body


async def eventually(
    check: Callable[[], Awaitable[bool]], *, within: float, interval: float = 0.01
) -> float:
    """Poll ``check`` until it holds; return the seconds it took, fail past ``within``."""
    started = time.monotonic()
    while True:
        if await check():
            return time.monotonic() - started
        if time.monotonic() - started > within:
            raise AssertionError(f"condition not met within {within}s")
        await asyncio.sleep(interval)
