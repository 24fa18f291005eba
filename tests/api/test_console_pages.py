"""The console's project tabs over HTTP: every tab and write for the owner, members
and other tenants, CSRF, validation errors next to their fields, and secret values
that never come back in any answer.

One live app (uvicorn on a loopback port) for the module; each user is an
``httpx.AsyncClient`` with its own cookie jar, signed in through the login form.
"""

from __future__ import annotations

import contextlib
import datetime
import html
import re
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest

from app.domain.console.charts import bar_chart, column_chart, nice_ceiling
from app.domain.usage.entry import UsageEntry
from app.domain.usage.writer import UsageWriter
from app.domain.web.charts import compact_number
from app.fakes.openai_upstream import FakeOpenAI
from app.fakes.serve import serve_asgi
from app.lib.passwords import PasswordHasher
from app.server.app import create_app
from app.server.resources import Resources
from tests.support.helpers import PASSWORD, bearer, console_login, unique_email
from tests.support.live_server import live_server
from tests.support.settings import REDIS_URL, base_settings

ADMIN_TOKEN = "admin-" + "d" * 40
TABS = (
    "overview",
    "custom-llms",
    "secrets",
    "overrides",
    "quota",
    "keys",
    "models",
    "conversations",
    "webhooks",
)
CSRF = re.compile(r'"X-CSRF-Token": "([^"]+)"')
SECRET_VALUE = "sv-" + "q" * 20 + "tail"
LLM_KEY = "sk-llm-" + "z" * 20 + "K3Y9"
OVERRIDE_KEY = "ok-" + "w" * 20 + "0VR1"


@dataclass
class Site:
    url: str
    resources: Resources
    answers: list[str] = field(default_factory=list)
    """Every page body seen, to check no secret value ever came back."""


@dataclass
class User:
    site: Site
    http: httpx.AsyncClient
    email: str
    api: dict[str, str]
    csrf: str = ""
    user_id: str = ""

    async def get(self, path: str, *, htmx: bool = True, **params: Any) -> httpx.Response:
        headers = {"HX-Request": "true"} if htmx else {}
        response = await self.http.get(path, headers=headers, params=params)
        self.site.answers.append(response.text)
        return response

    async def post(
        self, path: str, data: dict[str, Any] | None = None, *, htmx: bool = True, csrf: bool = True
    ) -> httpx.Response:
        headers = {"HX-Request": "true"} if htmx else {}
        if csrf:
            headers["X-CSRF-Token"] = self.csrf
        response = await self.http.post(path, data=data or {}, headers=headers)
        self.site.answers.append(response.text)
        return response


@pytest.fixture(scope="module")
async def site(pg_database: str, fast_hasher: PasswordHasher) -> AsyncIterator[Site]:
    settings = base_settings(
        database_url=pg_database,
        redis_url=REDIS_URL,
        redis_prefix=f"test:{uuid.uuid4().hex}:",
        db_pool_size=5,
        login_max_attempts=100_000,
        custom_llm_allow_private=True,
        admin_token=ADMIN_TOKEN,
    )
    app = create_app(settings, password_hasher=fast_hasher)
    async with live_server(app) as url:
        yield Site(url=url, resources=app.state.resources)


@pytest.fixture
async def fake() -> AsyncIterator[str]:
    async with serve_asgi(FakeOpenAI("console-fake", models=["my-model"])) as url:
        yield url


async def sign_in(site: Site, stack: contextlib.AsyncExitStack, tag: str) -> User:
    http = await stack.enter_async_context(httpx.AsyncClient(base_url=site.url, timeout=30))
    email = unique_email(tag)
    registered = await http.post("/api/auth/register", json={"email": email, "password": PASSWORD})
    assert registered.status_code == 201, registered.text
    tokens = await http.post("/api/auth/login", json={"email": email, "password": PASSWORD})
    api = bearer(tokens.json()["accessToken"])
    me = await http.get("/api/auth/me", headers=api)
    logged = await console_login(http, email)
    assert logged.status_code == 303, logged.text
    page = await http.get("/projects")
    match = CSRF.search(page.text)
    assert match, page.text
    return User(site, http, email, api, csrf=match.group(1), user_id=me.json()["id"])


