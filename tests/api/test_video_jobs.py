"""Video generation over REST: lifecycle, pricing, failures, ownership, bad input.

Real apps on loopback ports (PostgreSQL + Redis unless a test says otherwise) drive
jobs against a real fake MiniMax server; the jobs' usage records are read back from
the database.
"""

from __future__ import annotations

import asyncio
import base64
import uuid
from collections.abc import AsyncIterator
from typing import Any

import httpx
import msgspec
import pytest

from app.domain.video.events import CHANNEL, notification_of
from app.domain.video.schemas import VideoJobOut
from app.fakes.openai_upstream import FakeOpenAI
from app.fakes.serve import serve_asgi
from app.lib.settings import Settings
from tests.support.api import eventually
from tests.support.helpers import assert_error, new_user
from tests.support.live_server import live_server
from tests.support.routing import ADMIN, register_backend, wait_healthy
from tests.support.settings import AppFactory
from tests.support.video import (
    FINAL,
    Minimax,
    add_minimax_backend,
    bus_of,
    create_job,
    get_job,
    job_row,
    minimax,
    new_tenant,
    unique_model,
    usage_rows,
    video_pg_settings,
    video_sqlite_settings,
    wait_status,
)

__all__ = ["minimax", "video_pg_settings", "video_sqlite_settings"]

PNG = b"\x89PNG\r\n\x1a\n" + b"\x00" * 64
PNG_B64 = base64.b64encode(PNG).decode()


@pytest.fixture
async def api(
    video_pg_settings: Settings, make_app: AppFactory
) -> AsyncIterator[httpx.AsyncClient]:
    async with (
        live_server(make_app(video_pg_settings)) as url,
        httpx.AsyncClient(base_url=url, timeout=30) as client,
    ):
        yield client


async def _price(client: httpx.AsyncClient, model: str, **body: Any) -> dict[str, Any]:
    response = await client.put(f"/api/admin/video-prices/{model}", json=body, headers=ADMIN)
    assert response.status_code == 200, response.text
    result: dict[str, Any] = response.json()
    return result


async def test_a_job_runs_to_done_with_its_url_cost_usage_and_events(
    api: httpx.AsyncClient, video_pg_settings: Settings, minimax: Minimax
) -> None:
    model = unique_model()
    backend = await add_minimax_backend(api, minimax, model)
    await _price(
        api,
        model,
        base=0.1,
        pricePerSecond=0.05,
        resolutionCoeffs={"720p": 2, "*": 1.5},
        currency="USD",
    )
    tenant = await new_tenant(api)
    events: list[dict[str, Any]] = []
    # A listener of its own on the cluster's bus: what any other replica would see.
    async with bus_of(video_pg_settings) as bus, bus.subscribe(CHANNEL) as stream:

        async def collect() -> None:
            async for event in stream:
                events.append(event)
                if event["status"] in FINAL:
                    return

        collector = asyncio.create_task(collect())
        created = await create_job(
            api, tenant.key, model, "a red fox in snow", duration_seconds=6, width=1280, height=720
        )
        assert set(created) == {
            "id",
            "object",
            "model",
            "status",
            "progress",
            "stream_id",
            "created_at",
            "updated_at",
            "result",
            "error",
            "cost",
        }
        assert created["id"].startswith("vid_")
        assert created["object"] == "video.generation"
        assert (created["model"], created["status"], created["progress"]) == (model, "queued", 0)
        assert (created["result"], created["error"], created["cost"]) == (None, None, None)
        done = await wait_status(api, tenant.key, created["id"], FINAL)
        await asyncio.wait_for(collector, 10)

    assert done["status"] == "done", done
    assert done["progress"] == 100
    assert done["result"]["url"].startswith(minimax.url + "/files/")
    assert done["cost"] == pytest.approx(0.1 + 6 * 0.05 * 2)
    assert done["error"] is None
    assert done["stream_id"] == created["stream_id"]
    # The provider got what the client asked for, mapped to its vocabulary.
    creates = minimax.fake.requests_for("/v1/video_generation")
    assert len(creates) == 1
    assert creates[0].body == {
        "model": model,
        "prompt": "a red fox in snow",
        "duration": 6,
        "resolution": "720P",
    }
    assert creates[0].headers["authorization"] == f"Bearer {minimax.fake.api_key}"
    # The URL works: it is the fake's file.
    async with httpx.AsyncClient() as plain:
        assert (await plain.get(done["result"]["url"])).status_code == 200

    row = await job_row(video_pg_settings, created["id"])
    assert (row.backend, row.model_served, row.status) == (backend, model, "done")
    assert (row.lease_owner, row.next_poll_at) == (None, None)
    assert row.finished_at is not None
    [usage] = await usage_rows(video_pg_settings, tenant.key_id, model)
    assert usage.endpoint == "video.generations"
    assert (usage.status, usage.error_code, usage.backend) == (200, None, backend)
    assert str(usage.project_id) == tenant.project_id
    assert usage.cost == pytest.approx(0.7)
    # Its own pricing mode, on the exact columns every usage record has.
    assert (usage.cost_micros, usage.currency, usage.cost_estimated) == (700_000, "USD", False)

    # Every change was published, in order, with progress never going back.
    statuses = [e["status"] for e in events]
    assert (statuses[0], statuses[-1]) == ("queued", "done")
    assert "running" in statuses
    progress = [e["progress"] for e in events]
    assert progress == sorted(progress)
    assert progress[-1] == 100
    assert all(p < 100 for p in progress[:-1])
    assert {e["job_id"] for e in events} == {created["id"]}
    assert events[-1]["project_id"] == tenant.project_id
    assert (events[-1]["result"], events[-1]["cost"]) == (done["result"], done["cost"])
    assert notification_of(events[-1]) == (
        "video.done",
        {
            "job_id": created["id"],
            "stream_id": created["stream_id"],
            "result": done["result"],
            "cost": done["cost"],
        },
    )
    assert notification_of(events[0])[0] == "video.progress"


