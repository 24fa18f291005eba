"""Usage as CSV: a project's records and its spend summary, exact costs, the same
filters as the JSON API, formula-looking cells neutralised, tenancy kept."""

from __future__ import annotations

import csv
import io
import uuid

from app.domain.usage.entry import UsageEntry
from tests.api.test_usage_api import KEY_1, seed, utc, write
from tests.support.api import Client
from tests.support.conversations import both_client, new_tenant
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