@dataclass
class Tenant:
    owner: User
    member: User
    stranger: User
    project_id: str

    @property
    def base(self) -> str:
        return f"/projects/{self.project_id}"


@pytest.fixture
async def tenant(site: Site) -> AsyncIterator[Tenant]:
    async with contextlib.AsyncExitStack() as stack:
        owner = await sign_in(site, stack, "owner")
        member = await sign_in(site, stack, "member")
        stranger = await sign_in(site, stack, "stranger")
        slug = f"c-{uuid.uuid4().hex[:10]}"
        project = await owner.http.post(
            "/api/projects", json={"name": "Console Co", "slug": slug}, headers=owner.api
        )
        assert project.status_code == 201, project.text
        project_id = project.json()["id"]
        added = await owner.http.post(
            f"/api/projects/{project_id}/members", json={"email": member.email}, headers=owner.api
        )
        assert added.status_code == 201, added.text
        # The stranger owns a project of their own: a signed-in user, not a guest.
        other = await stranger.http.post(
            "/api/projects", json={"name": "Elsewhere"}, headers=stranger.api
        )
        assert other.status_code == 201, other.text
        yield Tenant(owner, member, stranger, project_id)


async def rest(user: User, method: str, path: str, **body: Any) -> dict[str, Any]:
    response = await user.http.request(method, path, json=body or None, headers=user.api)
    assert response.status_code in (200, 201), response.text
    out: dict[str, Any] = response.json()
    return out


async def seed(tenant: Tenant) -> dict[str, str]:
    """One of everything, through the REST API: ids for the write routes."""
    api = f"/api/projects/{tenant.project_id}"
    owner = tenant.owner
    secret = await rest(owner, "POST", f"{api}/secrets", name="seeded", value=SECRET_VALUE)
    await rest(
        owner, "POST", f"{api}/custom-llms", template="bob", name="seeded-bob", apiKey=LLM_KEY
    )
    override = await rest(
        owner,
        "POST",
        f"{api}/overrides",
        conversationId="conv-1",
        modelId="gpt-4o",
        apiKey=OVERRIDE_KEY,
    )
    key = await rest(owner, "POST", f"{api}/api-keys", name="seeded")
    token = await rest(owner, "POST", f"{api}/runtime-tokens", name="seeded")
    return {
        "secret": secret["id"],
        "override": override["id"],
        "key": key["id"],
        "token": token["id"],
        "llm": "seeded-bob",
    }


def writes(tenant: Tenant, ids: dict[str, str]) -> list[tuple[str, dict[str, str]]]:
    b = tenant.base
    return [
        (f"{b}/rename", {"name": "Renamed"}),
        (f"{b}/delete", {"confirm": "Console Co"}),
        (f"{b}/members", {"email": tenant.stranger.email, "role": "member"}),
        (f"{b}/members/{tenant.owner.user_id}/remove", {}),
        (f"{b}/custom-llms", {"template": "bob", "name": "x", "apiKey": LLM_KEY}),
        (f"{b}/custom-llms/{ids['llm']}/enabled", {"enabled": "false"}),
        (f"{b}/custom-llms/{ids['llm']}/test", {}),
        (f"{b}/custom-llms/{ids['llm']}/delete", {}),
        (f"{b}/secrets", {"name": "new", "value": SECRET_VALUE}),
        (f"{b}/secrets/{ids['secret']}/rotate", {"value": SECRET_VALUE + "2"}),
        (f"{b}/secrets/{ids['secret']}/delete", {}),
        (f"{b}/overrides", {"conversationId": "c", "modelId": "m", "apiKey": OVERRIDE_KEY}),
        (f"{b}/overrides/{ids['override']}/delete", {}),
        (f"{b}/quota", {"perMinute": "5"}),
        (f"{b}/prices", {"model": "custom:x", "input": "1", "output": "1"}),
        (f"{b}/api-keys", {"name": "k"}),
        (f"{b}/api-keys/{ids['key']}/revoke", {}),
        (f"{b}/runtime-tokens", {"name": "t"}),
        (f"{b}/runtime-tokens/{ids['token']}/revoke", {}),
        (f"{b}/models", {"mode": "all"}),
    ]


