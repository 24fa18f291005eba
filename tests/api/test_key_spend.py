"""Each API key's and runtime token's spend beside its limits: the grouped usage
statement (period boundaries, currencies, tenancy) with a pinned clock, and the
``spend`` object of the Projects API's key and token lists and reads (one usage
statement per page, whatever its size)."""

from __future__ import annotations

import datetime
import uuid
from typing import Any

from sqlalchemy import event

from app.domain.usage.key_spend import NO_SPEND, KeySpend, Spend, key_spend
from tests.support.api import Client, create_api_key, db_session, settings_of
from tests.support.helpers import new_project, new_user
from tests.support.profiles import query_log
from tests.support.spend import insert, moments, usage

SPEND_FIELDS = {
    "period",
    "periodStart",
    "amount",
    "currency",
    "byCurrency",
    "tokens",
    "requests",
    "budget",
    "budgetUsedPercent",
    "today",
}


def utc(text: str) -> datetime.datetime:
    return datetime.datetime.fromisoformat(text).replace(tzinfo=datetime.UTC)


async def _projects(client: Client) -> tuple[dict[str, str], str, str]:
    _, owner = await new_user(client, "spend-owner")
    mine = await new_project(client, owner)
    other = await new_project(client, owner, name="Other")
    return owner, mine["id"], other["id"]


# --------------------------------------------------------------- the statement


async def test_month_and_day_sums_respect_utc_boundaries_currencies_and_tenancy(
    client: Client,
) -> None:
    _, pid, other = await _projects(client)
    a, b, idle = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    await insert(
        settings_of(client),
        [
            # Mid-March: yesterday counts for the month only; February not at all.
            usage(pid, a, utc("2026-03-15T11:59:00"), cost="1.5", tokens=100),
            usage(pid, a, utc("2026-03-15T00:00:00"), cost="0.25", tokens=10),  # day start
            usage(pid, a, utc("2026-03-14T23:59:59"), cost="2", tokens=50),
            usage(pid, a, utc("2026-03-01T00:00:00"), cost="3", tokens=5),  # month start
            usage(pid, a, utc("2026-02-28T23:59:59"), cost="100", tokens=1000),
            usage(pid, a, utc("2026-04-01T00:00:00"), cost="100", tokens=1000),  # next month
            usage(pid, a, utc("2026-03-15T10:00:00"), cost="0.5", currency="EUR", tokens=7),
            usage(pid, a, utc("2026-03-15T10:30:00"), status=429),  # refused: no cost
            # The same credential id under another project is that project's business.
            usage(other, a, utc("2026-03-15T09:00:00"), cost="50", tokens=5000),
            usage(pid, b, utc("2026-03-02T08:00:00"), tokens=40),  # unpriced
        ],
    )
    async with db_session(settings_of(client)) as session:
        spends = await key_spend(
            session, uuid.UUID(pid), [a, b, idle], now=utc("2026-03-15T12:00:00")
        )
    assert spends[a] == KeySpend(
        month=Spend({"USD": 6_750_000, "EUR": 500_000}, tokens=172, requests=6),
        day=Spend({"USD": 1_750_000, "EUR": 500_000}, tokens=117, requests=4),
    )
    assert spends[a].month.currency == "USD"
    assert spends[a].month.amount_micros == 6_750_000
    assert spends[b] == KeySpend(month=Spend({}, tokens=40, requests=1))
    assert spends[b].month.currency is None
    assert spends[idle] == NO_SPEND

    # On the 1st, yesterday is last month: it counts for neither period.
    async with db_session(settings_of(client)) as session:
        first = await key_spend(session, uuid.UUID(pid), [a], now=utc("2026-04-01T00:30:00"))
    assert first[a] == KeySpend(
        month=Spend({"USD": 100_000_000}, tokens=1000, requests=1),
        day=Spend({"USD": 100_000_000}, tokens=1000, requests=1),
    )


async def test_no_credentials_means_no_statement(client: Client) -> None:
    _, pid, _ = await _projects(client)
    seen: list[str] = []

    def record(*args: Any) -> None:
        seen.append(str(args[2]))

    async with db_session(settings_of(client)) as session:
        engine = session.get_bind()
        event.listen(engine, "before_cursor_execute", record)
        try:
            spends = await key_spend(session, uuid.UUID(pid), [], now=utc("2026-03-15T12:00:00"))
        finally:
            event.remove(engine, "before_cursor_execute", record)
    assert spends == {}
    assert seen == []


# ------------------------------------------------------------------- the API


async def _key(client: Client, pid: str, owner: dict[str, str], **fields: Any) -> dict[str, Any]:
    key = await create_api_key(client, pid, owner, name=fields.pop("name", "k"))
    if fields:
        response = await client.patch(
            f"/api/projects/{pid}/api-keys/{key['id']}", json=fields, headers=owner
        )
        assert response.status_code == 200, response.text
    return key