async def test_a_generation_the_provider_fails_keeps_its_message(
    api: httpx.AsyncClient, video_pg_settings: Settings, minimax: Minimax
) -> None:
    model = unique_model()
    await add_minimax_backend(api, minimax, model)
    tenant = await new_tenant(api)
    created = await create_job(api, tenant.key, model, "a fox [fail:content flagged by review]")
    failed = await wait_status(api, tenant.key, created["id"], FINAL)
    assert failed["status"] == "failed"
    assert failed["error"] == {"message": "content flagged by review", "code": "video_failed"}
    assert (failed["result"], failed["cost"]) == (None, None)
    assert failed["progress"] < 100
    assert notification_of(_out(failed)) == (
        "video.failed",
        {
            "job_id": created["id"],
            "stream_id": created["stream_id"],
            "error": "content flagged by review",
        },
    )
    [usage] = await usage_rows(video_pg_settings, tenant.key_id, model)
    assert (usage.status, usage.error_code, usage.cost) == (502, "video_failed", None)


async def test_a_submission_the_provider_refuses_fails_the_job_at_once(
    api: httpx.AsyncClient, video_pg_settings: Settings, minimax: Minimax
) -> None:
    model = unique_model()
    await add_minimax_backend(api, minimax, model)
    tenant = await new_tenant(api)
    # 1026: sensitive content, not retryable.
    created = await create_job(api, tenant.key, model, "a fox [error:1026]")
    failed = await wait_status(api, tenant.key, created["id"], FINAL)
    assert failed["status"] == "failed"
    assert failed["error"]["code"] == "video_provider_error"
    assert "fake error 1026" in failed["error"]["message"]
    assert minimax.fake.stats.creates == 0
    assert len(minimax.fake.requests_for("/v1/video_generation")) == 1  # not retried
    row = await job_row(video_pg_settings, created["id"])
    assert (row.provider_task_id, row.backend) == (None, None)
    [usage] = await usage_rows(video_pg_settings, tenant.key_id, model)
    assert (usage.status, usage.error_code) == (502, "video_provider_error")


async def test_transient_provider_errors_are_retried_and_the_job_is_metered_once(
    api: httpx.AsyncClient, video_pg_settings: Settings, minimax: Minimax
) -> None:
    model = unique_model()
    await add_minimax_backend(api, minimax, model)
    tenant = await new_tenant(api)
    # The first create attempt answers 500 (the marker is used up by it, so the retry
    # creates the task), then two polls of the task are rate limited (1002).
    minimax.fake.control.next_markers = ["[http500]"]
    first = await create_job(api, tenant.key, model, "transient [poll-error:1002*2]")
    assert (await wait_status(api, tenant.key, first["id"], FINAL))["status"] == "done"
    assert len(minimax.fake.requests_for("/v1/video_generation")) == 2
    assert minimax.fake.stats.creates == 1
    # One retrieve of the file answers 500.
    second = await create_job(api, tenant.key, model, "again [retrieve-http500*1]")
    done = await wait_status(api, tenant.key, second["id"], FINAL)
    assert done["status"] == "done", done
    assert minimax.fake.stats.retrieves == 3  # first job once, second twice
    usages = await usage_rows(video_pg_settings, tenant.key_id, model)
    assert sorted(u.status for u in usages) == [200, 200]


