"""Quota API: admin ceilings, owners' lower limits, reads with live consumption.

Most tests run on PostgreSQL + Redis and on SQLite + the memory store. The gate
itself is driven in-process on apps served by ``live_server`` (same event loop as
the test), which is also how a change on one replica is shown to reach another.
"""

from __future__ import annotations

import datetime
from typing import Any
from uuid import UUID

import httpx
import pytest
from litestar import Litestar, get
from litestar.testing import AsyncTestClient
from prometheus_client.parser import text_string_to_metric_families

from app.domain.quotas.gate import QuotaExceededError, QuotaGate, QuotaUnavailableError
from app.lib.settings import Settings
from app.server.errors import exception_handlers
from tests.support.api import Client, eventually, resources_of, set_user_flags, user_with_id
from tests.support.conversations import ADMIN, ADMIN_TOKEN, MISSING, both_client, new_tenant
from tests.support.helpers import assert_error, new_project, new_user
from tests.support.live_server import live_server
from tests.support.settings import AppFactory, with_settings

__all__ = ["both_client"]

NO_LIMITS = {
    "perMinute": None,
    "perDay": None,
    "perMonth": None,
    "tokensPerMinute": None,
    "tokensPerDay": None,
    "tokensPerMonth": None,
    "budgetPerDay": None,
    "budgetPerMonth": None,
}


def quota_url(project_id: str) -> str:
    return f"/api/projects/{project_id}/quota"


def admin_url(project_id: str) -> str:
    return f"/api/admin/projects/{project_id}/quota"


async def get_quota(client: Client | httpx.AsyncClient, project_id: str, headers: Any) -> Any:
    response = await client.get(quota_url(project_id), headers=headers)
    assert response.status_code == 200, response.text
    return response.json()


async def admin_put(client: Client | httpx.AsyncClient, project_id: str, **body: Any) -> Any:
    response = await client.put(admin_url(project_id), json=body, headers=ADMIN)
    assert response.status_code == 200, response.text
    return response.json()


async def add_member(client: Client, project_id: str, owner: dict[str, str]) -> dict[str, str]:
    email, headers = await new_user(client, "member")
    response = await client.post(
        f"/api/projects/{project_id}/members", json={"email": email}, headers=owner
    )
    assert response.status_code == 201, response.text
    return headers


def refusals(metrics: str, **labels: str) -> float | None:
    """The value of ``arona_quota_refusals_total`` with exactly ``labels``."""
    for family in text_string_to_metric_families(metrics):
        for sample in family.samples:
            if sample.name == "arona_quota_refusals_total" and sample.labels == labels:
                return float(sample.value)
    return None


def parse_time(value: str) -> datetime.datetime:
    return datetime.datetime.fromisoformat(value.replace("Z", "+00:00"))


async def test_a_new_project_has_no_limits(both_client: Client) -> None:
    tenant = await new_tenant(both_client)
    # The windows are reckoned at some instant between these two.
    before = datetime.datetime.now(datetime.UTC)
    body = await get_quota(both_client, tenant.project_id, tenant.owner)
    after = datetime.datetime.now(datetime.UTC)
    assert set(body) == {"limits", "adminLimits", "ownerLimits", "failClosed", "currency", "usage"}
    assert body["limits"] == body["adminLimits"] == body["ownerLimits"] == NO_LIMITS
    assert body["failClosed"] is False
    assert body["currency"] == "USD"
    assert set(body["usage"]) == {"minute", "day", "month", "tokens", "spend"}
    requests = {name: body["usage"][name] for name in ("minute", "day", "month")}
    resets = {name: parse_time(w["resetsAt"]) for name, w in requests.items()}
    for window in requests.values():
        assert set(window) == {"used", "limit", "resetsAt"}
        assert window["used"] == 0
        assert window["limit"] is None
    # Without a token limit or a budget, tokens and spend are not counted.
    for section in (body["usage"]["tokens"], body["usage"]["spend"]):
        for name, window in section.items():
            assert window == {"used": None, "limit": None, "resetsAt": requests[name]["resetsAt"]}
    assert before < resets["minute"] <= after + datetime.timedelta(seconds=60)
    assert resets["minute"].second == 0
    assert (resets["day"].hour, resets["day"].minute) == (0, 0)
    assert before < resets["day"] <= after + datetime.timedelta(days=1)
    assert resets["month"].day == 1
    assert resets["month"] >= resets["day"]


