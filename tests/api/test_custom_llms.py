"""The custom LLMs API (``/api/projects/{projectId}/custom-llms``), its directory and
its catalog entries, end to end.

Two live replicas (uvicorn on loopback ports, in the test's event loop) share one
PostgreSQL database and one Redis: ``loose`` allows private addresses (its upstreams
are fakes on loopback ports), ``strict`` runs the default SSRF policy. Upstreams are
real ``FakeOpenAI`` servers; the headers they recorded prove what was sent.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any
from uuid import UUID

import httpx
import pytest
from sqlalchemy import event, select

from app.db.models import CustomLlm
from app.domain.custom_llms.directory import CustomLlmDirectory, parse_llm_id
from app.domain.custom_llms.stored import StoredLlm
from app.domain.custom_llms.templates import BOB
from app.domain.secrets.aad import custom_llm_aad
from app.fakes.openai_upstream import FakeOpenAI
from app.fakes.serve import serve_asgi
from app.lib.passwords import PasswordHasher
from app.lib.settings import Settings
from app.lib.vault import VaultDecryptError
from app.server.app import create_app
from app.server.resources import Resources
from tests.support.api import eventually
from tests.support.auth import execute
from tests.support.helpers import PASSWORD, assert_error, bearer, unique_email
from tests.support.live_server import live_server
from tests.support.settings import REDIS_URL, base_settings, with_settings

KEY = "sk-test-0123456789abcdef"
ADMIN_TOKEN = "custom-llms-admin-" + "a" * 32
ADMIN = bearer(ADMIN_TOKEN)
FIELDS = {
    "id",
    "projectId",
    "name",
    "llmId",
    "template",
    "baseUrl",
    "model",
    "authScheme",
    "provider",
    "maxInputTokens",
    "maxOutputTokens",
    "enabled",
    "credential",
    "secretId",
    "apiKeyHint",
    "createdAt",
    "updatedAt",
}
TEST_FIELDS = {"ok", "status", "latencyMs", "detail"}
LOCKED = {
    "baseUrl": "https://example.com/v1",
    "model": "gpt-4o",
    "authScheme": "bearer",
    "provider": "openai",
    "maxInputTokens": 1000,
    "maxOutputTokens": 100,
}


# ----------------------------------------------------------------- fixtures


@dataclass
class Replica:
    http: httpx.AsyncClient
    resources: Resources

    @property
    def settings(self) -> Settings:
        return self.resources.settings


@dataclass
class Cluster:
    loose: Replica
    """Private addresses allowed: reaches the loopback fakes."""
    strict: Replica
    """The default SSRF policy."""


@pytest.fixture(scope="module")
async def cluster(pg_database: str, fast_hasher: PasswordHasher) -> AsyncIterator[Cluster]:
    common = base_settings(
        database_url=pg_database,
        redis_url=REDIS_URL,
        redis_prefix=f"test:{uuid.uuid4().hex}:",
        db_pool_size=5,
        # Every tenant logs in two users from one address, for the whole module.
        login_max_attempts=100_000,
        admin_token=ADMIN_TOKEN,
    )
    replicas: list[Replica] = []
    async with contextlib.AsyncExitStack() as stack:
        for settings in (with_settings(common, custom_llm_allow_private=True), common):
            app = create_app(settings, password_hasher=fast_hasher)
            url = await stack.enter_async_context(live_server(app))
            http = await stack.enter_async_context(httpx.AsyncClient(base_url=url, timeout=30))
            replicas.append(Replica(http=http, resources=app.state.resources))
        yield Cluster(loose=replicas[0], strict=replicas[1])


@pytest.fixture
def api(cluster: Cluster) -> httpx.AsyncClient:
    return cluster.loose.http


@pytest.fixture
def resources(cluster: Cluster) -> Resources:
    """The resources of the replica ``api`` talks to."""
    return cluster.loose.resources


@pytest.fixture
async def fake() -> AsyncIterator[tuple[FakeOpenAI, str]]:
    upstream = FakeOpenAI(f"custom-{uuid.uuid4().hex[:6]}", models=["my-model", "other"])
    async with serve_asgi(upstream) as url:
        yield upstream, url


async def signup(http: httpx.AsyncClient, tag: str) -> tuple[str, dict[str, str]]:
    email = unique_email(tag)
    response = await http.post("/api/auth/register", json={"email": email, "password": PASSWORD})
    assert response.status_code == 201, response.text
    response = await http.post("/api/auth/login", json={"email": email, "password": PASSWORD})
    assert response.status_code == 200, response.text
    return email, bearer(response.json()["accessToken"])


@dataclass
class Tenant:
    project_id: str
    slug: str
    owner: dict[str, str]
    member: dict[str, str]
    key: dict[str, str]
    runtime: dict[str, str]

    @property
    def base(self) -> str:
        return f"/api/projects/{self.project_id}/custom-llms"


async def new_tenant(http: httpx.AsyncClient) -> Tenant:
    _, owner = await signup(http, "owner")
    slug = f"p-{uuid.uuid4().hex[:10]}"
    project = await http.post("/api/projects", json={"name": "Acme", "slug": slug}, headers=owner)
    assert project.status_code == 201, project.text
    project_id = project.json()["id"]
    member_email, member = await signup(http, "member")
    added = await http.post(
        f"/api/projects/{project_id}/members", json={"email": member_email}, headers=owner
    )
    assert added.status_code == 201, added.text
    key = await http.post(f"/api/projects/{project_id}/api-keys", json={}, headers=owner)
    assert key.status_code == 201, key.text
    token = await http.post(f"/api/projects/{project_id}/runtime-tokens", json={}, headers=owner)
    assert token.status_code == 201, token.text
    return Tenant(
        project_id=project_id,
        slug=slug,
        owner=owner,
        member=member,
        key=bearer(key.json()["key"]),
        runtime=bearer(token.json()["token"]),
    )


@pytest.fixture
async def tenant(api: httpx.AsyncClient) -> Tenant:
    return await new_tenant(api)


async def created(
    http: httpx.AsyncClient,
    tenant: Tenant,
    body: dict[str, Any],
    headers: dict[str, str] | None = None,
) -> dict[str, Any]:
    response = await http.post(tenant.base, json=body, headers=headers or tenant.owner)
    assert response.status_code == 201, response.text
    assert set(response.json()) == FIELDS
    out: dict[str, Any] = response.json()
    return out


def custom_body(url: str, **fields: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "template": "custom",
        "name": "mine",
        "baseUrl": f"{url}/v1",
        "model": "my-model",
        "authScheme": "bearer",
        "provider": "acme",
        "maxInputTokens": 32000,
        "maxOutputTokens": 4000,
        "apiKey": KEY,
    }
    body.update(fields)
    return {k: v for k, v in body.items() if v is not None}


async def new_secret(
    http: httpx.AsyncClient, tenant: Tenant, value: str, name: str | None = None
) -> str:
    response = await http.post(
        f"/api/projects/{tenant.project_id}/secrets",
        json={"name": name or f"s-{uuid.uuid4().hex[:8]}", "value": value},
        headers=tenant.owner,
    )
    assert response.status_code == 201, response.text
    return str(response.json()["id"])


async def run_test(http: httpx.AsyncClient, tenant: Tenant, name: str) -> dict[str, Any]:
    response = await http.post(f"{tenant.base}/{name}/test", headers=tenant.owner)
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    assert set(body) == TEST_FIELDS
    return body


async def catalog_llms(http: httpx.AsyncClient, tenant: Tenant) -> dict[str, dict[str, Any]]:
    response = await http.get("/api/runtime/llms", headers=tenant.runtime)
    assert response.status_code == 200, response.text
    return {llm["id"]: llm for llm in response.json()["llms"]}


def keys_of(document: Any) -> set[str]:
    """Every object key anywhere in a JSON document."""
    if isinstance(document, dict):
        return set(document).union(*(keys_of(v) for v in document.values()))
    if isinstance(document, list):
        return set().union(*(keys_of(v) for v in document))
    return set()


@contextlib.contextmanager
def statements(resources: Resources) -> Iterator[list[str]]:
    engine = resources.db_config.get_engine().sync_engine
    seen: list[str] = []

    def record(*args: Any) -> None:
        seen.append(str(args[2]))

    event.listen(engine, "before_cursor_execute", record)
    try:
        yield seen
    finally:
        event.remove(engine, "before_cursor_execute", record)


# ------------------------------------------------------------------ the Bob template


async def test_bob_needs_only_a_key_and_fills_every_technical_field(
    api: httpx.AsyncClient, resources: Resources, tenant: Tenant
) -> None:
    body = await created(api, tenant, {"apiKey": KEY})
    assert body["name"] == "bob"
    assert body["llmId"] == "custom:bob"
    assert body["projectId"] == tenant.project_id
    assert body["template"] == "bob"
    assert body["baseUrl"] == "https://api.us-east.bob.ibm.com/inference/v1"
    assert body["model"] == "premium"
    assert body["authScheme"] == "ApiKey"
    assert body["provider"] == "bob"
    assert body["maxInputTokens"] == 160000
    assert body["maxOutputTokens"] == 40000
    assert body["enabled"] is True
    assert body["credential"] == "apiKey"
    assert body["apiKeyHint"] == "••••cdef"
    assert body["secretId"] is None

    # The directory hands the routing side the Bob target, key decrypted.
    directory = resources.custom_llms.directory
    target = await directory.target(UUID(tenant.project_id), "bob")
    assert target is not None
    assert (target.base_url, target.model, target.auth_scheme) == (
        BOB.base_url,
        "premium",
        "ApiKey",
    )
    assert target.api_key == KEY
    assert target.auth_headers() == {"Authorization": f"ApiKey {KEY}"}
    assert KEY not in repr(target)
    spec = target.backend_spec()
    assert (spec.name, spec.url, spec.models, spec.auth_scheme) == (
        "custom:bob",
        BOB.base_url,
        ("premium",),
        "ApiKey",
    )


@pytest.mark.parametrize(("field", "value"), list(LOCKED.items()))
async def test_every_bob_technical_field_is_locked(
    api: httpx.AsyncClient, tenant: Tenant, field: str, value: Any
) -> None:
    response = await api.post(tenant.base, json={"apiKey": KEY, field: value}, headers=tenant.owner)
    error = assert_error(response, 400, "locked_field")
    assert error["param"] == field
    # Even the locked value itself is not accepted from a client.
    same = {"baseUrl": BOB.base_url, "model": BOB.model}.get(field)
    if same is not None:
        response = await api.post(
            tenant.base, json={"apiKey": KEY, field: same}, headers=tenant.owner
        )
        assert assert_error(response, 400, "locked_field")["param"] == field
    await created(api, tenant, {"apiKey": KEY})
    response = await api.patch(f"{tenant.base}/bob", json={field: value}, headers=tenant.owner)
    assert assert_error(response, 400, "locked_field")["param"] == field
    unchanged = (await api.get(f"{tenant.base}/bob", headers=tenant.owner)).json()
    assert unchanged["baseUrl"] == BOB.base_url
    assert unchanged["model"] == "premium"


async def test_the_template_is_chosen_once(api: httpx.AsyncClient, tenant: Tenant) -> None:
    await created(api, tenant, {"apiKey": KEY})
    response = await api.patch(
        f"{tenant.base}/bob", json={"template": "custom"}, headers=tenant.owner
    )
    assert assert_error(response, 400, "locked_field")["param"] == "template"


async def test_bob_allows_name_enabled_and_credentials_to_change(
    api: httpx.AsyncClient, resources: Resources, tenant: Tenant
) -> None:
    await created(api, tenant, {"name": "bob-team", "apiKey": KEY})
    secret_id = await new_secret(api, tenant, "bob-secret-value-9876")
    response = await api.patch(
        f"{tenant.base}/bob-team",
        json={"name": "bob-main", "enabled": False, "secretId": secret_id},
        headers=tenant.owner,
    )
    assert response.status_code == 200, response.text
    body = response.json()
    assert (body["name"], body["llmId"], body["enabled"]) == ("bob-main", "custom:bob-main", False)
    assert (body["credential"], body["secretId"], body["apiKeyHint"]) == ("secret", secret_id, None)
    assert (await api.get(f"{tenant.base}/bob-team", headers=tenant.owner)).status_code == 404
    rows = await execute(
        resources.settings,
        select(CustomLlm.api_key_encrypted, CustomLlm.api_key_hint).where(
            CustomLlm.id == UUID(body["id"])
        ),
    )
    assert rows == [(None, None)]  # the typed-in key is gone with the switch


# ----------------------------------------------------------------- the Custom template


async def test_a_custom_endpoint_round_trip(
    api: httpx.AsyncClient, resources: Resources, tenant: Tenant, fake: tuple[FakeOpenAI, str]
) -> None:
    _, url = fake
    body = await created(api, tenant, custom_body(url))
    assert body["llmId"] == "custom:mine"
    assert body["template"] == "custom"
    assert (body["baseUrl"], body["model"], body["authScheme"], body["provider"]) == (
        f"{url}/v1",
        "my-model",
        "bearer",
        "acme",
    )
    assert (body["maxInputTokens"], body["maxOutputTokens"]) == (32000, 4000)
    assert body["credential"] == "apiKey"

    one = await api.get(f"{tenant.base}/mine", headers=tenant.member)
    assert one.status_code == 200
    assert one.json() == body
    listed = await api.get(tenant.base, headers=tenant.member)
    assert listed.status_code == 200
    assert listed.json() == {"items": [body], "total": 1, "limit": 50, "offset": 0}

    changed = await api.patch(
        f"{tenant.base}/mine",
        json={"model": "other", "maxOutputTokens": 8000, "provider": "Acme Labs"},
        headers=tenant.key,
    )
    assert changed.status_code == 200, changed.text
    assert (changed.json()["model"], changed.json()["maxOutputTokens"]) == ("other", 8000)
    assert changed.json()["provider"] == "Acme Labs"

    deleted = await api.delete(f"{tenant.base}/mine", headers=tenant.key)
    assert deleted.status_code == 204
    assert_error(
        await api.get(f"{tenant.base}/mine", headers=tenant.owner), 404, "custom_llm_not_found"
    )
    assert await resources.custom_llms.directory.target(UUID(tenant.project_id), "mine") is None


async def test_custom_defaults_and_the_none_scheme(
    api: httpx.AsyncClient, tenant: Tenant, fake: tuple[FakeOpenAI, str]
) -> None:
    _, url = fake
    body = await created(
        api,
        tenant,
        {"template": "custom", "name": "open", "baseUrl": url, "model": "m", "authScheme": "none"},
    )
    assert (body["provider"], body["maxInputTokens"], body["maxOutputTokens"]) == (
        "custom",
        8192,
        2048,
    )
    assert (body["credential"], body["apiKeyHint"], body["secretId"]) == ("none", None, None)
    # Moving to a scheme that sends a key needs one.
    response = await api.patch(
        f"{tenant.base}/open", json={"authScheme": "bearer"}, headers=tenant.owner
    )
    assert assert_error(response, 400, "credentials_required")["param"] == "apiKey"
    response = await api.patch(
        f"{tenant.base}/open", json={"authScheme": "api-key", "apiKey": KEY}, headers=tenant.owner
    )
    assert response.status_code == 200, response.text
    assert response.json()["credential"] == "apiKey"
    # And back: the stored key is dropped.
    response = await api.patch(
        f"{tenant.base}/open", json={"authScheme": "none"}, headers=tenant.owner
    )
    assert response.json()["credential"] == "none"
    assert response.json()["apiKeyHint"] is None


# ----------------------------------------------------------------- names


async def test_a_taken_name_answers_free_suggestions_that_work(
    api: httpx.AsyncClient, tenant: Tenant
) -> None:
    await created(api, tenant, {"apiKey": KEY})
    await created(api, tenant, {"name": "bob-2", "apiKey": KEY})
    response = await api.post(tenant.base, json={"apiKey": KEY}, headers=tenant.owner)
    assert response.status_code == 409, response.text
    error = response.json()["error"]
    assert set(response.json()) == {"error"}
    assert set(error) == {"message", "type", "code", "param", "suggestions"}
    assert (error["code"], error["type"], error["param"]) == (
        "custom_llm_exists",
        "conflict_error",
        "name",
    )
    assert error["suggestions"] == ["bob-3", f"bob-{tenant.slug}", "bob-personal"]
    for name in error["suggestions"]:
        assert (await created(api, tenant, {"name": name, "apiKey": KEY}))["name"] == name
    # A rename onto a taken name is the same 409, with names free now.
    response = await api.patch(f"{tenant.base}/bob-3", json={"name": "bob"}, headers=tenant.owner)
    assert response.status_code == 409
    suggestions = response.json()["error"]["suggestions"]
    assert suggestions == ["bob-4", f"bob-{tenant.slug}-2", "bob-personal-2"]


PLATFORM_KINDS = {
    "backend": ("/api/admin/backends", "a platform backend"),
    "alias": ("/api/admin/aliases", "a model alias"),
    "profile": ("/api/admin/model-profiles", "a model profile"),
}


async def platform_name(http: httpx.AsyncClient, kind: str, name: str) -> str:
    """Give ``name`` to a platform object of ``kind`` through the admin API; returns
    the path that deletes it."""
    base, _ = PLATFORM_KINDS[kind]
    body: dict[str, Any] = {
        "backend": {"name": name, "type": "external", "url": "http://127.0.0.1:9"},
        "alias": {"alias": name, "target": "some-model"},
        "profile": {"id": name, "name": "Reserved", "baseModel": "some-model"},
    }[kind]
    response = await http.post(base, json=body, headers=ADMIN)
    assert response.status_code == 201, response.text
    return f"{base}/{name}"


@pytest.mark.parametrize("kind", sorted(PLATFORM_KINDS))
async def test_a_name_the_platform_uses_answers_free_suggestions_too(
    api: httpx.AsyncClient, tenant: Tenant, kind: str
) -> None:
    used = f"plat-{uuid.uuid4().hex[:8]}"
    # Compared case-insensitively; a suggestion the platform uses is not offered.
    made = [
        await platform_name(api, kind, used.upper()),
        await platform_name(api, kind, f"{used}-2"),
    ]
    try:
        response = await api.post(
            tenant.base, json={"name": used, "apiKey": KEY}, headers=tenant.owner
        )
        assert response.status_code == 409, response.text
        error = response.json()["error"]
        assert set(error) == {"message", "type", "code", "param", "suggestions"}
        assert (error["code"], error["type"], error["param"]) == (
            "custom_llm_exists",
            "conflict_error",
            "name",
        )
        assert PLATFORM_KINDS[kind][1] in error["message"]
        assert error["suggestions"] == [f"{used}-3", f"{used}-{tenant.slug}", f"{used}-personal"]
        for name in error["suggestions"]:
            assert (await created(api, tenant, {"name": name, "apiKey": KEY}))["name"] == name
        # A rename onto it is the same 409; the custom template is checked alike.
        response = await api.patch(
            f"{tenant.base}/{used}-3", json={"name": used}, headers=tenant.owner
        )
        assert response.status_code == 409, response.text
        assert response.json()["error"]["suggestions"] == [
            f"{used}-4",
            f"{used}-{tenant.slug}-2",
            f"{used}-personal-2",
        ]
        response = await api.post(
            tenant.base,
            json=custom_body("https://93.184.215.14", name=f"{used}-2"),
            headers=tenant.owner,
        )
        assert response.status_code == 409, response.text
        assert PLATFORM_KINDS[kind][1] in response.json()["error"]["message"]
        assert response.json()["error"]["suggestions"][0] == f"{used}-2-2"
        listed = await api.get(tenant.base, headers=tenant.owner)
        assert used not in {llm["name"] for llm in listed.json()["items"]}
    finally:
        for path in made:
            deleted = await api.delete(path, headers=ADMIN)
            assert deleted.status_code == 204, deleted.text
    # Once the platform lets the name go, the project may take it.
    assert (await created(api, tenant, {"name": used, "apiKey": KEY}))["name"] == used


async def test_names_are_per_project(api: httpx.AsyncClient, tenant: Tenant) -> None:
    other = await new_tenant(api)
    await created(api, tenant, {"apiKey": KEY})
    await created(api, other, {"apiKey": KEY})


# ----------------------------------------------------------------- credentials


async def test_keys_are_never_returned_and_are_sealed_to_their_row(
    api: httpx.AsyncClient, resources: Resources, tenant: Tenant, fake: tuple[FakeOpenAI, str]
) -> None:
    _, url = fake
    responses = [
        await api.post(tenant.base, json={"apiKey": KEY}, headers=tenant.owner),
        await api.post(tenant.base, json=custom_body(url), headers=tenant.owner),
        await api.get(tenant.base, headers=tenant.owner),
        await api.get(f"{tenant.base}/mine", headers=tenant.owner),
        await api.patch(f"{tenant.base}/mine", json={"apiKey": KEY + "x"}, headers=tenant.owner),
        await api.post(f"{tenant.base}/mine/test", headers=tenant.owner),
    ]
    for response in responses:
        assert response.status_code < 300, response.text
        assert KEY not in response.text
        assert "apiKey" not in keys_of(response.json())
    rows = await execute(
        resources.settings,
        select(CustomLlm.id, CustomLlm.api_key_encrypted).where(
            CustomLlm.project_id == UUID(tenant.project_id)
        ),
    )
    vault = resources.vault
    for row_id, sealed in rows:
        assert KEY not in sealed
        assert vault.decrypt(sealed, custom_llm_aad(UUID(tenant.project_id), row_id)).startswith(
            KEY
        )
    # Sealed to its row: another row's associated data does not open it.
    (_, first), (second_id, _) = rows
    with pytest.raises(VaultDecryptError):
        vault.decrypt(first, custom_llm_aad(UUID(tenant.project_id), second_id))


async def test_a_secret_of_the_project_is_preferred_over_a_typed_key(
    api: httpx.AsyncClient, resources: Resources, tenant: Tenant
) -> None:
    secret_id = await new_secret(api, tenant, "bob-from-secret-1111")
    body = await created(api, tenant, {"secretId": secret_id})
    assert (body["credential"], body["secretId"], body["apiKeyHint"]) == ("secret", secret_id, None)
    target = await resources.custom_llms.directory.target(UUID(tenant.project_id), "bob")
    assert target is not None
    assert target.api_key == "bob-from-secret-1111"

    other = await new_tenant(api)
    foreign = await new_secret(api, other, "not-yours")
    response = await api.post(other.base, json={"secretId": secret_id}, headers=other.owner)
    assert assert_error(response, 404, "secret_not_found")["param"] == "secretId"
    response = await api.post(
        tenant.base, json={"name": "b2", "secretId": foreign}, headers=tenant.owner
    )
    assert assert_error(response, 404, "secret_not_found")["param"] == "secretId"
    response = await api.patch(
        f"{tenant.base}/bob", json={"secretId": foreign}, headers=tenant.owner
    )
    assert assert_error(response, 404, "secret_not_found")["param"] == "secretId"
    missing = str(uuid.uuid4())
    response = await api.post(
        tenant.base, json={"name": "b3", "secretId": missing}, headers=tenant.owner
    )
    assert assert_error(response, 404, "secret_not_found")["param"] == "secretId"


@pytest.mark.parametrize(
    ("body", "code", "param"),
    [
        ({}, "credentials_required", "apiKey"),
        ({"apiKey": KEY, "secretId": str(uuid.uuid4())}, "credentials_conflict", "secretId"),
    ],
)
async def test_credential_rules(
    api: httpx.AsyncClient, tenant: Tenant, body: dict[str, Any], code: str, param: str
) -> None:
    response = await api.post(tenant.base, json=body, headers=tenant.owner)
    assert assert_error(response, 400, code)["param"] == param


async def test_a_credential_with_the_none_scheme_is_refused(
    api: httpx.AsyncClient, tenant: Tenant, fake: tuple[FakeOpenAI, str]
) -> None:
    _, url = fake
    response = await api.post(
        tenant.base, json=custom_body(url, authScheme="none"), headers=tenant.owner
    )
    assert assert_error(response, 400, "credentials_not_used")["param"] == "apiKey"


async def test_dropping_the_only_credential_is_refused(
    api: httpx.AsyncClient, tenant: Tenant
) -> None:
    await created(api, tenant, {"apiKey": KEY})
    response = await api.patch(f"{tenant.base}/bob", json={"apiKey": None}, headers=tenant.owner)
    assert assert_error(response, 400, "credentials_required")["param"] == "apiKey"


# ----------------------------------------------------------------- the test call


SCHEME_HEADERS = {
    "bearer": ("authorization", f"Bearer {KEY}"),
    "api-key": ("api-key", KEY),
    "ApiKey": ("authorization", f"ApiKey {KEY}"),
    "none": (None, None),
}


@pytest.mark.parametrize("scheme", list(SCHEME_HEADERS))
async def test_the_test_call_lists_models_with_the_scheme_header(
    api: httpx.AsyncClient, tenant: Tenant, fake: tuple[FakeOpenAI, str], scheme: str
) -> None:
    upstream, url = fake
    body = custom_body(url, authScheme=scheme, apiKey=None if scheme == "none" else KEY)
    await created(api, tenant, body)
    report = await run_test(api, tenant, "mine")
    assert report["ok"] is True
    assert report["status"] == 200
    assert isinstance(report["latencyMs"], int)
    assert report["latencyMs"] >= 0
    assert report["detail"] == "model listing answered 200; 'my-model' is listed"
    [request] = upstream.requests_for("/v1/models")
    name, value = SCHEME_HEADERS[scheme]
    if name is None:
        assert "authorization" not in request.headers
        assert "api-key" not in request.headers
    else:
        assert request.headers.get(name) == value
        other = "api-key" if name == "authorization" else "authorization"
        assert other not in request.headers


async def test_without_a_listing_the_test_sends_a_one_token_chat(
    api: httpx.AsyncClient, tenant: Tenant, fake: tuple[FakeOpenAI, str]
) -> None:
    upstream, url = fake
    upstream.control.listing_404 = True
    await created(api, tenant, custom_body(url, authScheme="ApiKey"))
    report = await run_test(api, tenant, "mine")
    assert (report["ok"], report["status"]) == (True, 200)
    assert report["detail"] == "no model listing (404); a 1-token chat answered 200"
    [chat] = upstream.requests_for("/chat/completions")
    assert chat.headers["authorization"] == f"ApiKey {KEY}"
    assert chat.body["model"] == "my-model"
    assert chat.body["max_tokens"] == 1
    assert chat.body["stream"] is False


async def test_the_test_reports_failures_without_the_key(
    api: httpx.AsyncClient, tenant: Tenant, fake: tuple[FakeOpenAI, str]
) -> None:
    upstream, url = fake
    secret_id = await new_secret(api, tenant, "sk-secret-from-vault-42")
    await created(api, tenant, custom_body(url, apiKey=None, secretId=secret_id))
    upstream.control.fail_status = 401
    upstream.control.fail_message = "Incorrect API key provided: sk-secret-from-vault-42"
    report = await run_test(api, tenant, "mine")
    assert (report["ok"], report["status"]) == (False, 401)
    assert "refused the credentials" in report["detail"]
    assert "sk-secret-from-vault-42" not in report["detail"]
    assert "••••" in report["detail"]
    [request] = upstream.requests_for("/v1/models")
    assert request.headers["authorization"] == "Bearer sk-secret-from-vault-42"

    upstream.control.fail_status = 503
    upstream.control.fail_message = "overloaded"
    report = await run_test(api, tenant, "mine")
    assert (report["ok"], report["status"]) == (False, 503)
    assert report["detail"] == "answered 503: overloaded"


async def test_an_unreachable_endpoint_reports_no_status(
    api: httpx.AsyncClient, tenant: Tenant
) -> None:
    async with serve_asgi(FakeOpenAI("gone")) as url:
        pass  # the port is closed now
    await created(api, tenant, custom_body(url))
    report = await run_test(api, tenant, "mine")
    assert (report["ok"], report["status"]) == (False, None)
    assert report["detail"] == "connection refused"


async def test_the_test_call_passes_the_ssrf_guard(
    cluster: Cluster, fake: tuple[FakeOpenAI, str]
) -> None:
    upstream, url = fake
    # Stored through the loose replica, tested on the strict one: the connection
    # itself is refused, not only the write.
    tenant = await new_tenant(cluster.loose.http)
    await created(cluster.loose.http, tenant, custom_body(url))
    report = await run_test(cluster.strict.http, tenant, "mine")
    assert (report["ok"], report["status"]) == (False, None)
    assert "refused by the SSRF guard" in report["detail"]
    assert "loopback" in report["detail"]
    assert upstream.stats.requests == 0


# ----------------------------------------------------------------- the SSRF guard on writes


@pytest.mark.parametrize(
    "base_url",
    [
        "http://127.0.0.1:8000/v1",
        "http://[::1]:8000/v1",
        "http://[::ffff:10.0.0.1]/v1",
        "http://localhost:8000/v1",
        "http://169.254.169.254/latest",
        "http://192.168.1.20/v1",
    ],
)
async def test_private_base_urls_are_refused(cluster: Cluster, base_url: str) -> None:
    http = cluster.strict.http
    tenant = await new_tenant(http)
    response = await http.post(
        tenant.base, json=custom_body("x", baseUrl=base_url), headers=tenant.owner
    )
    assert assert_error(response, 400, "base_url_not_allowed")["param"] == "baseUrl"
    await created(http, tenant, custom_body("x", baseUrl="https://93.184.215.14/v1"))
    response = await http.patch(
        f"{tenant.base}/mine", json={"baseUrl": base_url}, headers=tenant.owner
    )
    assert assert_error(response, 400, "base_url_not_allowed")["param"] == "baseUrl"


async def test_metadata_stays_refused_when_private_addresses_are_allowed(
    api: httpx.AsyncClient, tenant: Tenant
) -> None:
    for base_url in ("http://169.254.169.254/v1", "http://metadata.google.internal/v1"):
        response = await api.post(
            tenant.base, json=custom_body("x", baseUrl=base_url), headers=tenant.owner
        )
        assert assert_error(response, 400, "base_url_not_allowed")["param"] == "baseUrl"


# ----------------------------------------------------------------- access


async def test_members_read_and_writers_write(
    api: httpx.AsyncClient, tenant: Tenant, fake: tuple[FakeOpenAI, str]
) -> None:
    _, url = fake
    await created(api, tenant, custom_body(url), headers=tenant.key)
    assert (await api.get(tenant.base, headers=tenant.member)).status_code == 200
    assert (await api.get(f"{tenant.base}/mine", headers=tenant.member)).status_code == 200
    for method, path, body in (
        ("POST", tenant.base, {"apiKey": KEY}),
        ("PATCH", f"{tenant.base}/mine", {"enabled": False}),
        ("DELETE", f"{tenant.base}/mine", None),
        ("POST", f"{tenant.base}/mine/test", None),
    ):
        response = await api.request(method, path, json=body, headers=tenant.member)
        assert_error(response, 403, "insufficient_role")
    response = await api.get(tenant.base, headers=tenant.runtime)
    assert_error(response, 403, "runtime_token_not_allowed")
    assert_error(await api.get(tenant.base), 401)


async def test_another_tenant_gets_404_on_every_route(
    api: httpx.AsyncClient, tenant: Tenant, fake: tuple[FakeOpenAI, str]
) -> None:
    _, url = fake
    await created(api, tenant, custom_body(url))
    stranger = await new_tenant(api)
    await created(api, stranger, custom_body(url, name="theirs"))
    routes = [
        ("GET", "", None),
        ("POST", "", {"apiKey": KEY}),
        ("GET", "/mine", None),
        ("PATCH", "/mine", {"enabled": False}),
        ("DELETE", "/mine", None),
        ("POST", "/mine/test", None),
    ]
    for headers in (stranger.owner, stranger.key, stranger.member):
        for method, suffix, body in routes:
            response = await api.request(method, tenant.base + suffix, json=body, headers=headers)
            assert_error(response, 404, "project_not_found")
    # Through the tenant's own project, the stranger's custom LLM does not exist.
    for method, suffix, body in routes[2:]:
        path = tenant.base + suffix.replace("mine", "theirs")
        response = await api.request(method, path, json=body, headers=tenant.owner)
        assert_error(response, 404, "custom_llm_not_found")
    still = await api.get(f"{tenant.base}/mine", headers=tenant.owner)
    assert still.status_code == 200
    assert still.json()["enabled"] is True


# ----------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"apiKey": KEY, "unknown": 1}, "unknown"),
        ({"apiKey": KEY, "name": "Bob"}, "name"),
        ({"apiKey": KEY, "name": "-bob"}, "name"),
        ({"apiKey": KEY, "name": "bob/x"}, "name"),
        ({"apiKey": KEY, "name": "bob\n"}, "name"),
        ({"apiKey": KEY, "name": "b" * 65}, "name"),
        ({"apiKey": KEY, "template": "gpt"}, "template"),
        ({"apiKey": "has space"}, "apiKey"),
        ({"apiKey": "line\nbreak"}, "apiKey"),
        ({"apiKey": ""}, "apiKey"),
        ({"apiKey": None}, "apiKey"),
        ({"secretId": "not-a-uuid"}, "secretId"),
        ({"apiKey": KEY, "enabled": "yes"}, "enabled"),
        (
            {
                "template": "custom",
                "baseUrl": "https://93.184.215.14/v1",
                "model": "m",
                "apiKey": KEY,
            },
            "name",
        ),
        ({"template": "custom", "name": "c", "model": "m", "apiKey": KEY}, "baseUrl"),
        (
            {"template": "custom", "name": "c", "baseUrl": "https://93.184.215.14", "apiKey": KEY},
            "model",
        ),
        (
            {**custom_body("x", baseUrl="https://93.184.215.14"), "authScheme": "basic"},
            "authScheme",
        ),
        (
            {**custom_body("x", baseUrl="https://93.184.215.14"), "maxInputTokens": 0},
            "maxInputTokens",
        ),
        (
            {**custom_body("x", baseUrl="https://93.184.215.14"), "maxOutputTokens": -1},
            "maxOutputTokens",
        ),
        ({**custom_body("x", baseUrl="https://93.184.215.14"), "model": " m"}, "model"),
        ({**custom_body("x", baseUrl="https://93.184.215.14"), "provider": ""}, "provider"),
    ],
)
async def test_bad_create_bodies_are_400_naming_the_field(
    api: httpx.AsyncClient, tenant: Tenant, body: dict[str, Any], param: str
) -> None:
    response = await api.post(tenant.base, json=body, headers=tenant.owner)
    error = assert_error(response, 400)
    assert error["param"] == param, error


@pytest.mark.parametrize(
    ("base_url", "code"),
    [
        ("ftp://93.184.215.14/v1", "invalid_base_url"),
        ("https://user:pw@93.184.215.14/v1", "invalid_base_url"),
        ("https://93.184.215.14/v1?key=1", "invalid_base_url"),
        ("https://2130706433/v1", "invalid_base_url"),
        ("not a url", "invalid_base_url"),
    ],
)
async def test_bad_base_urls_are_400(
    api: httpx.AsyncClient, tenant: Tenant, base_url: str, code: str
) -> None:
    response = await api.post(
        tenant.base, json=custom_body("x", baseUrl=base_url), headers=tenant.owner
    )
    assert assert_error(response, 400, code)["param"] == "baseUrl"


async def test_bad_bodies_and_update_bodies_are_400(
    api: httpx.AsyncClient, tenant: Tenant, fake: tuple[FakeOpenAI, str]
) -> None:
    _, url = fake
    assert_error(await api.post(tenant.base, content=b"[1]", headers=tenant.owner), 400)
    assert_error(
        await api.post(tenant.base, content=b"{", headers=tenant.owner), 400, "invalid_json"
    )
    assert_error(await api.post(tenant.base, headers=tenant.owner), 400)
    await created(api, tenant, custom_body(url))
    for body, param in (
        ({"unknown": True}, "unknown"),
        ({"name": "NOPE"}, "name"),
        ({"name": None}, "name"),
        ({"maxInputTokens": 0}, "maxInputTokens"),
        ({"enabled": None}, "enabled"),
        ({"authScheme": "token"}, "authScheme"),
        ({"baseUrl": "gopher://x"}, "baseUrl"),
        ({"apiKey": KEY, "secretId": str(uuid.uuid4())}, "secretId"),
        ({"authScheme": "none", "apiKey": KEY}, "apiKey"),
    ):
        response = await api.patch(f"{tenant.base}/mine", json=body, headers=tenant.owner)
        assert assert_error(response, 400)["param"] == param, body
    assert_error(await api.patch(f"{tenant.base}/mine", content=b"[", headers=tenant.owner), 400)


# ----------------------------------------------------------------- catalog and directory


async def test_enabled_custom_llms_join_the_runtime_catalog(
    api: httpx.AsyncClient, resources: Resources, tenant: Tenant, fake: tuple[FakeOpenAI, str]
) -> None:
    _, url = fake
    before = await catalog_llms(api, tenant)
    assert not any(i.startswith("custom:") for i in before)
    await created(api, tenant, {"apiKey": KEY})
    await created(api, tenant, custom_body(url, name="off", enabled=False))
    llms = await catalog_llms(api, tenant)
    assert llms["custom:bob"] == {
        "id": "custom:bob",
        "name": "bob",
        "enabled": True,
        "supportsTools": False,
        "supportsImages": False,
        "contextWindowTokens": 200000,
        "maxOutputTokens": 40000,
        "tags": [],
    }
    assert "custom:off" not in llms
    # Custom entries come after the profiles.
    ids = list(llms)
    assert ids[-1] == "custom:bob"

    await api.patch(f"{tenant.base}/off", json={"enabled": True}, headers=tenant.owner)
    await api.patch(f"{tenant.base}/bob", json={"enabled": False}, headers=tenant.owner)
    llms = await catalog_llms(api, tenant)
    assert "custom:bob" not in llms
    assert llms["custom:off"]["contextWindowTokens"] == 32000 + 4000
    await api.patch(f"{tenant.base}/off", json={"name": "on"}, headers=tenant.owner)
    llms = await catalog_llms(api, tenant)
    assert "custom:on" in llms
    assert "custom:off" not in llms
    await api.delete(f"{tenant.base}/on", headers=tenant.owner)
    assert not any(i.startswith("custom:") for i in await catalog_llms(api, tenant))

    listing = await resources.custom_llms.directory.listing(UUID(tenant.project_id))
    assert listing == []
    disabled = await resources.custom_llms.directory.target(UUID(tenant.project_id), "bob")
    assert disabled is not None
    assert disabled.enabled is False


async def test_another_replica_sees_changes_through_events(cluster: Cluster) -> None:
    a, b = cluster.loose, cluster.strict
    tenant = await new_tenant(a.http)
    project_id = UUID(tenant.project_id)
    assert await b.resources.custom_llms.directory.target(project_id, "bob") is None  # cached empty
    assert "custom:bob" not in await catalog_llms(b.http, tenant)
    await created(a.http, tenant, {"apiKey": KEY})

    async def seen() -> bool:
        return "custom:bob" in await catalog_llms(b.http, tenant)

    await eventually(seen, within=5.0)
    target = await b.resources.custom_llms.directory.target(project_id, "bob")
    assert target is not None
    assert target.api_key == KEY

    await a.http.patch(
        f"{tenant.base}/bob", json={"apiKey": "sk-rotated-key-7777"}, headers=tenant.owner
    )

    async def rotated() -> bool:
        again = await b.resources.custom_llms.directory.target(project_id, "bob")
        return again is not None and again.api_key == "sk-rotated-key-7777"

    await eventually(rotated, within=5.0)


async def test_a_secret_rotation_reaches_every_replica_and_steady_state_reads_no_database(
    cluster: Cluster,
) -> None:
    a, b = cluster.loose, cluster.strict
    tenant = await new_tenant(a.http)
    project_id = UUID(tenant.project_id)
    secret_id = await new_secret(a.http, tenant, "first-value-0001")
    await created(a.http, tenant, {"secretId": secret_id})
    for replica in (a, b):
        target = await replica.resources.custom_llms.directory.target(project_id, "bob")
        assert target is not None
        assert target.api_key == "first-value-0001"

    # Warm: no query at all, however many calls.
    with statements(a.resources) as seen:
        for _ in range(20):
            target = await a.resources.custom_llms.directory.target(project_id, "bob")
            assert target is not None
            await a.resources.custom_llms.directory.listing(project_id)
    assert seen == []

    rotated = await a.http.put(
        f"/api/projects/{tenant.project_id}/secrets/{secret_id}/value",
        json={"value": "second-value-0002"},
        headers=tenant.owner,
    )
    assert rotated.status_code == 200, rotated.text
    for replica in (a, b):
        directory = replica.resources.custom_llms.directory

        async def current(directory: Any = directory) -> bool:
            again = await directory.target(project_id, "bob")
            return again is not None and again.api_key == "second-value-0002"

        await eventually(current, within=5.0)


# ----------------------------------------------------------------- the directory alone


def stored(project_id: UUID, name: str, **fields: Any) -> StoredLlm:
    values: dict[str, Any] = {
        "id": uuid.uuid4(),
        "project_id": project_id,
        "name": name,
        "template": "custom",
        "base_url": "https://llm.example/v1",
        "model": "m",
        "auth_scheme": "bearer",
        "provider": "acme",
        "max_input_tokens": 1000,
        "max_output_tokens": 100,
        "enabled": True,
        "secret_id": uuid.uuid4(),
        "api_key_encrypted": None,
    }
    values.update(fields)
    return StoredLlm(**values)


class Backing:
    """An in-memory database and secret store for a directory, counting reads; a
    test may hold reads (after they looked) at a gate to interleave invalidations."""

    def __init__(self) -> None:
        self.rows: dict[UUID, list[StoredLlm]] = {}
        self.secrets: dict[UUID, str] = {}
        self.loads = 0
        self.reveals = 0
        self.load_gate: asyncio.Event | None = None
        self.reveal_gate: asyncio.Event | None = None
        self.held = asyncio.Event()
        """Set when a read reaches its gate."""

    async def load(self, project_id: UUID) -> list[StoredLlm]:
        self.loads += 1
        rows = list(self.rows.get(project_id, []))
        if self.load_gate is not None:
            self.held.set()
            await self.load_gate.wait()
        return rows

    async def reveal(self, project_id: UUID, secret_id: UUID) -> str:
        self.reveals += 1
        value = self.secrets[secret_id]
        if self.reveal_gate is not None:
            self.held.set()
            await self.reveal_gate.wait()
        return value

    def directory(self, **options: Any) -> CustomLlmDirectory:
        return CustomLlmDirectory(
            self.load, reveal=self.reveal, open_key=lambda llm: "typed-key", **options
        )


async def test_concurrent_misses_share_one_read_and_one_reveal() -> None:
    backing = Backing()
    project = uuid.uuid4()
    row = stored(project, "a")
    backing.rows[project] = [row]
    assert row.secret_id is not None
    backing.secrets[row.secret_id] = "v1"
    directory = backing.directory()
    targets = await asyncio.gather(*(directory.target(project, "a") for _ in range(20)))
    assert {t.api_key for t in targets if t is not None} == {"v1"}
    assert (backing.loads, backing.reveals) == (1, 1)
    assert await directory.target(project, "missing") is None
    assert (backing.loads, backing.reveals) == (1, 1)


async def test_a_key_read_overtaken_by_a_rotation_is_not_cached() -> None:
    backing = Backing()
    project = uuid.uuid4()
    row = stored(project, "a")
    assert row.secret_id is not None
    backing.rows[project] = [row]
    backing.secrets[row.secret_id] = "old"
    directory = backing.directory()
    backing.reveal_gate = asyncio.Event()
    pending = asyncio.ensure_future(directory.target(project, "a"))
    await backing.held.wait()
    # The secret rotates (and its event arrives) after the value was read.
    backing.secrets[row.secret_id] = "new"
    directory.invalidate_project(project)
    backing.reveal_gate.set()
    first = await pending
    assert first is not None
    assert first.api_key == "old"  # that caller gets what it read...
    again = await directory.target(project, "a")  # ...but it was not kept
    assert again is not None
    assert again.api_key == "new"
    assert (backing.loads, backing.reveals) == (2, 2)


async def test_a_project_read_overtaken_by_a_change_is_not_cached() -> None:
    backing = Backing()
    project = uuid.uuid4()
    directory = backing.directory()
    backing.load_gate = asyncio.Event()
    pending = asyncio.ensure_future(directory.listing(project))
    await backing.held.wait()
    backing.rows[project] = [stored(project, "late")]
    directory.invalidate_project(project)
    backing.load_gate.set()
    assert await pending == []
    assert [e.llm_id for e in await directory.listing(project)] == ["custom:late"]
    assert backing.loads == 2


async def test_the_oldest_project_is_dropped_past_the_bound() -> None:
    backing = Backing()
    directory = backing.directory(max_projects=2)
    projects = [uuid.uuid4() for _ in range(3)]
    for project in projects:
        await directory.listing(project)
    assert len(directory) == 2
    await directory.listing(projects[0])  # re-read: it was the one dropped
    assert backing.loads == 4
    assert parse_llm_id("custom:bob") == "bob"
    assert parse_llm_id("custom:") is None
    assert parse_llm_id("gpt-4o") is None