async def test_cancel_stops_a_job_and_a_finished_one_is_a_409(
    api: httpx.AsyncClient, video_pg_settings: Settings, minimax: Minimax
) -> None:
    model = unique_model()
    await add_minimax_backend(api, minimax, model)
    tenant = await new_tenant(api)
    created = await create_job(api, tenant.key, model, "forever [stuck]")
    await wait_status(api, tenant.key, created["id"], ("running",))
    response = await api.post(f"/v1/video/generations/{created['id']}/cancel", headers=tenant.key)
    assert response.status_code == 200, response.text
    cancelled = response.json()
    assert cancelled["status"] == "cancelled"
    assert cancelled["error"] == {"message": "cancelled", "code": "cancelled"}
    assert notification_of(_out(cancelled)) == (
        "video.failed",
        {"job_id": created["id"], "stream_id": created["stream_id"], "error": "cancelled"},
    )
    assert (await get_job(api, tenant.key, created["id"]))["status"] == "cancelled"
    again = await api.post(f"/v1/video/generations/{created['id']}/cancel", headers=tenant.key)
    assert_error(again, 409, "video_job_finished")
    [usage] = await usage_rows(video_pg_settings, tenant.key_id, model)
    assert (usage.status, usage.error_code, usage.cost) == (499, "cancelled", None)

    # A finished job cannot be cancelled either.
    done = await create_job(api, tenant.key, model, "quick one")
    await wait_status(api, tenant.key, done["id"], FINAL)
    late = await api.post(f"/v1/video/generations/{done['id']}/cancel", headers=tenant.key)
    assert_error(late, 409, "video_job_finished")
    assert (await get_job(api, tenant.key, done["id"]))["status"] == "done"


async def test_lists_are_newest_first_paginated_and_per_owner(
    api: httpx.AsyncClient, minimax: Minimax
) -> None:
    model = unique_model()
    await add_minimax_backend(api, minimax, model)
    tenant, other = await new_tenant(api), await new_tenant(api)
    ids = [(await create_job(api, tenant.key, model, f"clip {i}"))["id"] for i in range(3)]
    theirs = await create_job(api, other.key, model, "not yours")

    response = await api.get("/v1/video/generations", headers=tenant.key)
    assert response.status_code == 200, response.text
    page = response.json()
    assert page["object"] == "list"
    assert [j["id"] for j in page["data"]] == ids[::-1]
    assert (page["total"], page["limit"], page["offset"], page["has_more"]) == (3, 20, 0, False)

    response = await api.get("/v1/video/generations?limit=2&offset=1", headers=tenant.key)
    page = response.json()
    assert [j["id"] for j in page["data"]] == [ids[1], ids[0]]
    assert (page["total"], page["has_more"]) == (3, False)
    response = await api.get("/v1/video/generations?limit=1", headers=tenant.key)
    assert response.json()["has_more"] is True

    listed = (await api.get("/v1/video/generations", headers=other.key)).json()
    assert [j["id"] for j in listed["data"]] == [theirs["id"]]
    for query, param in (("limit=0", "limit"), ("limit=101", "limit"), ("offset=-1", "offset")):
        error = assert_error(
            await api.get(f"/v1/video/generations?{query}", headers=tenant.key), 400
        )
        assert error["param"] == param