async def test_admin_sets_ceilings_every_reader_sees_them(both_client: Client) -> None:
    tenant = await new_tenant(both_client)
    member = await add_member(both_client, tenant.project_id, tenant.owner)
    body = await admin_put(
        both_client, tenant.project_id, perMinute=10, perDay=1000, perMonth=None, failClosed=True
    )
    expected = {**NO_LIMITS, "perMinute": 10, "perDay": 1000, "perMonth": None}
    assert body["limits"] == body["adminLimits"] == expected
    assert body["ownerLimits"] == NO_LIMITS
    assert body["failClosed"] is True
    assert body["usage"]["minute"]["limit"] == 10
    assert body["usage"]["month"]["limit"] is None

    _, admin_user, admin_id = await user_with_id(both_client, "admin")
    await set_user_flags(resources_of(both_client).settings, admin_id, is_admin=True)
    for headers in (tenant.owner, member, tenant.key, ADMIN, admin_user):
        seen = await get_quota(both_client, tenant.project_id, headers)
        assert seen["limits"] == expected
        assert seen["failClosed"] is True

    # An admin user (not only the operator token) may set ceilings.
    response = await both_client.put(
        admin_url(tenant.project_id), json={"perDay": 5}, headers=admin_user
    )
    assert response.status_code == 200, response.text
    # A PUT replaces the ceilings: absent windows are unlimited; failClosed is kept.
    assert response.json()["adminLimits"] == {
        **NO_LIMITS,
        "perMinute": None,
        "perDay": 5,
        "perMonth": None,
    }
    assert response.json()["failClosed"] is True


async def test_owner_lowers_limits_the_lower_one_applies(both_client: Client) -> None:
    tenant = await new_tenant(both_client)
    await admin_put(both_client, tenant.project_id, perMinute=60, perDay=1000)
    response = await both_client.put(
        quota_url(tenant.project_id),
        json={"perMinute": 10, "perDay": 1000, "perMonth": 20000},
        headers=tenant.owner,
    )
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["ownerLimits"] == {**NO_LIMITS, "perMinute": 10, "perDay": 1000, "perMonth": 20000}
    assert body["adminLimits"] == {**NO_LIMITS, "perMinute": 60, "perDay": 1000, "perMonth": None}
    # No admin ceiling on the month: the owner's own limit applies alone.
    assert body["limits"] == {**NO_LIMITS, "perMinute": 10, "perDay": 1000, "perMonth": 20000}

    # The admin lowering the ceiling below the owner's limit wins without an error.
    body = await admin_put(both_client, tenant.project_id, perMinute=5, perDay=1000)
    assert body["limits"] == {**NO_LIMITS, "perMinute": 5, "perDay": 1000, "perMonth": 20000}
    assert body["ownerLimits"]["perMinute"] == 10

    # Owner nulls: the admin ceilings alone.
    response = await both_client.put(quota_url(tenant.project_id), json={}, headers=tenant.owner)
    assert response.status_code == 200, response.text
    assert response.json()["limits"] == {
        **NO_LIMITS,
        "perMinute": 5,
        "perDay": 1000,
        "perMonth": None,
    }

    # The owner may also limit a project the admin never limited.
    other = await new_tenant(both_client)
    response = await both_client.put(
        quota_url(other.project_id), json={"perDay": 0}, headers=other.owner
    )
    assert response.status_code == 200, response.text
    assert response.json()["limits"] == {
        **NO_LIMITS,
        "perMinute": None,
        "perDay": 0,
        "perMonth": None,
    }
    assert response.json()["adminLimits"] == NO_LIMITS


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"perMinute": 61}, "perMinute"),
        ({"perDay": 1001}, "perDay"),
        ({"perMinute": 60, "perMonth": 2**31 - 1, "perDay": 5000}, "perDay"),
    ],
)
async def test_owner_cannot_go_above_the_admin_ceiling(
    both_client: Client, body: dict[str, Any], param: str
) -> None:
    tenant = await new_tenant(both_client)
    await admin_put(both_client, tenant.project_id, perMinute=60, perDay=1000)
    response = await both_client.put(quota_url(tenant.project_id), json=body, headers=tenant.owner)
    error = assert_error(response, 400, "above_admin_limit")
    assert error["param"] == param
    # Nothing was stored.
    assert (await get_quota(both_client, tenant.project_id, tenant.owner))[
        "ownerLimits"
    ] == NO_LIMITS
    # Equal to the ceiling is allowed.
    response = await both_client.put(
        quota_url(tenant.project_id), json={"perMinute": 60}, headers=tenant.owner
    )
    assert response.status_code == 200, response.text


