"""Usage API: a project's records (filtered, paginated, newest first) and aggregates.

Records are written by the real ``UsageWriter`` into the app's database (PostgreSQL
and SQLite), then read over the API.
"""

from __future__ import annotations

import datetime
import uuid
from dataclasses import dataclass
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import create_async_engine

from app.db.config import install_sqlite_pragmas
from app.domain.usage.entry import UsageEntry
from app.domain.usage.services import UsageFilters, UsageRecordService
from app.domain.usage.writer import UsageWriter
from tests.support.api import Client, db_session, settings_of
from tests.support.conversations import (
    ADMIN,
    MISSING,
    Tenant,
    both_client,
    new_tenant,
    pg_client,
)
from tests.support.helpers import assert_error

__all__ = ["both_client", "pg_client"]

RECORD_FIELDS = {
    "id",
    "apiKeyId",
    "userId",
    "modelRequested",
    "modelServed",
    "backend",
    "endpoint",
    "streamed",
    "promptTokens",
    "completionTokens",
    "totalTokens",
    "estimated",
    "status",
    "errorCode",
    "latencyMs",
    "ttftMs",
    "conversationId",
    "modelProfileId",
    "isCustom",
    "isOverrideKey",
    "cost",
    "costMicros",
    "currency",
    "costEstimated",
    "createdAt",
}
KEY_1 = uuid.UUID("11111111-1111-4111-8111-111111111111")
KEY_2 = uuid.UUID("22222222-2222-4222-8222-222222222222")


def utc(text: str) -> datetime.datetime:
    return datetime.datetime.fromisoformat(text).replace(tzinfo=datetime.UTC)


async def write(client: Client, entries: list[UsageEntry]) -> None:
    engine = create_async_engine(settings_of(client).database_url)
    install_sqlite_pragmas(engine)
    try:
        writer = UsageWriter(engine)
        for entry in entries:
            writer.record(entry)
        assert await writer.flush() == len(entries)
    finally:
        await engine.dispose()


@dataclass
class Seeded:
    tenant: Tenant
    ids: list[str]
    """The five records' ids in the order written (oldest first)."""

    def expect(self, *numbers: int) -> list[str]:
        """Ids of records 1..5, as the API lists them."""
        return [self.ids[n - 1] for n in numbers]


async def seed(client: Client) -> Seeded:
    tenant = await new_tenant(client)
    project_id = uuid.UUID(tenant.project_id)

    def entry(created: str, **fields: Any) -> UsageEntry:
        base: dict[str, Any] = {
            "model_requested": "gpt-a",
            "endpoint": "chat",
            "status": 200,
            "project_id": project_id,
            "created_at": utc(created),
        }
        return UsageEntry(**{**base, **fields})

    entries = [
        entry(
            "2026-01-01T23:30:00",
            model_profile_id="p1",
            api_key_id=KEY_1,
            conversation_id="c1",
            prompt_tokens=10,
            completion_tokens=5,
            total_tokens=15,
            model_served="gpt-a-2025",
            backend="b1",
            latency_ms=120,
            ttft_ms=40,
            streamed=True,
            cost=0.1,
            cost_micros=100_000,
            currency="USD",
        ),
        entry("2026-01-02T00:10:00", status=429, error_code="quota_exceeded"),
        entry(
            "2026-01-02T12:00:00",
            model_requested="gpt-b",
            is_custom=True,
            conversation_id="c2",
            prompt_tokens=100,
            completion_tokens=50,
            total_tokens=150,
            cost=0.25,
            cost_micros=250_000,
            currency="USD",
            cost_estimated=True,
        ),
        entry(
            "2026-01-03T08:00:00",
            model_requested="gpt-b",
            is_override_key=True,
            api_key_id=KEY_2,
            status=502,
            error_code="bad_gateway",
            prompt_tokens=1,
            total_tokens=1,
        ),
        entry(
            "2026-01-03T09:00:00",
            model_profile_id="p2",
            prompt_tokens=20,
            completion_tokens=10,
            total_tokens=30,
        ),
    ]
    # Another project's traffic, the same day and model: never shown to this one.
    other = await new_tenant(client)
    stranger = entry("2026-01-02T13:00:00", project_id=uuid.UUID(other.project_id))
    await write(client, [*entries, stranger])
    return Seeded(tenant, [str(e.id) for e in entries])


