"""The price book APIs: ``/api/admin/prices`` (platform) and
``/api/projects/{projectId}/prices`` (a project's own), on PostgreSQL and SQLite.

Rows in force are history (409 on change or delete); future rows can be edited;
amounts are exact decimal strings; bad input is a 400 naming the field."""

from __future__ import annotations

import datetime
import uuid
from typing import Any

import httpx

from app.domain.prices.book import Price, PriceBook
from app.lib.settings import Settings
from tests.support.api import Client, eventually
from tests.support.conversations import ADMIN, ADMIN_TOKEN, MISSING, both_client, new_tenant
from tests.support.helpers import assert_error, new_project, new_user
from tests.support.live_server import live_server
from tests.support.settings import AppFactory, with_settings

__all__ = ["both_client"]

ADMIN_URL = "/api/admin/prices"
FIELDS = {
    "id",
    "model",
    "backend",
    "projectId",
    "input",
    "cachedInput",
    "output",
    "embedding",
    "currency",
    "effectiveFrom",
    "inForce",
    "createdAt",
}


def model_name() -> str:
    return f"price-m-{uuid.uuid4().hex[:8]}"


def in_an_hour() -> str:
    return (datetime.datetime.now(datetime.UTC) + datetime.timedelta(hours=1)).isoformat()


async def create(client: Client, url: str, headers: dict[str, str], **body: Any) -> Any:
    response = await client.post(url, json=body, headers=headers)
    assert response.status_code == 201, response.text
    return response.json()


async def test_admin_creates_lists_gets_edits_and_deletes_a_future_price(
    both_client: Client,
) -> None:
    model = model_name()
    body = await create(
        both_client,
        ADMIN_URL,
        ADMIN,
        model=model,
        input="0.15",
        cachedInput=0.075,
        output=0.6,
        embedding="0.02",
        backend="openai-eu",
        effectiveFrom=in_an_hour(),
    )
    assert set(body) == FIELDS
    assert (body["input"], body["cachedInput"], body["output"], body["embedding"]) == (
        "0.15",
        "0.075",
        "0.6",
        "0.02",
    )
    assert body["currency"] == "USD"
    assert body["projectId"] is None
    assert body["inForce"] is False

    got = await both_client.get(f"{ADMIN_URL}/{body['id']}", headers=ADMIN)
    assert got.status_code == 200
    assert got.json() == body

    listed = await both_client.get(ADMIN_URL, params={"limit": 500}, headers=ADMIN)
    assert listed.status_code == 200
    page = listed.json()
    assert set(page) == {"items", "total", "limit", "offset"}
    assert page["limit"] == 500
    assert page["offset"] == 0
    assert page["total"] >= 1
    assert body["id"] in {item["id"] for item in page["items"]}
    second = await both_client.get(ADMIN_URL, params={"limit": 1, "offset": 0}, headers=ADMIN)
    assert len(second.json()["items"]) == 1

    changed = await both_client.patch(
        f"{ADMIN_URL}/{body['id']}",
        json={"output": "1.25", "cachedInput": None, "currency": "EUR"},
        headers=ADMIN,
    )
    assert changed.status_code == 200, changed.text
    after = changed.json()
    assert (after["input"], after["cachedInput"], after["output"], after["currency"]) == (
        "0.15",
        None,
        "1.25",
        "EUR",
    )

    deleted = await both_client.delete(f"{ADMIN_URL}/{body['id']}", headers=ADMIN)
    assert deleted.status_code == 204
    assert_error(
        await both_client.get(f"{ADMIN_URL}/{body['id']}", headers=ADMIN), 404, "price_not_found"
    )


async def test_a_price_in_force_is_history(both_client: Client) -> None:
    body = await create(both_client, ADMIN_URL, ADMIN, model=model_name(), input=1, output=2)
    assert body["inForce"] is True
    url = f"{ADMIN_URL}/{body['id']}"
    error = assert_error(
        await both_client.patch(url, json={"input": "0.5"}, headers=ADMIN), 409, "price_in_force"
    )
    assert "never rewritten" in error["message"]
    assert_error(await both_client.delete(url, headers=ADMIN), 409, "price_in_force")
    assert (await both_client.get(url, headers=ADMIN)).json()["input"] == "1"