async def test_keys_and_tokens_show_their_spend_against_their_budget(any_client: Client) -> None:
    client = any_client
    owner, pid, _ = await _projects(client)
    monthly = await _key(client, pid, owner, name="monthly", budget="10")
    daily = await _key(client, pid, owner, name="daily", budget="2", budgetPeriod="day")
    idle = await _key(client, pid, owner, name="idle")
    created = await client.post(
        f"/api/projects/{pid}/runtime-tokens", json={"name": "rt", "budget": "1"}, headers=owner
    )
    assert created.status_code == 201, created.text
    token = created.json()
    at = moments(datetime.datetime.now(datetime.UTC))
    await insert(
        settings_of(client),
        [
            usage(pid, monthly["id"], at["today"], cost="1.5", tokens=100),
            usage(pid, monthly["id"], at["today"], cost="0.5", currency="EUR", tokens=10),
            usage(pid, monthly["id"], at["yesterday"], cost="2", tokens=50),
            usage(pid, monthly["id"], at["last_month"], cost="100", tokens=1000),
            usage(pid, daily["id"], at["today"], cost="0.75", tokens=30),
            usage(pid, daily["id"], at["yesterday"], cost="3", tokens=300),
            usage(pid, token["id"], at["today"], cost="0.25", tokens=20),
        ],
    )
    listed = await client.get(f"/api/projects/{pid}/api-keys", headers=owner)
    assert listed.status_code == 200, listed.text
    spends = {item["name"]: item["spend"] for item in listed.json()["items"]}
    assert all(set(s) == SPEND_FIELDS for s in spends.values())

    periods = at["periods"]
    earlier = at["yesterday_in_month"]
    month = spends["monthly"]
    assert month["period"] == "month"
    assert _time(month["periodStart"]) == periods.month_start
    assert month["amount"] == ("3.5" if earlier else "1.5")
    assert month["currency"] == "USD"
    assert month["byCurrency"] == {"EUR": "0.5", "USD": month["amount"]}
    assert (month["tokens"], month["requests"]) == ((160, 3) if earlier else (110, 2))
    assert month["budget"] == "10"
    assert month["budgetUsedPercent"] == (35.0 if earlier else 15.0)
    assert month["today"] == {
        "amount": "1.5",
        "currency": "USD",
        "byCurrency": {"EUR": "0.5", "USD": "1.5"},
        "tokens": 110,
        "requests": 2,
    }

    day = spends["daily"]
    assert (day["period"], _time(day["periodStart"])) == ("day", periods.day_start)
    assert (day["amount"], day["currency"], day["tokens"], day["requests"]) == (
        "0.75",
        "USD",
        30,
        1,
    )
    assert (day["budget"], day["budgetUsedPercent"]) == ("2", 37.5)

    assert spends["idle"] == {
        "period": "month",
        "periodStart": spends["idle"]["periodStart"],
        "amount": "0",
        "currency": None,
        "byCurrency": {},
        "tokens": 0,
        "requests": 0,
        "budget": None,
        "budgetUsedPercent": None,
        "today": {"amount": "0", "currency": None, "byCurrency": {}, "tokens": 0, "requests": 0},
    }

    # A read, and a PATCH's answer, carry the same object.
    read = await client.get(f"/api/projects/{pid}/api-keys/{daily['id']}", headers=owner)
    assert read.json()["spend"] == day
    raised = await client.patch(
        f"/api/projects/{pid}/api-keys/{daily['id']}", json={"budget": "3"}, headers=owner
    )
    assert raised.json()["spend"]["budgetUsedPercent"] == 25.0
    unbudgeted = await client.patch(
        f"/api/projects/{pid}/api-keys/{idle['id']}", json={"rpm": 5}, headers=owner
    )
    assert unbudgeted.json()["spend"]["budget"] is None

    tokens = await client.get(f"/api/projects/{pid}/runtime-tokens", headers=owner)
    [listed_token] = tokens.json()["items"]
    spend = listed_token["spend"]
    assert (spend["amount"], spend["currency"], spend["tokens"], spend["requests"]) == (
        "0.25",
        "USD",
        20,
        1,
    )
    assert (spend["budget"], spend["budgetUsedPercent"]) == ("1", 25.0)
    read_token = await client.get(
        f"/api/projects/{pid}/runtime-tokens/{token['id']}", headers=owner
    )
    assert read_token.json()["spend"] == spend


def _time(text: str) -> datetime.datetime:
    return datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))


async def test_a_zero_budget_is_used_up_by_any_spend(client: Client) -> None:
    owner, pid, _ = await _projects(client)
    key = await _key(client, pid, owner, budget="0")
    listed = await client.get(f"/api/projects/{pid}/api-keys", headers=owner)
    assert listed.json()["items"][0]["spend"]["budgetUsedPercent"] == 0.0
    at = moments(datetime.datetime.now(datetime.UTC))
    await insert(settings_of(client), [usage(pid, key["id"], at["today"], cost="0.000001")])
    listed = await client.get(f"/api/projects/{pid}/api-keys", headers=owner)
    spend = listed.json()["items"][0]["spend"]
    assert (spend["amount"], spend["budgetUsedPercent"]) == ("0.000001", 100.0)


async def test_a_list_reads_spend_in_one_statement_whatever_the_page_size(
    client: Client,
) -> None:
    owner, pid, _ = await _projects(client)
    first = await _key(client, pid, owner, name="first", budget="5")
    at = moments(datetime.datetime.now(datetime.UTC))
    await insert(settings_of(client), [usage(pid, first["id"], at["today"], cost="1")])
    url = f"/api/projects/{pid}/api-keys"

    async def usage_reads() -> int:
        """SELECTs of usage records while the list is served (the log sees every
        connection: background reloads of other tables are not counted)."""
        with query_log(client) as log:
            response = await client.get(url, headers=owner)
        assert response.status_code == 200, response.text
        return len([s for s in log.touching("usage_records") if s.lstrip().startswith("SELECT")])

    assert await usage_reads() == 1
    for n in range(5):
        await _key(client, pid, owner, name=f"more-{n}", budget="1")
    assert await usage_reads() == 1  # six keys: still one statement, not one per key
    with query_log(client) as log:
        tokens = await client.get(f"/api/projects/{pid}/runtime-tokens", headers=owner)
    assert tokens.status_code == 200
    assert tokens.json()["items"] == []
    assert log.touching("usage_records") == []  # nothing to read for an empty page