async def listed(client: Client, seeded: Seeded, query: str = "", **kwargs: Any) -> Any:
    headers = kwargs.get("headers", seeded.tenant.owner)
    url = f"/api/projects/{seeded.tenant.project_id}/usage"
    response = await client.get(f"{url}?{query}" if query else url, headers=headers)
    assert response.status_code == 200, response.text
    return response.json()


async def ids(client: Client, seeded: Seeded, query: str = "") -> list[str]:
    return [item["id"] for item in (await listed(client, seeded, query))["items"]]


async def summary(client: Client, seeded: Seeded, query: str = "") -> Any:
    url = f"/api/projects/{seeded.tenant.project_id}/usage/summary"
    response = await client.get(f"{url}?{query}" if query else url, headers=seeded.tenant.owner)
    assert response.status_code == 200, response.text
    return response.json()


async def test_records_newest_first_in_camel_case(both_client: Client) -> None:
    seeded = await seed(both_client)
    page = await listed(both_client, seeded)
    assert set(page) == {"items", "total", "limit", "offset"}
    assert (page["total"], page["limit"], page["offset"]) == (5, 50, 0)
    assert [item["id"] for item in page["items"]] == seeded.expect(5, 4, 3, 2, 1)
    oldest = page["items"][-1]
    assert set(oldest) == RECORD_FIELDS
    assert oldest == {
        **oldest,
        "apiKeyId": str(KEY_1),
        "modelRequested": "gpt-a",
        "modelServed": "gpt-a-2025",
        "backend": "b1",
        "endpoint": "chat",
        "streamed": True,
        "promptTokens": 10,
        "completionTokens": 5,
        "totalTokens": 15,
        "status": 200,
        "latencyMs": 120,
        "ttftMs": 40,
        "conversationId": "c1",
        "modelProfileId": "p1",
        "isCustom": False,
        "isOverrideKey": False,
        "cost": 0.1,
        "costMicros": 100_000,
        "currency": "USD",
        "costEstimated": False,
    }
    assert page["items"][0]["cost"] is None  # unpriced
    assert page["items"][0]["costMicros"] is None
    assert page["items"][0]["currency"] is None
    created = datetime.datetime.fromisoformat(oldest["createdAt"].replace("Z", "+00:00"))
    assert created == utc("2026-01-01T23:30:00")

    second = await listed(both_client, seeded, "limit=2&offset=1")
    assert [item["id"] for item in second["items"]] == seeded.expect(4, 3)
    assert (second["total"], second["limit"], second["offset"]) == (5, 2, 1)
    past_end = await listed(both_client, seeded, "offset=10")
    assert (past_end["items"], past_end["total"]) == ([], 5)


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("from=2026-01-02T00:00:00Z", (5, 4, 3, 2)),
        ("to=2026-01-02T00:00:00Z", (1,)),
        ("from=2026-01-02T00:00:00Z&to=2026-01-03T08:00:00Z", (3, 2)),
        # Offsets are converted; no offset means UTC; a bare date is its midnight.
        ("from=2026-01-02T02:00:00%2B02:00", (5, 4, 3, 2)),
        ("from=2026-01-02T00:00:00", (5, 4, 3, 2)),
        ("from=2026-01-03", (5, 4)),
        ("model=gpt-b", (4, 3)),
        ("model=nothing", ()),
        ("profile=p1", (1,)),
        (f"apiKeyId={KEY_2}", (4,)),
        ("conversationId=c2", (3,)),
        ("isOverrideKey=true", (4,)),
        ("isOverrideKey=false", (5, 3, 2, 1)),
        ("isCustom=1", (3,)),
        ("isCustom=false", (5, 4, 2, 1)),
        ("status=429", (2,)),
        ("status=error", (4, 2)),
        ("status=success", (5, 3, 1)),
        ("model=gpt-a&status=success", (5, 1)),
        ("model=gpt-a&status=success&limit=1", (5,)),
    ],
)
async def test_filters(both_client: Client, query: str, expected: tuple[int, ...]) -> None:
    seeded = await seed(both_client)
    page = await listed(both_client, seeded, query)
    assert [item["id"] for item in page["items"]] == seeded.expect(*expected)
    if "limit" not in query:
        assert page["total"] == len(expected)


