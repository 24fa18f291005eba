"""The Keys tab's governance over HTTP: each key's and token's limits, labels and
expiry are shown, and the owner edits them (every field checked at once, errors
beside their fields) without rotating the key; a member only reads."""

from __future__ import annotations

import datetime
import re
from typing import Any

from litestar.testing import AsyncTestClient

from app.lib.settings import Settings
from tests.support.api import create_api_key, create_runtime_token
from tests.support.helpers import bearer, console_login, new_project, new_user
from tests.support.profiles import query_log
from tests.support.settings import AppFactory
from tests.support.spend import insert, moments, usage

CSRF = re.compile(r'"X-CSRF-Token": "([^"]+)"')


async def _console(client: Any, email: str) -> str:
    """Sign ``client`` into the console; its CSRF token for HTMX posts."""
    assert (await console_login(client, email)).status_code == 303
    page = await client.get("/projects")
    found = CSRF.search(page.text)
    assert found, page.text
    return found.group(1)


async def test_the_keys_tab_shows_and_edits_a_keys_limits(
    pg_settings: Settings, make_app: AppFactory
) -> None:
    async with AsyncTestClient(app=make_app(pg_settings)) as client:
        email, headers = await new_user(client, "keys-owner")
        project = await new_project(client, headers)
        pid = project["id"]
        key = await create_api_key(client, pid, headers, name="ci")
        shaped = await client.patch(
            f"/api/projects/{pid}/api-keys/{key['id']}",
            json={"allowedModels": ["gpt-*"], "rpm": 30, "labels": {"team": "search"}},
            headers=headers,
        )
        assert shaped.status_code == 200, shaped.text
        token = await create_runtime_token(client, pid, headers)
        csrf = await _console(client, email)
        htmx = {"HX-Request": "true", "X-CSRF-Token": csrf}
        base = f"/projects/{pid}"

        tab = await client.get(f"{base}/tabs/keys", headers={"HX-Request": "true"})
        assert tab.status_code == 200, tab.text
        assert "models: gpt-*" in tab.text
        assert "30 req/min" in tab.text
        assert "team=search" in tab.text
        assert f"{base}/api-keys/{key['id']}/edit" in tab.text
        assert f"{base}/runtime-tokens/{token['id']}/edit" in tab.text

        # Every invalid field is reported at once, each beside its own field.
        form = {
            "allowedModels": "gpt-*, bad*pattern",
            "rpm": "-1",
            "tpm": "many",
            "budget": "12.5",
            "budgetPeriod": "day",
            "expiresAt": "2020-01-01T00:00",
            "labels": "team",
        }
        refused = await client.post(f"{base}/api-keys/{key['id']}/edit", data=form, headers=htmx)
        assert refused.status_code == 422, refused.text
        edit = f"edit-{key['id']}"
        for field in ("models", "rpm", "tpm", "expires", "labels"):
            assert f'id="{edit}-{field}-error"' in refused.text, field
        assert f'id="{edit}-budget-error"' not in refused.text
        assert 'value="gpt-*, bad*pattern"' in refused.text  # what was typed is kept
        assert '<details class="key-edit" open>' in refused.text
        unchanged = await client.get(f"/api/projects/{pid}/api-keys/{key['id']}", headers=headers)
        assert unchanged.json()["rpm"] == 30  # nothing written

        form.update(
            allowedModels="gpt-4o, claude-*",
            rpm="",
            tpm="9000",
            expiresAt="2099-01-31T12:00",
            labels="team=ads, env=prod",
        )
        saved = await client.post(f"{base}/api-keys/{key['id']}/edit", data=form, headers=htmx)
        assert saved.status_code == 200, saved.text
        assert "API key updated." in saved.headers.get("HX-Trigger", "") + saved.text
        stored = (
            await client.get(f"/api/projects/{pid}/api-keys/{key['id']}", headers=headers)
        ).json()
        assert stored["allowedModels"] == ["gpt-4o", "claude-*"]
        assert stored["rpm"] is None  # an emptied field clears its limit
        assert (stored["tpm"], stored["budget"], stored["budgetPeriod"]) == (9000, "12.5", "day")
        assert stored["expiresAt"].startswith("2099-01-31T12:00")
        assert stored["labels"] == {"team": "ads", "env": "prod"}
        assert "models: gpt-4o, claude-*" in saved.text
        # Not rotated: the same secret still works.
        assert (
            await client.get(f"/api/projects/{pid}", headers=bearer(key["key"]))
        ).status_code == 200

        # A runtime token's expiry can only move earlier: said beside the field.
        later = await client.post(
            f"{base}/runtime-tokens/{token['id']}/edit",
            data={**form, "expiresAt": "2999-01-01T00:00"},
            headers=htmx,
        )
        assert later.status_code == 422, later.text
        assert f'id="edit-{token["id"]}-expires-error"' in later.text