async def test_bad_prices_are_refused_with_the_field_named(both_client: Client) -> None:
    model = model_name()
    cases: list[tuple[dict[str, Any], str | None, str]] = [
        ({"model": model, "input": "-1", "output": 0}, "input", "invalid_amount"),
        ({"model": model, "input": 0, "output": "0.0000001"}, "output", "invalid_amount"),
        ({"model": model, "input": "abc", "output": 0}, "input", "invalid_amount"),
        ({"model": model, "input": "NaN", "output": 0}, "input", "invalid_amount"),
        (
            {"model": model, "input": 0, "output": 0, "embedding": -0.5},
            "embedding",
            "invalid_amount",
        ),
        ({"model": model, "input": 0, "output": 0, "currency": "usd"}, None, ""),
        ({"model": "", "input": 0, "output": 0}, None, ""),
        ({"model": "   ", "input": 0, "output": 0}, "model", "invalid_model"),
        ({"model": model, "input": 0}, None, ""),
        ({"model": model, "input": 0, "output": 0, "colour": "red"}, None, ""),
        (
            {"model": model, "input": 0, "output": 0, "effectiveFrom": "2020-01-01T00:00:00Z"},
            "effectiveFrom",
            "effective_from_in_past",
        ),
    ]
    for payload, param, code in cases:
        response = await both_client.post(ADMIN_URL, json=payload, headers=ADMIN)
        error = assert_error(response, 400, code or None)
        if param is not None:
            assert error["param"] == param, (payload, error)
    listed = await both_client.get(ADMIN_URL, params={"limit": 500}, headers=ADMIN)
    assert model not in {item["model"] for item in listed.json()["items"]}


async def test_a_second_price_for_the_same_moment_is_a_conflict(both_client: Client) -> None:
    model, when = model_name(), in_an_hour()
    await create(both_client, ADMIN_URL, ADMIN, model=model, input=1, output=1, effectiveFrom=when)
    response = await both_client.post(
        ADMIN_URL,
        json={"model": model, "input": 2, "output": 2, "effectiveFrom": when},
        headers=ADMIN,
    )
    assert_error(response, 409, "price_exists")
    # Another backend at the same moment is another price.
    await create(
        both_client,
        ADMIN_URL,
        ADMIN,
        model=model,
        backend="b",
        input=2,
        output=2,
        effectiveFrom=when,
    )


async def test_only_platform_admins_reach_the_admin_price_book(both_client: Client) -> None:
    await new_user(both_client, "first")  # the first account of a database is an admin
    _, user = await new_user(both_client, "plain")
    tenant = await new_tenant(both_client)
    assert_error(await both_client.get(ADMIN_URL, headers=tenant.key), 403)
    assert_error(await both_client.get(ADMIN_URL, headers=user), 403)
    assert_error(
        await both_client.post(
            ADMIN_URL, json={"model": "m", "input": 0, "output": 0}, headers=user
        ),
        403,
    )
    assert_error(await both_client.get(ADMIN_URL), 401)
    assert_error(await both_client.get(f"{ADMIN_URL}/{MISSING}", headers=ADMIN), 404)