async def test_summary_per_day_in_utc(both_client: Client) -> None:
    seeded = await seed(both_client)
    body = await summary(both_client, seeded, "groupBy=day")
    assert body["groupBy"] == "day"
    assert body["items"] == [
        {
            "key": "2026-01-01",
            "requests": 1,
            "promptTokens": 10,
            "completionTokens": 5,
            "totalTokens": 15,
            "errors": 0,
            "cost": 0.1,
            "costMicros": 100_000,
            "currency": "USD",
            "costEstimated": False,
        },
        {
            "key": "2026-01-02",
            "requests": 2,
            "promptTokens": 100,
            "completionTokens": 50,
            "totalTokens": 150,
            "errors": 1,
            "cost": 0.25,
            "costMicros": 250_000,
            "currency": "USD",
            "costEstimated": True,
        },
        {
            "key": "2026-01-03",
            "requests": 2,
            "promptTokens": 21,
            "completionTokens": 10,
            "totalTokens": 31,
            "errors": 1,
            "cost": 0.0,
            "costMicros": 0,
            "currency": None,
            "costEstimated": False,
        },
    ]
    assert body["totals"] == {
        "requests": 5,
        "promptTokens": 131,
        "completionTokens": 65,
        "totalTokens": 196,
        "errors": 2,
        "cost": 0.35,
        "costMicros": 350_000,
        "currency": "USD",
        "costEstimated": True,
    }
    # groupBy defaults to day.
    assert await summary(both_client, seeded) == body


async def test_summary_per_model_with_filters(both_client: Client) -> None:
    seeded = await seed(both_client)
    body = await summary(both_client, seeded, "groupBy=model")
    assert body["groupBy"] == "model"
    assert [(g["key"], g["requests"], g["totalTokens"], g["errors"]) for g in body["items"]] == [
        ("gpt-a", 3, 45, 1),
        ("gpt-b", 2, 151, 1),
    ]
    filtered = await summary(both_client, seeded, "groupBy=model&from=2026-01-02&isCustom=false")
    assert [(g["key"], g["requests"], g["promptTokens"]) for g in filtered["items"]] == [
        ("gpt-a", 2, 20),
        ("gpt-b", 1, 1),
    ]
    assert filtered["totals"]["requests"] == 3
    empty = await summary(both_client, seeded, "groupBy=day&model=nothing")
    assert empty["items"] == []
    assert empty["totals"] == {
        "requests": 0,
        "promptTokens": 0,
        "completionTokens": 0,
        "totalTokens": 0,
        "errors": 0,
        "cost": 0.0,
        "costMicros": 0,
        "currency": None,
        "costEstimated": False,
    }


@pytest.mark.parametrize(
    ("group_by", "expected"),
    [
        ("profile", [(None, 3, 250_000), ("p1", 1, 100_000), ("p2", 1, 0)]),
        ("backend", [(None, 4, 250_000), ("b1", 1, 100_000)]),
        ("apiKey", [(None, 3, 250_000), (str(KEY_1), 1, 100_000), (str(KEY_2), 1, 0)]),
        ("conversation", [(None, 3, 0), ("c1", 1, 100_000), ("c2", 1, 250_000)]),
    ],
)
async def test_spend_per_profile_backend_api_key_and_conversation(
    both_client: Client, group_by: str, expected: list[tuple[str | None, int, int]]
) -> None:
    seeded = await seed(both_client)
    body = await summary(both_client, seeded, f"groupBy={group_by}")
    assert body["groupBy"] == group_by
    assert [(g["key"], g["requests"], g["costMicros"]) for g in body["items"]] == expected
    for group in body["items"]:
        assert group["currency"] == ("USD" if group["costMicros"] else None)
        assert group["cost"] == group["costMicros"] / 1_000_000
    assert body["totals"]["costMicros"] == 350_000


