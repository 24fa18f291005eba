"""A list's ``limit`` and ``offset`` are checked after who may see the list: a caller
who may not gets the 401, 403 or 404 of that, not a 400 for the paging parameters
(``app/domain/rest.py``)."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import pytest
from litestar import Litestar
from litestar.testing import AsyncTestClient

from app.lib.settings import Settings
from tests.support.helpers import assert_error, new_project, new_user
from tests.support.settings import AppFactory


@pytest.fixture
async def app_client(
    pg_settings: Settings, make_app: AppFactory
) -> AsyncIterator[AsyncTestClient[Litestar]]:
    async with AsyncTestClient(app=make_app(pg_settings)) as client:
        yield client


async def test_who_may_see_a_list_is_answered_before_its_paging(
    app_client: AsyncTestClient[Litestar],
) -> None:
    for path in ("/api/admin/backends", "/api/projects", "/api/runtime/conversations"):
        assert_error(await app_client.get(f"{path}?limit=0"), 401)
    await new_user(app_client, "first")  # the first user is made a platform admin
    _, headers = await new_user(app_client, "paging")
    response = await app_client.get("/api/admin/aliases?limit=0", headers=headers)
    assert_error(response, 403, "admin_required")
    response = await app_client.get(
        f"/api/projects/{uuid.uuid4()}/secrets?offset=-1", headers=headers
    )
    assert_error(response, 404, "project_not_found")
    project = await new_project(app_client, headers)
    for query, param in (("limit=0", "limit"), ("offset=-1", "offset")):
        response = await app_client.get(
            f"/api/projects/{project['id']}/secrets?{query}", headers=headers
        )
        assert assert_error(response, 400)["param"] == param
        response = await app_client.get(f"/api/projects?{query}", headers=headers)
        assert assert_error(response, 400)["param"] == param