async def test_a_projects_own_prices_are_its_owners_and_no_one_elses(both_client: Client) -> None:
    tenant, other = await new_tenant(both_client), await new_tenant(both_client)
    url = f"/api/projects/{tenant.project_id}/prices"
    mine = await create(
        both_client, url, tenant.owner, model="custom:mine", input="3", output="4", currency="GBP"
    )
    assert mine["projectId"] == tenant.project_id
    assert mine["currency"] == "GBP"

    # The project's API key reads them but may not set them (project settings).
    listed = await both_client.get(url, headers=tenant.key)
    assert listed.status_code == 200
    assert [item["id"] for item in listed.json()["items"]] == [mine["id"]]
    assert listed.json()["total"] == 1
    assert_error(
        await both_client.post(
            url, json={"model": "x", "input": 0, "output": 0}, headers=tenant.key
        ),
        403,
        "insufficient_role",
    )
    # Another tenant: the project is not found, nor is the price under its own project.
    assert_error(await both_client.get(url, headers=other.owner), 404)
    other_url = f"/api/projects/{other.project_id}/prices"
    assert_error(
        await both_client.get(f"{other_url}/{mine['id']}", headers=other.owner),
        404,
        "price_not_found",
    )
    assert (await both_client.get(other_url, headers=other.owner)).json()["total"] == 0
    # A project's price is not a platform price, and the other way round.
    assert_error(await both_client.get(f"{ADMIN_URL}/{mine['id']}", headers=ADMIN), 404)
    platform = await create(both_client, ADMIN_URL, ADMIN, model=model_name(), input=1, output=1)
    assert_error(await both_client.get(f"{url}/{platform['id']}", headers=tenant.owner), 404)
    # The owner's own rules are the admin's: history stays, future rows change.
    assert_error(
        await both_client.delete(f"{url}/{mine['id']}", headers=tenant.owner), 409, "price_in_force"
    )
    future = await create(
        both_client,
        url,
        tenant.owner,
        model="custom:mine",
        input=5,
        output=5,
        effectiveFrom=in_an_hour(),
    )
    response = await both_client.delete(f"{url}/{future['id']}", headers=tenant.owner)
    assert response.status_code == 204


async def test_a_price_change_reaches_every_replica_at_once(
    pg_settings: Settings, make_app: AppFactory
) -> None:
    settings = with_settings(pg_settings, admin_token=ADMIN_TOKEN)
    app_a, app_b = make_app(settings), make_app(settings)
    async with (
        live_server(app_a) as url_a,
        live_server(app_b) as url_b,
        httpx.AsyncClient(base_url=url_a) as a,
        httpx.AsyncClient(base_url=url_b) as b,
    ):
        _, owner = await new_user(a, "owner")  # type: ignore[arg-type]
        project = await new_project(a, owner)  # type: ignore[arg-type]
        project_id = uuid.UUID(project["id"])
        book_b: PriceBook = app_b.state.resources.price_book
        model = model_name()

        async def price_on_b(owner_key: uuid.UUID | None, custom: bool) -> Price | None:
            now = datetime.datetime.now(datetime.UTC)
            return await book_b.price_for(model, None, None, None, owner_key, custom, now)

        # B holds "no price" for the platform and for the project, from memory.
        assert await price_on_b(None, False) is None
        assert await price_on_b(project_id, True) is None
        loads = book_b.loads
        assert await price_on_b(None, False) is None
        assert book_b.loads == loads

        created = await a.post(
            ADMIN_URL, json={"model": model, "input": "0.5", "output": 1}, headers=ADMIN
        )
        assert created.status_code == 201, created.text

        async def platform_priced_on_b() -> bool:
            return await price_on_b(None, False) is not None

        await eventually(platform_priced_on_b, within=5.0)
        mine = await b.post(
            f"/api/projects/{project['id']}/prices",
            json={"model": model, "input": 9, "output": 9},
            headers=owner,
        )
        assert mine.status_code == 201, mine.text
        # B wrote it: B forgets its own table at once; A hears of it over the bus.
        priced = await price_on_b(project_id, True)
        assert priced is not None
        assert priced.input_micros == 9_000_000
        book_a: PriceBook = app_a.state.resources.price_book

        async def project_priced_on_a() -> bool:
            now = datetime.datetime.now(datetime.UTC)
            found = await book_a.price_for(model, None, None, None, project_id, True, now)
            return found is not None and found.input_micros == 9_000_000

        await eventually(project_priced_on_a, within=5.0)