def assert_no_secret_values(site: Site) -> None:
    for body in site.answers:
        for value in (SECRET_VALUE, LLM_KEY, OVERRIDE_KEY, SECRET_VALUE + "2"):
            assert value not in body


async def test_every_tab_renders_for_owners_and_members_and_is_hidden_from_others(
    site: Site, tenant: Tenant
) -> None:
    await seed(tenant)
    for key in TABS:
        path = f"{tenant.base}/tabs/{key}"
        fragment = await tenant.owner.get(path)
        assert fragment.status_code == 200, (key, fragment.text)
        assert 'id="tab-panel"' in fragment.text
        assert f'aria-labelledby="tab-{key}"' in fragment.text
        assert "<html" not in fragment.text  # a fragment, with the tab list out of band
        assert 'hx-swap-oob="true"' in fragment.text
        page = await tenant.owner.get(path, htmx=False)
        assert page.status_code == 200, key
        assert "<html" in page.text
        assert 'id="tab-panel"' in page.text
        restore = await tenant.owner.http.get(
            path, headers={"HX-Request": "true", "HX-History-Restore-Request": "true"}
        )
        assert "<html" in restore.text  # a history restore needs the whole page
        member = await tenant.member.get(path)
        assert member.status_code == 200, key
        assert "<form" not in member.text or key in ("overview", "conversations", "quota")
        stranger = await tenant.stranger.get(path)
        assert stranger.status_code == 404, key
        assert "hx-trigger" in {h.lower() for h in stranger.headers}
        missing = await tenant.owner.get(f"/projects/{uuid.uuid4()}/tabs/{key}", htmx=False)
        assert missing.status_code == 404
    # Members are told why there is nothing to change.
    secrets = await tenant.member.get(f"{tenant.base}/tabs/secrets")
    assert "only the project's owners" in secrets.text
    assert_no_secret_values(site)


async def test_signed_out_visitors_are_sent_to_the_login_page(site: Site) -> None:
    project = uuid.uuid4()
    async with httpx.AsyncClient(base_url=site.url) as http:
        page = await http.get(f"/projects/{project}/tabs/secrets")
        assert page.status_code in (302, 303, 307)
        assert page.headers["location"].startswith("/login?next=")
        htmx = await http.get(f"/projects/{project}/tabs/secrets", headers={"HX-Request": "true"})
        assert htmx.headers["HX-Redirect"].startswith("/login?next=")


async def test_writes_need_the_csrf_token_the_role_and_the_project(
    site: Site, tenant: Tenant
) -> None:
    ids = await seed(tenant)
    for path, data in writes(tenant, ids):
        forged = await tenant.owner.post(path, data, csrf=False)
        assert forged.status_code == 403, (path, forged.text)
        wrong = await tenant.owner.http.post(
            path, data=data, headers={"X-CSRF-Token": "not-the-token", "HX-Request": "true"}
        )
        assert wrong.status_code == 403, path
        member = await tenant.member.post(path, data)
        assert member.status_code == 403, (path, member.text)
        assert "member" in member.headers["HX-Trigger"], path  # the toast says why
        stranger = await tenant.stranger.post(path, data)
        assert stranger.status_code == 404, (path, stranger.text)
    # Nothing changed: the project is still there, under its name, with its secret.
    overview = await tenant.owner.get(f"{tenant.base}/tabs/overview")
    assert "Console Co" in overview.text
    secrets = await tenant.owner.get(f"{tenant.base}/tabs/secrets")
    assert "seeded" in secrets.text
    assert_no_secret_values(site)


async def test_a_plain_form_post_carries_its_token_in_a_field(tenant: Tenant) -> None:
    page = await tenant.owner.get(f"{tenant.base}/tabs/keys", htmx=False)
    assert f'name="csrf_token" value="{tenant.owner.csrf}"' in page.text
    created = await tenant.owner.http.post(
        f"{tenant.base}/api-keys", data={"name": "plain", "csrf_token": tenant.owner.csrf}
    )
    assert created.status_code == 200
    assert "<html" in created.text  # no HTMX: the whole page, the key in it once
    assert 'class="secret-once"' in created.text