async def test_another_owners_job_is_a_404(api: httpx.AsyncClient, minimax: Minimax) -> None:
    model = unique_model()
    await add_minimax_backend(api, minimax, model)
    tenant, other = await new_tenant(api), await new_tenant(api)
    job = await create_job(api, tenant.key, model, "mine [stuck]")
    # Another project's key, and its owner's token naming that project, see nothing.
    for headers in (other.key, {**other.owner, "X-Arona-Project": other.project_id}):
        for response in (
            await api.get(f"/v1/video/generations/{job['id']}", headers=headers),
            await api.post(f"/v1/video/generations/{job['id']}/cancel", headers=headers),
        ):
            error = assert_error(response, 404, "video_job_not_found")
            assert error["param"] == "id"
    for missing in ("vid_" + uuid.uuid4().hex, "vid_nothex", "42"):
        assert_error(
            await api.get(f"/v1/video/generations/{missing}", headers=tenant.key),
            404,
            "video_job_not_found",
        )
    assert (await get_job(api, tenant.key, job["id"]))["status"] in ("queued", "running")

    # A member's token names the project the job is charged to: the project's job,
    # which its API key sees too; without a project a user token is refused.
    member = {**other.owner, "X-Arona-Project": other.project_id}
    mine = await create_job(api, member, model, "member-made [stuck]")
    assert (await get_job(api, member, mine["id"]))["id"] == mine["id"]
    assert (await get_job(api, other.key, mine["id"]))["id"] == mine["id"]
    assert_error(
        await api.get(f"/v1/video/generations/{mine['id']}", headers=tenant.key),
        404,
        "video_job_not_found",
    )
    assert_error(
        await api.get(f"/v1/video/generations/{mine['id']}", headers=other.owner),
        400,
        "project_required",
    )
    listed = (await api.get("/v1/video/generations", headers=member)).json()
    assert [j["id"] for j in listed["data"]] == [mine["id"]]
    for owner, job_id in ((tenant.key, job["id"]), (member, mine["id"])):
        response = await api.post(f"/v1/video/generations/{job_id}/cancel", headers=owner)
        assert response.status_code == 200, response.text


async def test_a_first_frame_reaches_the_provider_and_is_not_kept(
    api: httpx.AsyncClient, video_pg_settings: Settings, minimax: Minimax
) -> None:
    model = unique_model()
    await add_minimax_backend(api, minimax, model)
    tenant = await new_tenant(api)
    data_url = f"data:image/png;base64,{PNG_B64}"
    for images in ([data_url], [{"data_base64": PNG_B64, "mime_type": "image/PNG"}]):
        job = await create_job(api, tenant.key, model, "animate this", images=images)
        done = await wait_status(api, tenant.key, job["id"], FINAL)
        assert done["status"] == "done", done
        assert (await job_row(video_pg_settings, job["id"])).first_frame_image is None
    creates = minimax.fake.requests_for("/v1/video_generation")
    assert [c.body["first_frame_image"] for c in creates] == [data_url, data_url]


BAD_BODIES: list[tuple[dict[str, Any], str]] = [
    ({"prompt": None}, "prompt"),
    ({"prompt": "   "}, "prompt"),
    ({"prompt": "x" * 4001}, "prompt"),
    ({"model": ""}, "model"),
    (
        {"images": [{"data_base64": "not base64!", "mime_type": "image/png"}]},
        "images[0].data_base64",
    ),
    ({"images": [{"data_base64": "", "mime_type": "image/png"}]}, "images[0].data_base64"),
    ({"images": [{"data_base64": PNG_B64, "mime_type": "text/plain"}]}, "images[0].mime_type"),
    ({"images": ["data:image/png;base64,@@@@"]}, "images[0]"),
    ({"images": ["https://example.com/cat.png"]}, "images[0]"),
    ({"images": [f"data:application/pdf;base64,{PNG_B64}"]}, "images[0]"),
    ({"images": [{"data_base64": PNG_B64}]}, "images[0]"),
    ({"images": [f"data:image/png;base64,{PNG_B64}"] * 2}, "images"),
    (
        {"images": [{"data_base64": "A" * (14 * 1024 * 1024), "mime_type": "image/png"}]},
        "images[0].data_base64",
    ),
    ({"duration_seconds": 0}, "duration_seconds"),
    ({"duration_seconds": 61}, "duration_seconds"),
    ({"width": 63}, "width"),
    ({"height": 4097}, "height"),
    ({"extra": "not an object"}, "extra"),
    ({"unknown_field": 1}, "unknown_field"),
]


async def test_bad_input_is_a_400_naming_the_field(
    api: httpx.AsyncClient, minimax: Minimax
) -> None:
    model = unique_model()
    await add_minimax_backend(api, minimax, model)
    tenant = await new_tenant(api)
    for change, param in BAD_BODIES:
        body = {"model": model, "prompt": "a fox", **change}
        body = {k: v for k, v in body.items() if v is not None}
        response = await api.post("/v1/video/generations", json=body, headers=tenant.key)
        error = assert_error(response, 400)
        assert error["param"] == param, (change, error)
        assert error["code"] == "invalid_request", (change, error)
    assert (await api.get("/v1/video/generations", headers=tenant.key)).json()["total"] == 0
    assert minimax.fake.requests_for("/v1/video_generation") == []