async def test_fail_closed_is_optional_and_kept(both_client: Client) -> None:
    tenant = await new_tenant(both_client)
    assert (await admin_put(both_client, tenant.project_id, perDay=5))["failClosed"] is False
    assert (await admin_put(both_client, tenant.project_id, failClosed=True))["failClosed"]
    body = await admin_put(both_client, tenant.project_id, perDay=7)
    assert body["failClosed"] is True
    assert body["limits"]["perDay"] == 7
    body = await admin_put(both_client, tenant.project_id, perDay=7, failClosed=False)
    assert body["failClosed"] is False


async def test_who_may_do_what(both_client: Client) -> None:
    tenant = await new_tenant(both_client)
    member = await add_member(both_client, tenant.project_id, tenant.owner)
    owner_body = {"perDay": 5}
    for headers in (member, tenant.key):
        response = await both_client.put(
            quota_url(tenant.project_id), json=owner_body, headers=headers
        )
        assert_error(response, 403, "insufficient_role")
    assert_error(
        await both_client.get(quota_url(tenant.project_id), headers=tenant.runtime),
        403,
        "runtime_token_not_allowed",
    )
    assert_error(await both_client.get(quota_url(tenant.project_id)), 401)
    # Owners, members and API keys are not platform admins.
    for headers in (tenant.owner, member, tenant.key, tenant.runtime):
        response = await both_client.put(
            admin_url(tenant.project_id), json={"perDay": 1}, headers=headers
        )
        assert_error(response, 403)
    assert_error(await both_client.put(admin_url(tenant.project_id), json={"perDay": 1}), 401)
    # A platform admin may set the owner's limits too.
    response = await both_client.put(quota_url(tenant.project_id), json=owner_body, headers=ADMIN)
    assert response.status_code == 200, response.text
    assert response.json()["ownerLimits"]["perDay"] == 5


async def test_another_project_is_a_404(both_client: Client) -> None:
    mine, theirs = await new_tenant(both_client), await new_tenant(both_client)
    for headers in (theirs.owner, theirs.key):
        assert_error(
            await both_client.get(quota_url(mine.project_id), headers=headers),
            404,
            "project_not_found",
        )
        assert_error(
            await both_client.put(quota_url(mine.project_id), json={"perDay": 1}, headers=headers),
            404,
            "project_not_found",
        )
    assert_error(
        await both_client.put(admin_url(MISSING), json={"perDay": 1}, headers=ADMIN),
        404,
        "project_not_found",
    )
    assert_error(await both_client.get(quota_url(MISSING), headers=ADMIN), 404)
    assert_error(
        await both_client.put(admin_url("not-a-uuid"), json={"perDay": 1}, headers=ADMIN), 404
    )
    # Nothing leaked into the project the others probed.
    assert (await get_quota(both_client, mine.project_id, mine.owner))["limits"] == NO_LIMITS


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"perMinute": -1}, "perMinute"),
        ({"perDay": "ten"}, "perDay"),
        ({"perMonth": 1.5}, "perMonth"),
        ({"perDay": True}, "perDay"),
        ({"perDay": 2**31}, "perDay"),
        ({"perHour": 5}, "perHour"),
        ({"failClosed": "yes"}, "failClosed"),
    ],
)
async def test_bad_admin_bodies_are_400(
    both_client: Client, body: dict[str, Any], param: str
) -> None:
    tenant = await new_tenant(both_client)
    response = await both_client.put(admin_url(tenant.project_id), json=body, headers=ADMIN)
    assert assert_error(response, 400)["param"] == param


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"perMinute": -5}, "perMinute"),
        ({"perDay": "x"}, "perDay"),
        # Only the platform admin chooses what happens when the quota cannot be checked.
        ({"failClosed": True}, "failClosed"),
    ],
)
async def test_bad_owner_bodies_are_400(
    both_client: Client, body: dict[str, Any], param: str
) -> None:
    tenant = await new_tenant(both_client)
    response = await both_client.put(quota_url(tenant.project_id), json=body, headers=tenant.owner)
    assert assert_error(response, 400)["param"] == param
    for raw in (b"[]", b"{not json"):
        response = await both_client.put(
            quota_url(tenant.project_id),
            content=raw,
            headers={**tenant.owner, "content-type": "application/json"},
        )
        assert_error(response, 400)