async def test_secrets_are_masked_rotated_and_kept_while_in_use(site: Site, tenant: Tenant) -> None:
    b = tenant.base
    owner = tenant.owner
    added = await owner.post(f"{b}/secrets", {"name": "openai", "value": SECRET_VALUE})
    assert added.status_code == 200, added.text
    assert "••••tail" in added.text
    assert "Secret openai added" in added.headers["HX-Trigger"]

    bad = await owner.post(
        f"{b}/secrets", {"name": "bad name!", "value": SECRET_VALUE, "description": "kept"}
    )
    assert bad.status_code == 422
    assert 'id="secret-name" name="name" type="text" value="bad name!"' in bad.text
    assert 'aria-describedby="secret-name-hint secret-name-error" aria-invalid="true"' in bad.text
    assert 'id="secret-name-error"' in bad.text
    assert 'value="kept"' in bad.text  # what was typed stays
    assert 'hx-preserve="true"' in bad.text  # the browser keeps the typed value
    assert '"level": "error"' in bad.headers["HX-Trigger"]

    taken = await owner.post(f"{b}/secrets", {"name": "openai", "value": SECRET_VALUE})
    assert taken.status_code == 422
    assert "already exists" in taken.text

    listed = await owner.get(f"{b}/tabs/secrets")
    secret_id = re.search(r"/secrets/([0-9a-f-]{36})/rotate", listed.text)
    assert secret_id
    rotated = await owner.post(
        f"{b}/secrets/{secret_id.group(1)}/rotate", {"value": "new-valueXYZW"}
    )
    assert rotated.status_code == 200
    assert "••••XYZW" in rotated.text
    empty = await owner.post(f"{b}/secrets/{secret_id.group(1)}/rotate", {"value": ""})
    assert empty.status_code == 422
    assert "Required." in empty.text

    llm = await owner.post(
        f"{b}/custom-llms", {"template": "bob", "name": "uses-it", "secretId": secret_id.group(1)}
    )
    assert llm.status_code == 200, llm.text
    assert "secret openai" in llm.text
    in_use = await owner.post(f"{b}/secrets/{secret_id.group(1)}/delete")
    assert in_use.status_code == 422
    assert "uses-it" in in_use.text  # the error names the custom LLM using it
    assert "uses-it" in in_use.headers["HX-Trigger"]
    await owner.post(f"{b}/custom-llms/uses-it/delete")
    deleted = await owner.post(f"{b}/secrets/{secret_id.group(1)}/delete")
    assert deleted.status_code == 200
    assert "openai" not in deleted.text
    assert_no_secret_values(site)


async def test_bob_conflicts_offer_names_that_apply_in_one_click(
    site: Site, tenant: Tenant
) -> None:
    b = tenant.base
    owner = tenant.owner
    form = await owner.get(f"{b}/tabs/custom-llms")
    assert "https://api.us-east.bob.ibm.com/inference/v1" in form.text  # shown read-only
    assert 'name="baseUrl"' not in form.text
    first = await owner.post(
        f"{b}/custom-llms", {"template": "bob", "name": "bob", "apiKey": LLM_KEY}
    )
    assert first.status_code == 200, first.text
    assert "••••K3Y9" in first.text

    again = await owner.post(
        f"{b}/custom-llms", {"template": "bob", "name": "bob", "apiKey": LLM_KEY}
    )
    assert again.status_code == 422
    assert 'name="useName" value="bob-2"' in again.text
    assert 'id="llm-api-key" name="apiKey" type="password" value=""' in again.text
    chosen = await owner.post(
        f"{b}/custom-llms",
        {"template": "bob", "name": "bob", "apiKey": LLM_KEY, "useName": "bob-2"},
    )
    assert chosen.status_code == 200, chosen.text
    assert "custom:bob-2" in chosen.text

    custom = await owner.get(f"{b}/custom-llms/form", template="custom", name="kept")
    assert 'name="baseUrl"' in custom.text
    assert 'value="kept"' in custom.text
    missing = await owner.post(f"{b}/custom-llms", {"template": "custom", "name": "mine"})
    assert missing.status_code == 422
    assert 'id="llm-base-url-error"' in missing.text

    off = await owner.post(f"{b}/custom-llms/bob/enabled", {"enabled": "false"})
    assert off.status_code == 200
    assert "bob is disabled" in off.headers["HX-Trigger"]
    assert_no_secret_values(site)


