"""Usage as CSV: a project's records and its spend summary, exact costs, the same
filters as the JSON API, formula-looking cells neutralised, tenancy kept."""

from __future__ import annotations

import csv
import datetime
import io
import random
import uuid

from app.domain.usage.entry import UsageEntry
from tests.api.test_usage_api import KEY_1, seed, utc, write
from tests.support.api import Client
from tests.support.conversations import ADMIN, both_client, new_tenant
from tests.support.helpers import assert_error

__all__ = ["both_client"]


def rows_of(body: bytes) -> list[dict[str, str]]:
    return list(csv.DictReader(io.StringIO(body.decode())))


async def test_records_export_as_csv_with_exact_costs(both_client: Client) -> None:
    seeded = await seed(both_client)
    url = f"/api/projects/{seeded.tenant.project_id}/usage.csv"
    response = await both_client.get(url, headers=seeded.tenant.owner)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/csv")
    assert 'filename="usage.csv"' in response.headers["content-disposition"]
    rows = rows_of(response.content)
    assert [r["id"] for r in rows] == seeded.expect(5, 4, 3, 2, 1)
    oldest = rows[-1]
    assert oldest["modelRequested"] == "gpt-a"
    assert oldest["apiKeyId"] == str(KEY_1)
    assert (oldest["cost"], oldest["currency"], oldest["costEstimated"]) == ("0.1", "USD", "false")
    assert (oldest["promptTokens"], oldest["streamed"], oldest["backend"]) == ("10", "true", "b1")
    assert rows[0]["cost"] == ""  # unpriced
    estimated = rows[2]
    assert (estimated["cost"], estimated["costEstimated"]) == ("0.25", "true")

    # The JSON API's filters, and its 400s in the one error shape.
    filtered = await both_client.get(f"{url}?model=gpt-b", headers=seeded.tenant.owner)
    assert [r["id"] for r in rows_of(filtered.content)] == seeded.expect(4, 3)
    assert_error(await both_client.get(f"{url}?from=nope", headers=seeded.tenant.owner), 400)
    assert_error(await both_client.get(f"{url}?limit=5", headers=seeded.tenant.owner), 400)
    # Another tenant sees no such project.
    other = await new_tenant(both_client)
    assert_error(await both_client.get(url, headers=other.owner), 404)


async def test_spend_summary_exports_as_csv_with_a_total_line(both_client: Client) -> None:
    seeded = await seed(both_client)
    url = f"/api/projects/{seeded.tenant.project_id}/usage/summary.csv?groupBy=backend"
    response = await both_client.get(url, headers=seeded.tenant.key)
    assert response.status_code == 200, response.text
    assert 'filename="usage-by-backend.csv"' in response.headers["content-disposition"]
    rows = rows_of(response.content)
    assert [(r["key"], r["requests"], r["cost"], r["currency"]) for r in rows] == [
        ("", "4", "0.25", "USD"),
        ("b1", "1", "0.1", "USD"),
        ("(total)", "5", "0.35", "USD"),
    ]
    assert rows[-1]["costEstimated"] == "true"
    bad = await both_client.get(
        f"/api/projects/{seeded.tenant.project_id}/usage/summary.csv?groupBy=week",
        headers=seeded.tenant.key,
    )
    assert assert_error(bad, 400, "invalid_filter")["param"] == "groupBy"


async def test_cells_a_spreadsheet_would_run_are_neutralised(both_client: Client) -> None:
    tenant = await new_tenant(both_client)
    await write(
        both_client,
        [
            UsageEntry(
                project_id=uuid.UUID(tenant.project_id),
                model_requested='=HYPERLINK("http://evil")',
                conversation_id="@sum(A1)",
                endpoint="chat",
                status=200,
                created_at=utc("2026-02-01T00:00:00"),
            )
        ],
    )
    url = f"/api/projects/{tenant.project_id}/usage.csv"
    [row] = rows_of((await both_client.get(url, headers=tenant.owner)).content)
    assert row["modelRequested"] == '\'=HYPERLINK("http://evil")'
    assert row["conversationId"] == "'@sum(A1)"


async def test_admins_see_spend_per_project_over_the_platform(both_client: Client) -> None:
    first, second = await new_tenant(both_client), await new_tenant(both_client)
    # A day of its own, far from other tests' records.
    day = datetime.date(2031, 1, 1) + datetime.timedelta(days=random.randrange(3000))
    at = datetime.datetime.combine(day, datetime.time(12), tzinfo=datetime.UTC)

    def spent(project: str | None, micros: int | None) -> UsageEntry:
        return UsageEntry(
            project_id=None if project is None else uuid.UUID(project),
            model_requested="m",
            endpoint="chat",
            status=200,
            total_tokens=10,
            cost_micros=micros,
            cost=None if micros is None else micros / 1_000_000,
            currency=None if micros is None else "USD",
            created_at=at,
        )

    await write(
        both_client,
        [
            spent(first.project_id, 100),
            spent(second.project_id, 2_500_000),
            spent(second.project_id, 500_000),
            spent(None, None),
        ],
    )
    window = {"from": day.isoformat(), "to": (day + datetime.timedelta(days=1)).isoformat()}
    response = await both_client.get("/api/admin/usage/projects", params=window, headers=ADMIN)
    assert response.status_code == 200, response.text
    page = response.json()
    assert (page["total"], page["limit"], page["offset"]) == (3, 50, 0)
    assert [
        (p["projectId"], p["requests"], p["costMicros"], p["currency"]) for p in page["items"]
    ] == [
        (second.project_id, 2, 3_000_000, "USD"),
        (first.project_id, 1, 100, "USD"),
        (None, 1, 0, None),
    ]
    assert page["items"][0]["projectName"]
    assert page["items"][2]["projectName"] is None
    one = await both_client.get(
        "/api/admin/usage/projects", params={**window, "limit": 1, "offset": 1}, headers=ADMIN
    )
    assert [p["projectId"] for p in one.json()["items"]] == [first.project_id]
    assert one.json()["total"] == 3

    assert_error(await both_client.get("/api/admin/usage/projects", headers=first.key), 403)
    bad = await both_client.get(
        "/api/admin/usage/projects", params={"from": "yesterday"}, headers=ADMIN
    )
    assert assert_error(bad, 400, "invalid_filter")["param"] == "from"