@pytest.fixture
async def chat_backend(api: httpx.AsyncClient) -> AsyncIterator[str]:
    """A chat-only backend advertising a model of its own; yields the model."""
    model = unique_model("chat")
    async with serve_asgi(FakeOpenAI("chat", models=[model])) as url:
        name = f"chat-{uuid.uuid4().hex[:8]}"
        response = await register_backend(api, name=name, type="external", url=url, models=[model])
        assert response.status_code == 201, response.text
        await wait_healthy(api, name)
        yield model
        await api.delete(f"/api/admin/backends/{name}", headers=ADMIN)


async def test_unknown_and_chat_only_models_are_refused_before_any_job(
    api: httpx.AsyncClient, chat_backend: str
) -> None:
    tenant = await new_tenant(api)
    for model, status, code in (
        (unique_model("nobody"), 404, "model_not_found"),
        (chat_backend, 400, "not_a_video_model"),
    ):
        response = await api.post(
            "/v1/video/generations", json={"model": model, "prompt": "a fox"}, headers=tenant.key
        )
        assert assert_error(response, status, code)["param"] == "model"
    assert (await api.get("/v1/video/generations", headers=tenant.key)).json()["total"] == 0


async def test_the_provider_hint_names_the_video_kind_by_its_seed_name(
    api: httpx.AsyncClient, video_pg_settings: Settings, minimax: Minimax
) -> None:
    model = unique_model()
    backend = await add_minimax_backend(api, minimax, model)
    tenant = await new_tenant(api)
    for hint in ("cloud", "CLOUD", "minimax", "minimax-cloud"):
        created = await create_job(api, tenant.key, model, "a fox", provider=hint)
        done = await wait_status(api, tenant.key, created["id"], FINAL)
        assert done["status"] == "done", (hint, done)
        row = await job_row(video_pg_settings, created["id"])
        assert (row.provider_hint, row.backend) == (hint, backend)
    # A hint naming another kind leaves no backend for the model.
    response = await api.post(
        "/v1/video/generations",
        json={"model": model, "prompt": "a fox", "provider": "ollama"},
        headers=tenant.key,
    )
    assert_error(response, 404, "model_not_found")


async def test_the_quota_applies_and_credentials_are_required(
    api: httpx.AsyncClient, video_pg_settings: Settings, minimax: Minimax
) -> None:
    model = unique_model()
    await add_minimax_backend(api, minimax, model)
    tenant = await new_tenant(api)
    response = await api.put(
        f"/api/admin/projects/{tenant.project_id}/quota", json={"perDay": 1}, headers=ADMIN
    )
    assert response.status_code == 200, response.text
    await create_job(api, tenant.key, model, "the one allowed")
    refused = await api.post(
        "/v1/video/generations", json={"model": model, "prompt": "one more"}, headers=tenant.key
    )
    assert_error(refused, 429, "quota_exceeded")
    assert int(refused.headers["retry-after"]) >= 1
    assert (await api.get("/v1/video/generations", headers=tenant.key)).json()["total"] == 1
    # The refusal is metered like every refused call: no job, one usage record.
    refusals: list[Any] = []

    async def metered() -> bool:
        rows = await usage_rows(video_pg_settings, tenant.key_id, model)
        refusals[:] = [r for r in rows if r.status == 429]
        return bool(refusals)

    await eventually(metered, within=10)
    [refusal] = refusals
    assert (refusal.endpoint, refusal.error_code, refusal.project_id) == (
        "video.generations",
        "quota_exceeded",
        uuid.UUID(tenant.project_id),
    )

    body = {"model": model, "prompt": "who are you"}
    assert_error(await api.post("/v1/video/generations", json=body), 401)
    assert_error(
        await api.post("/v1/video/generations", json=body, headers={"Authorization": "Bearer no"}),
        401,
    )
    assert_error(await api.get("/v1/video/generations"), 401)


async def test_an_unpriced_model_costs_null(
    api: httpx.AsyncClient, video_pg_settings: Settings, minimax: Minimax
) -> None:
    model = unique_model()
    await add_minimax_backend(api, minimax, model)
    tenant = await new_tenant(api)
    job = await create_job(api, tenant.key, model, "free?")
    done = await wait_status(api, tenant.key, job["id"], FINAL)
    assert (done["status"], done["cost"]) == ("done", None)
    [usage] = await usage_rows(video_pg_settings, tenant.key_id, model)
    assert (usage.status, usage.cost) == (200, None)