# ------------------------------------------------------------- the gate, live


async def _refused(gate: QuotaGate, project_id: UUID) -> bool:
    try:
        await gate.check(project_id)
    except QuotaExceededError:
        return True
    return False


async def test_changes_reach_every_replica_at_once(
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
        project_id = UUID(project["id"])
        gate_b: QuotaGate = app_b.state.resources.quota_gate
        await gate_b.check(project_id)  # caches "no limits" on B
        loads = gate_b.limits.loads
        for _ in range(5):
            await gate_b.check(project_id)
        assert gate_b.limits.loads == loads  # served from memory

        await admin_put(a, project["id"], perMinute=100, perDay=3)

        async def limited_on_b() -> bool:
            return (await gate_b.limits.get(project_id)).per_day == 3

        await eventually(limited_on_b, within=5.0)
        results = [await _refused(gate_b, project_id) for _ in range(5)]
        assert results == [False, False, False, True, True]
        # A's view of the consumption is B's: one Redis for every replica.
        usage = (await get_quota(a, project["id"], owner))["usage"]
        assert usage["day"] == {**usage["day"], "used": 3, "limit": 3}
        assert usage["minute"]["limit"] == 100

        # The owner lowering to zero on B is seen by A's gate too.
        gate_a: QuotaGate = app_a.state.resources.quota_gate
        response = await b.put(quota_url(project["id"]), json={"perDay": 0}, headers=owner)
        assert response.status_code == 200, response.text

        async def closed_on_a() -> bool:
            return await _refused(gate_a, project_id)

        await eventually(closed_on_a, within=5.0)


async def test_usage_shows_admitted_requests_on_the_memory_store(
    sqlite_settings: Settings, make_app: AppFactory
) -> None:
    app = make_app(with_settings(sqlite_settings, admin_token=ADMIN_TOKEN))
    async with live_server(app) as url, httpx.AsyncClient(base_url=url) as client:
        _, owner = await new_user(client, "owner")  # type: ignore[arg-type]
        project = await new_project(client, owner)  # type: ignore[arg-type]
        await admin_put(client, project["id"], perMinute=100, perDay=4)
        gate: QuotaGate = app.state.resources.quota_gate
        project_id = UUID(project["id"])
        results = [await _refused(gate, project_id) for _ in range(6)]
        assert results == [False] * 4 + [True] * 2
        usage = (await get_quota(client, project["id"], owner))["usage"]
        assert usage["day"] == {**usage["day"], "used": 4, "limit": 4}
        assert usage["month"] == {**usage["month"], "used": 4, "limit": None}

        metrics = (await client.get("/metrics")).text
        # Compared as labels, not text: the exposition's label order is the
        # client library's choice (0.26 sorts them).
        assert refusals(metrics, window="day", metric="requests", scope="project") == 2.0


async def test_gate_errors_render_in_the_api_shape() -> None:
    """What the gateway's handlers will send: the 429 and the 503 in the error shape."""

    @get("/quota-refused")
    async def refused() -> None:
        raise QuotaExceededError("full", window="day", limit=5, retry_after=12.2)

    @get("/rate-refused")
    async def rate_refused() -> None:
        raise QuotaExceededError("full", window="minute", limit=5, retry_after=0.01)

    @get("/quota-unavailable")
    async def unavailable() -> None:
        raise QuotaUnavailableError("down", headers={"Retry-After": "5"})

    app = Litestar([refused, rate_refused, unavailable], exception_handlers=exception_handlers())
    async with AsyncTestClient(app=app) as client:
        response = await client.get("/quota-refused")
        error = assert_error(response, 429, "quota_exceeded")
        assert error["type"] == "rate_limit_error"
        assert response.headers["retry-after"] == "13"
        response = await client.get("/rate-refused")
        assert_error(response, 429, "rate_limit_exceeded")
        assert response.headers["retry-after"] == "1"
        response = await client.get("/quota-unavailable")
        assert_error(response, 503, "quota_unavailable")
        assert response.headers["retry-after"] == "5"