async def test_the_test_call_shows_the_live_result(site: Site, tenant: Tenant, fake: str) -> None:
    b = tenant.base
    added = await tenant.owner.post(
        f"{b}/custom-llms",
        {
            "template": "custom",
            "name": "local",
            "baseUrl": f"{fake}/v1",
            "model": "my-model",
            "authScheme": "bearer",
            "maxInputTokens": "1000",
            "apiKey": LLM_KEY,
        },
    )
    assert added.status_code == 200, added.text
    result = await tenant.owner.post(f"{b}/custom-llms/local/test")
    assert result.status_code == 200, result.text
    assert 'class="badge ok"' in result.text
    assert "HTTP 200" in result.text
    assert " ms" in result.text
    page = await tenant.owner.post(f"{b}/custom-llms/local/test", htmx=False)
    assert "<html" in page.text
    assert "HTTP 200" in page.text
    gone = await tenant.owner.post(f"{b}/custom-llms/local/delete")
    assert gone.status_code == 200
    assert "custom:local" not in gone.text
    assert_no_secret_values(site)


async def test_overrides_keys_and_tokens(site: Site, tenant: Tenant) -> None:
    b = tenant.base
    owner = tenant.owner
    added = await owner.post(
        f"{b}/overrides", {"conversationId": "conv-9", "modelId": "gpt-4o", "apiKey": OVERRIDE_KEY}
    )
    assert added.status_code == 200, added.text
    assert "••••0VR1" in added.text
    spaced = await owner.post(
        f"{b}/overrides", {"conversationId": "conv-9", "modelId": "x", "apiKey": "has space"}
    )
    assert spaced.status_code == 422
    assert 'id="override-key-error"' in spaced.text
    assert 'aria-describedby="override-key-hint override-key-error"' in spaced.text
    assert "hx-preserve" not in spaced.text  # the wrong key itself is not kept
    assert 'value="conv-9"' in spaced.text

    key = await owner.post(f"{b}/api-keys", {"name": "ci"})
    assert key.status_code == 200
    shown = re.search(r'id="new-secret-value">(ak-[^<]+)<', key.text)
    assert shown, key.text
    assert 'data-copy="#new-secret-value"' in key.text
    assert 'hx-history="false"' in key.text
    works = await owner.http.get(
        f"/api/projects/{tenant.project_id}", headers=bearer(shown.group(1))
    )
    assert works.status_code == 200
    later = await owner.get(f"{b}/tabs/keys")
    assert shown.group(1) not in later.text  # shown once
    key_id = re.search(r"/api-keys/([0-9a-f-]{36})/revoke", later.text)
    assert key_id
    revoked = await owner.post(f"{b}/api-keys/{key_id.group(1)}/revoke")
    assert revoked.status_code == 200
    assert "revoked" in revoked.text

    token = await owner.post(f"{b}/runtime-tokens", {"name": "rt", "expiresInSeconds": "3600"})
    assert token.status_code == 200
    jwt = re.search(r'id="new-secret-value">([^<]+)<', token.text)
    assert jwt
    catalog = await owner.http.get("/api/runtime/llms", headers=bearer(jwt.group(1)))
    assert catalog.status_code == 200
    bad = await owner.post(f"{b}/runtime-tokens", {"name": "rt", "expiresInSeconds": "5"})
    assert bad.status_code == 422
    assert 'id="token-lifetime-error"' in bad.text
    assert_no_secret_values(site)