async def test_per_frame_and_per_call_prices_apply_to_the_served_model(
    api: httpx.AsyncClient, minimax: Minimax
) -> None:
    model = unique_model()
    await add_minimax_backend(api, minimax, model)
    tenant = await new_tenant(api)
    await _price(api, model, mode="per_frame", base=0.5, pricePerFrame=0.01, fps=24)
    job = await create_job(api, tenant.key, model, "frames", duration_seconds=10)
    assert (await wait_status(api, tenant.key, job["id"], FINAL))["cost"] == pytest.approx(2.9)
    await _price(api, model, mode="per_call", base=1.25)
    job = await create_job(api, tenant.key, model, "flat", duration_seconds=10)
    assert (await wait_status(api, tenant.key, job["id"], FINAL))["cost"] == pytest.approx(1.25)


async def test_the_price_admin_api(api: httpx.AsyncClient) -> None:
    model = unique_model("priced")
    url = f"/api/admin/video-prices/{model}"
    created = await _price(api, model, pricePerSecond=0.2, resolutionCoeffs={"1080P": 2})
    assert created == {
        "model": model,
        "mode": "per_second_resolution",
        "base": 0.0,
        "pricePerSecond": 0.2,
        "resolutionCoeffs": {"1080": 2.0},
        "pricePerFrame": 0.0,
        "fps": 24.0,
        "currency": None,
        "createdAt": created["createdAt"],
        "updatedAt": created["updatedAt"],
    }
    replaced = await _price(api, model, mode="per_call", base=3)
    assert (replaced["mode"], replaced["base"], replaced["pricePerSecond"]) == (
        "per_call",
        3.0,
        0.0,
    )
    assert replaced["createdAt"] == created["createdAt"]
    assert (await api.get(url, headers=ADMIN)).json() == replaced
    listed = (await api.get("/api/admin/video-prices?limit=500", headers=ADMIN)).json()
    assert set(listed) == {"items", "total", "limit", "offset"}
    assert replaced in listed["items"]

    for body, param in (
        ({"mode": "per_token"}, "mode"),
        ({"base": -1}, "base"),
        ({"fps": 0}, "fps"),
        ({"resolutionCoeffs": {"hd": 1}}, "resolutionCoeffs"),
        ({"resolutionCoeffs": {"720": -1}}, "resolutionCoeffs"),
        ({"price_per_second": 1}, "price_per_second"),
    ):
        error = assert_error(await api.put(url, json=body, headers=ADMIN), 400)
        assert (error["param"] or "").startswith(param), error

    _, user = await new_user(api, "not-admin")  # type: ignore[arg-type]
    assert_error(await api.get(url, headers=user), 403)
    assert_error(await api.put(url, json={}, headers=user), 403)
    assert_error(await api.get(url), 401)

    assert (await api.delete(url, headers=ADMIN)).status_code == 204
    assert_error(await api.get(url, headers=ADMIN), 404, "video_price_not_found")
    assert_error(await api.delete(url, headers=ADMIN), 404, "video_price_not_found")


async def test_a_job_runs_on_sqlite_too(
    video_sqlite_settings: Settings, make_app: AppFactory, minimax: Minimax
) -> None:
    async with (
        live_server(make_app(video_sqlite_settings)) as url,
        httpx.AsyncClient(base_url=url, timeout=30) as client,
    ):
        model = unique_model()
        await add_minimax_backend(client, minimax, model)
        await _price(client, model, base=1)
        tenant = await new_tenant(client)
        job = await create_job(client, tenant.key, model, "on sqlite")
        done = await wait_status(client, tenant.key, job["id"], FINAL)
        assert (done["status"], done["cost"]) == ("done", 1.0)
        [usage] = await usage_rows(video_sqlite_settings, tenant.key_id, model)
        assert (usage.status, usage.cost, usage.endpoint) == (200, 1.0, "video.generations")
        # A video price without a currency is in the platform's default.
        assert (usage.cost_micros, usage.currency) == (1_000_000, "USD")


def _out(body: dict[str, Any]) -> VideoJobOut:
    """A job as the API answered it, as the RPC layer reads it back for a replay."""
    return msgspec.convert(body, VideoJobOut)