async def test_day_buckets_ignore_the_session_time_zone(pg_client: Client) -> None:
    seeded = await seed(pg_client)
    async with db_session(settings_of(pg_client)) as session:
        # A connection whose zone is not UTC: 23:30 UTC on Jan 1 is Jan 2 in Tokyo.
        await session.execute(text("SET TIME ZONE 'Asia/Tokyo'"))
        service = UsageRecordService(session=session)
        project_id = uuid.UUID(seeded.tenant.project_id)
        groups, totals = await service.summary(project_id, UsageFilters(), "day")
    assert [(g.key, g.requests) for g in groups] == [
        ("2026-01-01", 1),
        ("2026-01-02", 2),
        ("2026-01-03", 2),
    ]
    assert totals.requests == 5


async def test_members_keys_and_admins_read_usage(both_client: Client) -> None:
    seeded = await seed(both_client)
    tenant = seeded.tenant
    from tests.support.helpers import new_user

    email, member = await new_user(both_client, "member")
    response = await both_client.post(
        f"/api/projects/{tenant.project_id}/members", json={"email": email}, headers=tenant.owner
    )
    assert response.status_code == 201, response.text
    for headers in (member, tenant.key, ADMIN):
        assert (await listed(both_client, seeded, headers=headers))["total"] == 5
        response = await both_client.get(
            f"/api/projects/{tenant.project_id}/usage/summary", headers=headers
        )
        assert response.status_code == 200, response.text
    for path in ("usage", "usage/summary"):
        url = f"/api/projects/{tenant.project_id}/{path}"
        assert_error(
            await both_client.get(url, headers=tenant.runtime), 403, "runtime_token_not_allowed"
        )
        assert_error(await both_client.get(url), 401)


async def test_another_project_is_a_404(both_client: Client) -> None:
    seeded = await seed(both_client)
    stranger = await new_tenant(both_client)
    for path in ("usage", "usage/summary"):
        for headers in (stranger.owner, stranger.key):
            response = await both_client.get(
                f"/api/projects/{seeded.tenant.project_id}/{path}", headers=headers
            )
            assert_error(response, 404, "project_not_found")
        assert_error(
            await both_client.get(f"/api/projects/{MISSING}/{path}", headers=ADMIN),
            404,
            "project_not_found",
        )
    # The stranger's own (empty) usage stays empty of the other project's rows.
    response = await both_client.get(
        f"/api/projects/{stranger.project_id}/usage", headers=stranger.owner
    )
    assert response.json()["total"] == 0


@pytest.mark.parametrize(
    ("path", "query", "param", "code"),
    [
        ("usage", "from=yesterday", "from", "invalid_filter"),
        ("usage", "to=2026-13-01", "to", "invalid_filter"),
        ("usage", "from=2026-01-03&to=2026-01-02", "to", "invalid_range"),
        ("usage", "apiKeyId=nope", "apiKeyId", "invalid_filter"),
        ("usage", "isCustom=maybe", "isCustom", "invalid_filter"),
        ("usage", "isOverrideKey=2", "isOverrideKey", "invalid_filter"),
        ("usage", "status=abc", "status", "invalid_filter"),
        ("usage", "status=99", "status", "invalid_filter"),
        ("usage", "status=600", "status", "invalid_filter"),
        ("usage", "model=", "model", "invalid_filter"),
        ("usage", f"profile={'x' * 201}", "profile", "invalid_filter"),
        ("usage", "modle=gpt-a", "modle", "unknown_parameter"),
        ("usage", "groupBy=day", "groupBy", "unknown_parameter"),
        ("usage", "limit=0", "limit", None),
        ("usage", "limit=501", "limit", None),
        ("usage", "offset=-1", "offset", None),
        ("usage/summary", "groupBy=week", "groupBy", "invalid_filter"),
        ("usage/summary", "groupBy=day&from=nope", "from", "invalid_filter"),
        ("usage/summary", "limit=5", "limit", "unknown_parameter"),
    ],
)
async def test_bad_filters_are_400_naming_the_parameter(
    both_client: Client, path: str, query: str, param: str, code: str | None
) -> None:
    tenant = await new_tenant(both_client)
    response = await both_client.get(
        f"/api/projects/{tenant.project_id}/{path}?{query}", headers=tenant.owner
    )
    error = assert_error(response, 400, code)
    assert error["param"] == param
    assert error["type"] == "invalid_request_error"
