"""A key's governance on video jobs: its allowed models and its rate decide before a
job exists, and each refusal is metered like every refused call."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from app.lib.settings import Settings
from tests.support.api import eventually
from tests.support.helpers import assert_error
from tests.support.live_server import live_server
from tests.support.settings import AppFactory
from tests.support.video import (
    Minimax,
    add_minimax_backend,
    create_job,
    minimax,
    new_tenant,
    unique_model,
    usage_rows,
    video_pg_settings,
)

__all__ = ["minimax", "video_pg_settings"]


@pytest.fixture
async def api(
    video_pg_settings: Settings, make_app: AppFactory
) -> AsyncIterator[httpx.AsyncClient]:
    async with (
        live_server(make_app(video_pg_settings)) as url,
        httpx.AsyncClient(base_url=url, timeout=30) as client,
    ):
        yield client


async def test_a_keys_models_and_rate_apply_to_video_jobs(
    api: httpx.AsyncClient, video_pg_settings: Settings, minimax: Minimax
) -> None:
    model = unique_model()
    await add_minimax_backend(api, minimax, model)
    tenant = await new_tenant(api)
    key_url = f"/api/projects/{tenant.project_id}/api-keys/{tenant.key_id}"
    limited = await api.patch(key_url, json={"allowedModels": ["chat-*"]}, headers=tenant.owner)
    assert limited.status_code == 200, limited.text
    body = {"model": model, "prompt": "a cat"}
    refused = await api.post("/v1/video/generations", json=body, headers=tenant.key)
    assert_error(refused, 403, "model_not_allowed")
    assert (await api.get("/v1/video/generations", headers=tenant.key)).json()["total"] == 0

    opened = await api.patch(
        key_url, json={"allowedModels": [model], "rpm": 1}, headers=tenant.owner
    )
    assert opened.status_code == 200, opened.text
    await create_job(api, tenant.key, model, "the one this minute")
    limited_rate = await api.post("/v1/video/generations", json=body, headers=tenant.key)
    assert_error(limited_rate, 429, "rate_limit_exceeded")
    assert 1 <= int(limited_rate.headers["retry-after"]) <= 60

    codes: list[Any] = []

    async def metered() -> bool:
        rows = await usage_rows(video_pg_settings, tenant.key_id, model)
        codes[:] = sorted(str(r.error_code) for r in rows if r.status in (403, 429))
        return len(codes) == 2

    await eventually(metered, within=10)
    assert codes == ["model_not_allowed", "rate_limit_exceeded"]