async def test_quota_limits_and_usage_charts(site: Site, tenant: Tenant) -> None:
    b = tenant.base
    owner = tenant.owner
    writer = UsageWriter(site.resources.db_config.get_engine())
    today = datetime.datetime.now(datetime.UTC)
    for days_ago, model, tokens in ((0, "gpt-4o", 100), (0, "gpt-4o", 50), (2, "llama", 30)):
        writer.record(
            UsageEntry(
                project_id=uuid.UUID(tenant.project_id),
                model_requested=model,
                endpoint="chat",
                status=200,
                total_tokens=tokens,
                cost_micros=tokens * 1_000,
                currency="USD",
                cost_estimated=model == "llama",
                created_at=today - datetime.timedelta(days=days_ago),
            )
        )
    assert await writer.flush() == 3
    page = await owner.get(f"{b}/tabs/quota")
    assert page.status_code == 200
    assert page.text.count('<svg class="chart') == 3
    assert 'class="bar"' in page.text
    assert "style=" not in page.text
    assert "3 requests, 180 tokens" in page.text
    # Exact cost with its currency; a sum with an estimated part says so.
    assert "cost 0.18 USD (estimated in part)." in page.text
    assert "<td>0.15 USD</td>" in page.text
    assert "<td>0.03 USD (estimated in part)</td>" in page.text
    week = await owner.get(f"{b}/tabs/quota", days="7")
    assert "Usage since" in week.text

    admin = await owner.http.put(
        f"/api/admin/projects/{tenant.project_id}/quota",
        json={"perDay": 1000},
        headers=bearer(ADMIN_TOKEN),
    )
    assert admin.status_code == 200, admin.text
    above = await owner.post(f"{b}/quota", {"perMinute": "", "perDay": "5000", "perMonth": ""})
    assert above.status_code == 422
    assert 'id="limit-perDay-error"' in above.text
    assert 'value="5000"' in above.text
    nonsense = await owner.post(f"{b}/quota", {"perMinute": "many"})
    assert nonsense.status_code == 422
    assert "whole number" in nonsense.text
    lowered = await owner.post(f"{b}/quota", {"perMinute": "10", "perDay": "500", "perMonth": ""})
    assert lowered.status_code == 200, lowered.text
    assert 'value="500"' in lowered.text
    quota = await owner.http.get(f"/api/projects/{tenant.project_id}/quota", headers=owner.api)
    assert quota.json()["limits"]["perDay"] == 500


async def test_models_tab_edits_the_settings_and_shows_the_runtime_catalog(
    site: Site, tenant: Tenant
) -> None:
    b = tenant.base
    owner = tenant.owner
    ids = []
    for _ in range(2):
        profile_id = f"console-{uuid.uuid4().hex[:8]}"
        made = await owner.http.post(
            "/api/admin/model-profiles",
            json={"id": profile_id, "name": profile_id, "baseModel": "gpt-4o-mini"},
            headers=bearer(ADMIN_TOKEN),
        )
        assert made.status_code == 201, made.text
        ids.append(profile_id)
    page = await owner.get(f"{b}/tabs/models")
    assert ids[0] in page.text
    assert "GET /api/runtime/llms" in page.text
    refused = await owner.post(
        f"{b}/models",
        {"mode": "selected", "enabledProfileIds": ids[0], "defaultProfileId": ids[1]},
    )
    assert refused.status_code == 422
    assert 'id="models-default-error"' in refused.text
    saved = await owner.post(
        f"{b}/models",
        {"mode": "selected", "enabledProfileIds": [ids[0], ids[1]], "defaultProfileId": ids[1]},
    )
    assert saved.status_code == 200, saved.text
    models = await owner.http.get(f"/api/projects/{tenant.project_id}/models", headers=owner.api)
    assert models.json()["defaultProfileId"] == ids[1]
    # The catalog as runtimes get it.
    assert f'"defaultLlmId": "{ids[1]}"' in html.unescape(saved.text)


async def test_conversations_show_profile_priority_and_pins(tenant: Tenant) -> None:
    api = f"/api/projects/{tenant.project_id}/conversations"
    await rest(tenant.owner, "POST", api, title="Urgent one", priority=True)
    page = await tenant.owner.get(f"{tenant.base}/tabs/conversations")
    assert "Urgent one" in page.text
    assert "priority</span>" in page.text
    filtered = await tenant.owner.get(f"{tenant.base}/tabs/conversations", priority="false")
    assert "Urgent one" not in filtered.text


