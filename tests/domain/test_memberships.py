"""``ProjectMemberships``: which project a user token may charge, briefly cached.

The caching rules with an in-memory loader and a fake clock; the loader against the
real database: members by id or slug, not strangers, not after removal, not while
the account is disabled.
"""

from __future__ import annotations

import uuid
from uuid import UUID

from advanced_alchemy.extensions.litestar import SQLAlchemyAsyncConfig
from litestar import Litestar
from litestar.testing import AsyncTestClient
from sqlalchemy import update

from app.db.config import build_db_config
from app.db.models import User
from app.domain.projects.memberships import ProjectMemberships, db_membership_loader
from app.lib.settings import Settings
from tests.support.api import user_with_id
from tests.support.helpers import new_project

USER = uuid.UUID("11111111-1111-4111-8111-111111111111")
PROJECT = uuid.UUID("22222222-2222-4222-8222-222222222222")


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


async def test_answers_are_kept_for_their_ttl_then_read_again() -> None:
    reads: list[tuple[UUID, str]] = []
    member = {(USER, "acme")}

    async def load(user_id: UUID, reference: str) -> UUID | None:
        reads.append((user_id, reference))
        return PROJECT if (user_id, reference) in member else None

    clock = Clock()
    memberships = ProjectMemberships(load, ttl=10.0, negative_ttl=2.0, clock=clock)
    assert await memberships.project_of(USER, "acme") == PROJECT
    assert await memberships.project_of(USER, " acme ") == PROJECT  # trimmed, same entry
    assert len(reads) == 1
    member.clear()  # removed: still charged until the answer expires...
    clock.now += 9.9
    assert await memberships.project_of(USER, "acme") == PROJECT
    clock.now += 0.2  # ...and not after
    assert await memberships.project_of(USER, "acme") is None
    assert len(reads) == 2
    clock.now += 1.9  # "not a member" is kept for less time
    assert await memberships.project_of(USER, "acme") is None
    assert len(reads) == 2
    clock.now += 0.2
    member.add((USER, "acme"))
    assert await memberships.project_of(USER, "acme") == PROJECT
    assert len(reads) == 3


async def test_oversized_or_empty_references_are_not_looked_up() -> None:
    async def load(user_id: UUID, reference: str) -> UUID | None:
        raise AssertionError("no query for a reference that names nothing")

    memberships = ProjectMemberships(load)
    assert await memberships.project_of(USER, "") is None
    assert await memberships.project_of(USER, "x" * 65) is None


async def test_the_cache_is_bounded_and_forgets_a_user() -> None:
    async def load(user_id: UUID, reference: str) -> UUID | None:
        return PROJECT

    memberships = ProjectMemberships(load, max_entries=3)
    for n in range(5):
        await memberships.project_of(USER, f"p{n}")
    assert len(memberships._entries) == 3
    memberships.forget_user(USER)
    assert not memberships._entries


async def test_the_database_loader_follows_membership_and_account_state(
    client: AsyncTestClient[Litestar], pg_settings: Settings
) -> None:
    _, owner_headers, owner_id = await user_with_id(client, "owner")
    _, _, stranger_id = await user_with_id(client, "stranger")
    project = await new_project(client, owner_headers)
    project_id = UUID(project["id"])
    config: SQLAlchemyAsyncConfig = build_db_config(pg_settings)
    load = db_membership_loader(config)
    try:
        assert await load(owner_id, project["id"]) == project_id
        assert await load(owner_id, project["slug"]) == project_id
        assert await load(stranger_id, project["id"]) is None
        assert await load(owner_id, str(uuid.uuid4())) is None
        async with config.get_session() as session:
            await session.execute(update(User).where(User.id == owner_id).values(disabled=True))
            await session.commit()
        assert await load(owner_id, project["id"]) is None
    finally:
        await config.get_engine().dispose()