async def test_a_member_sees_limits_but_no_edit_form(
    pg_settings: Settings, make_app: AppFactory
) -> None:
    async with AsyncTestClient(app=make_app(pg_settings)) as client:
        _, owner = await new_user(client, "keys-owner2")
        project = await new_project(client, owner)
        pid = project["id"]
        key = await create_api_key(client, pid, owner, name="ci")
        await client.patch(
            f"/api/projects/{pid}/api-keys/{key['id']}", json={"rpm": 4}, headers=owner
        )
        member_email, _ = await new_user(client, "keys-member")
        added = await client.post(
            f"/api/projects/{pid}/members", json={"email": member_email}, headers=owner
        )
        assert added.status_code == 201, added.text
        csrf = await _console(client, member_email)
        tab = await client.get(f"/projects/{pid}/tabs/keys", headers={"HX-Request": "true"})
        assert "4 req/min" in tab.text
        assert "/edit" not in tab.text
        denied = await client.post(
            f"/projects/{pid}/api-keys/{key['id']}/edit",
            data={"rpm": "1000"},
            headers={"HX-Request": "true", "X-CSRF-Token": csrf},
        )
        assert denied.status_code == 403
        stored = await client.get(f"/api/projects/{pid}/api-keys/{key['id']}", headers=owner)
        assert stored.json()["rpm"] == 4


async def test_the_keys_tab_shows_each_keys_spend_against_its_budget(
    pg_settings: Settings, make_app: AppFactory
) -> None:
    async with AsyncTestClient(app=make_app(pg_settings)) as client:
        email, headers = await new_user(client, "keys-spend")
        pid = (await new_project(client, headers))["id"]
        budgeted = await create_api_key(client, pid, headers, name="budgeted")
        await client.patch(
            f"/api/projects/{pid}/api-keys/{budgeted['id']}", json={"budget": "10"}, headers=headers
        )
        idle = await create_api_key(client, pid, headers, name="idle")
        daily = await create_runtime_token(
            client, pid, headers, name="agent", budget="2", budgetPeriod="day"
        )
        at = moments(datetime.datetime.now(datetime.UTC))
        await insert(
            pg_settings,
            [
                usage(pid, budgeted["id"], at["today"], cost="1.2", tokens=1200),
                usage(pid, budgeted["id"], at["yesterday"], cost="2", tokens=800),
                usage(pid, budgeted["id"], at["last_month"], cost="50", tokens=5),
                usage(pid, budgeted["id"], at["today"], cost="0.5", currency="EUR", tokens=1),
                usage(pid, daily["id"], at["today"], cost="2.5", tokens=99),
                usage(pid, idle["id"], at["last_month"], cost="9", tokens=9),
            ],
        )
        await _console(client, email)
        with query_log(client) as log:
            tab = await client.get(f"/projects/{pid}/tabs/keys", headers={"HX-Request": "true"})
        assert tab.status_code == 200, tab.text
        reads = [s for s in log.touching("usage_records") if s.lstrip().startswith("SELECT")]
        assert len(reads) == 1  # one statement for the keys and the tokens alike

        month = "$3.20" if at["yesterday_in_month"] else "$1.20"
        assert f"{month} of $10.00 this month" in tab.text
        assert 'max="10000000" low="7500000" high="9000000"' in tab.text
        requests = 3 if at["yesterday_in_month"] else 2
        assert f"{requests} requests" in tab.text
        assert "also €0.50" in tab.text
        assert "today $1.20" in tab.text
        assert "No usage this month" in tab.text  # last month's spend is not this month's
        # The token's daily budget is past: said in words, the meter full.
        assert "$2.50 of $2.00 today (over budget)" in tab.text
        assert 'value="2000000" title="125% of the budget used today"' in tab.text
        assert "style=" not in tab.text  # the strict CSP allows no inline style