async def test_overview_rename_members_and_delete(site: Site, tenant: Tenant) -> None:
    b = tenant.base
    owner = tenant.owner
    renamed = await owner.post(f"{b}/rename", {"name": "Renamed Co", "slug": ""})
    assert renamed.status_code == 200, renamed.text
    assert 'id="project-heading" hx-swap-oob="true">Renamed Co' in renamed.text
    blank = await owner.post(f"{b}/rename", {"name": "", "slug": "x"})
    assert blank.status_code == 422
    assert 'id="project-rename-name-error"' in blank.text

    unknown = await owner.post(f"{b}/members", {"email": "nobody@example.com", "role": "member"})
    assert unknown.status_code == 422
    assert 'id="member-email-error"' in unknown.text
    assert "No one has an Arona account with nobody@example.com" in unknown.text
    not_email = await owner.post(f"{b}/members", {"email": "nobody", "role": "member"})
    assert not_email.status_code == 422
    assert "Enter an email address" in not_email.text
    not_owner = await tenant.member.post(f"{b}/members", {"email": tenant.stranger.email})
    assert not_owner.status_code == 403
    assert "Only the project's owners can add members." in not_owner.headers["HX-Trigger"]
    added = await owner.post(f"{b}/members", {"email": tenant.stranger.email, "role": "member"})
    assert added.status_code == 200
    assert tenant.stranger.email in added.text
    again = await owner.post(f"{b}/members", {"email": tenant.stranger.email, "role": "owner"})
    assert again.status_code == 422
    assert 'id="member-email-error"' in again.text
    assert f"{tenant.stranger.email} is already a member of this project." in again.text
    visible = await tenant.stranger.get(f"{b}/tabs/overview")
    assert visible.status_code == 200
    removed = await owner.post(f"{b}/members/{tenant.stranger.user_id}/remove")
    assert removed.status_code == 200
    assert (await tenant.stranger.get(f"{b}/tabs/overview")).status_code == 404

    left = await tenant.member.post(f"{b}/members/{tenant.member.user_id}/remove")
    assert left.headers["HX-Redirect"] == "/projects"
    assert (await tenant.member.get(f"{b}/tabs/overview")).status_code == 404

    wrong = await owner.post(f"{b}/delete", {"confirm": "renamed co"})
    assert wrong.status_code == 422
    assert 'id="delete-confirm-error"' in wrong.text
    gone = await owner.post(f"{b}/delete", {"confirm": "Renamed Co"})
    assert gone.status_code == 200
    assert gone.headers["HX-Redirect"] == "/projects"
    assert (await owner.get(f"{b}/tabs/overview")).status_code == 404


def test_charts_keep_bars_inside_the_plot_and_label_whole_numbers() -> None:
    assert [nice_ceiling(v) for v in (0, 1, 3, 7, 11, 180, 2400)] == [1, 1, 5, 10, 20, 200, 2500]
    assert [compact_number(v) for v in (0, 950, 1200, 3_400_000)] == ["0", "950", "1.2k", "3.4M"]
    chart = column_chart([("a", 0), ("b", 7), ("c", 3)], unit="requests")
    tallest = max(chart.bars, key=lambda b: b.value)
    assert tallest.y >= chart.top
    assert tallest.y + tallest.height == chart.bottom
    assert all(chart.left <= b.x and b.x + b.width <= chart.right for b in chart.bars)
    assert [t.label for t in chart.ticks] == ["0", "2", "4", "6", "8", "10"]
    empty = column_chart([("a", 0)], unit="requests")
    assert empty.empty
    assert [t.label for t in empty.ticks] == ["0", "1"]
    bars = bar_chart([("gpt-4o", 10), ("a-very-long-model-name-indeed", 5)], unit="requests")
    assert bars.horizontal
    assert bars.bars[0].width > bars.bars[1].width
    assert bars.labels[1].text.endswith("…")
