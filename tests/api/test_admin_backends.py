"""Backend admin API through the real app: registration, health, validation, auth.

Upstreams are real servers on loopback ports (``app.fakes``); the fake OpenAI server
demands the registered API key, so a backend turning healthy proves the stored key
was decrypted and sent.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from litestar.testing import AsyncTestClient
from sqlalchemy import select

from app.db.models import BackendConfig
from app.fakes.ollama_upstream import FakeOllama
from app.fakes.openai_upstream import FakeOpenAI
from app.fakes.serve import serve_asgi
from app.lib.settings import Settings
from app.server.resources import Resources
from tests.support.api import (
    Client,
    create_api_key,
    eventually,
    resources_of,
    set_user_flags,
    user_with_id,
)
from tests.support.auth import execute
from tests.support.helpers import assert_error, new_project
from tests.support.live_server import live_server
from tests.support.routing import (
    ADMIN,
    BACKEND_FIELDS,
    UPSTREAM_KEY,
    Upstream,
    admin_client,
    backend,
    register_backend,
    routing_settings,
    unique_name,
    upstream,
    wait_healthy,
)
from tests.support.settings import AppFactory, with_settings

__all__ = ["admin_client", "routing_settings", "upstream"]

ISO_UTC = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?(Z|\+00:00)$")


def assert_no_key(response: Any) -> None:
    assert UPSTREAM_KEY not in response.text
    assert UPSTREAM_KEY[-8:] not in response.text


# ---------------------------------------------------------------- register / read


def served_body(name: str, url: str, **extra: Any) -> dict[str, Any]:
    """An external backend with a key, serving model ``m``."""
    return {
        "name": name,
        "type": "external",
        "url": url,
        "api_key": UPSTREAM_KEY,
        "models": ["m"],
        **extra,
    }


async def test_register_an_external_backend_and_watch_it_turn_healthy(
    admin_client: Client, upstream: Upstream
) -> None:
    fake, url = upstream
    name = unique_name("ext")
    response = await register_backend(
        admin_client,
        name=name,
        type="external",
        url=url,
        api_key=UPSTREAM_KEY,
        models=["my-static-model"],
    )
    assert response.status_code == 201, response.text
    assert_no_key(response)
    body = response.json()
    assert set(body) == BACKEND_FIELDS
    assert body["name"] == name
    assert body["type"] == "external"
    assert body["url"] == url
    assert body["has_api_key"] is True
    assert body["models"] == ["my-static-model"]
    assert body["tags"] == []
    assert body["breaker"] == {
        "state": "closed",
        "consecutive_failures": 0,
        "open_seconds_left": 0.0,
        "cooling_seconds_left": 0.0,
    }
    assert body["in_flight"] == 0
    assert ISO_UTC.match(body["created_at"])
    assert ISO_UTC.match(body["updated_at"])
    # Fail-closed until probed; the probe starts at once and may already be done.
    health = body["health"]
    assert set(health) == {"status", "reason", "checked_at"}
    assert (health["status"], health["reason"], health["checked_at"]) == (
        "unknown",
        "not probed yet",
        None,
    ) or health["status"] == "healthy"

    shown = await wait_healthy(admin_client, name)
    assert ISO_UTC.match(shown["health"]["checked_at"])
    # The static list first, then what the upstream's listing added.
    assert shown["advertised_models"] == [
        "my-static-model",
        "gpt-4o-mini",
        "text-embedding-3-small",
    ]
    assert shown["models"] == ["my-static-model"]
    # The probe reached the upstream with the stored key.
    [*_, probe] = fake.requests_for("/models")
    assert probe.headers["authorization"] == f"Bearer {UPSTREAM_KEY}"

    state = resources_of(admin_client).backend_registry.get(name)
    assert state is not None
    assert state.health.healthy
    listed = await admin_client.get("/api/admin/backends?limit=500", headers=ADMIN)
    assert listed.status_code == 200, listed.text
    assert_no_key(listed)
    page = listed.json()
    assert set(page) == {"items", "total", "limit", "offset"}
    assert (page["limit"], page["offset"]) == (500, 0)
    [item] = [i for i in page["items"] if i["name"] == name]
    assert item["health"]["status"] == "healthy"


async def test_the_key_is_stored_encrypted_and_bound_to_its_row(
    admin_client: Client, upstream: Upstream
) -> None:
    _, url = upstream
    name = unique_name("enc")
    response = await register_backend(
        admin_client, name=name, type="external", url=url, api_key=UPSTREAM_KEY
    )
    assert response.status_code == 201, response.text
    settings = resources_of(admin_client).settings
    [(stored,)] = await execute(
        settings, select(BackendConfig.api_key_encrypted).where(BackendConfig.name == name)
    )
    assert stored.startswith("v1:k1:")
    assert UPSTREAM_KEY not in stored


async def test_a_backend_without_a_reachable_upstream_turns_unhealthy(
    admin_client: Client,
) -> None:
    name = unique_name("dead")
    # Port 9 (discard) on loopback: nothing listens, the probe is refused at once.
    response = await register_backend(
        admin_client, name=name, type="external", url="http://127.0.0.1:9"
    )
    assert response.status_code == 201, response.text

    async def unhealthy() -> bool:
        return bool((await backend(admin_client, name)).json()["health"]["status"] == "unhealthy")

    await eventually(unhealthy, within=5)


async def test_pagination_of_the_backend_list(admin_client: Client, upstream: Upstream) -> None:
    _, url = upstream
    prefix = unique_name("page")
    for n in range(3):
        response = await register_backend(
            admin_client, name=f"{prefix}-{n}", type="external", url=url
        )
        assert response.status_code == 201, response.text
    everything = (await admin_client.get("/api/admin/backends?limit=500", headers=ADMIN)).json()
    names = [i["name"] for i in everything["items"]]
    assert names == sorted(names)
    assert everything["total"] == len(names)
    second = (await admin_client.get("/api/admin/backends?limit=1&offset=1", headers=ADMIN)).json()
    assert [i["name"] for i in second["items"]] == names[1:2]
    assert second["total"] == everything["total"]
    assert_error(await admin_client.get("/api/admin/backends?limit=0", headers=ADMIN), 400)


async def test_registering_an_existing_name_replaces_it(
    admin_client: Client, upstream: Upstream
) -> None:
    _fake, url = upstream
    name = unique_name("swap")
    first = await register_backend(
        admin_client, name=name, type="external", url=url, api_key=UPSTREAM_KEY, models=["a"]
    )
    assert first.status_code == 201, first.text
    await wait_healthy(admin_client, name)
    registry = resources_of(admin_client).backend_registry
    old_state = registry.get(name)

    other = FakeOpenAI("other", models=["other-model"])
    async with serve_asgi(other) as other_url:
        second = await register_backend(
            admin_client, name=name, type="EXTERNAL", url=other_url, models=["b", "c"]
        )
        assert second.status_code == 201, second.text
        body = second.json()
        assert body["type"] == "external"
        assert body["url"] == other_url
        assert body["has_api_key"] is False
        assert body["models"] == ["b", "c"]
        assert body["created_at"] == first.json()["created_at"]
        shown = await wait_healthy(admin_client, name)
        assert shown["advertised_models"] == ["b", "c", "other-model"]
        assert registry.get(name) is not old_state
        assert other.requests_for("/models")
        # The replaced key is gone: nothing was sent with it to the new upstream.
        assert all("authorization" not in r.headers for r in other.requests_for("/models"))
    listed = (await admin_client.get("/api/admin/backends?limit=500", headers=ADMIN)).json()
    assert [i["name"] for i in listed["items"]].count(name) == 1


# ---------------------------------------------------------------- probing on demand


@dataclass
class Live:
    http: httpx.AsyncClient
    resources: Resources


@pytest.fixture
async def live(routing_settings: Settings, make_app: AppFactory) -> AsyncIterator[Live]:
    """The app on a loopback port, in the test's loop (a probe answered while the call
    asking for it waits needs both running at once), with periodic rounds that never
    come: every probe a test sees is one it made."""
    app = make_app(with_settings(routing_settings, health_interval_seconds=3600.0))
    async with live_server(app) as url, httpx.AsyncClient(base_url=url, timeout=30) as http:
        yield Live(http, app.state.resources)


def probes_at(fake: FakeOpenAI) -> int:
    return len(fake.requests_for("/models"))


async def probe_now(client: Client | httpx.AsyncClient, name: str) -> Any:
    return await client.post(f"/api/admin/backends/{name}/probe", headers=ADMIN)


async def test_the_probe_route_makes_a_fixed_backend_healthy_at_once(
    live: Live, upstream: Upstream
) -> None:
    fake, url = upstream
    name = unique_name("probe")
    response = await register_backend(
        live.http, name=name, type="external", url=url, api_key=UPSTREAM_KEY, models=["m"]
    )
    assert response.status_code == 201, response.text
    healthy = await wait_healthy(live.http, name)
    probes = probes_at(fake)

    fake.control.fail_status = 503  # the upstream breaks: a probe marks it down
    down = await probe_now(live.http, name)
    assert down.status_code == 200, down.text
    assert_no_key(down)
    body = down.json()
    assert set(body) == BACKEND_FIELDS
    assert (body["name"], body["type"], body["url"]) == (name, "external", url)
    assert body["health"]["status"] == "unhealthy"
    assert "503" in body["health"]["reason"]
    assert body["health"]["checked_at"] > healthy["health"]["checked_at"]
    assert (await backend(live.http, name)).json()["health"]["status"] == "unhealthy"

    fake.control.fail_status = None  # fixed: the next probe, asked for now, says so
    up = await probe_now(live.http, name)
    assert up.status_code == 200, up.text
    assert up.json()["health"]["status"] == "healthy"
    assert up.json()["advertised_models"] == ["m", "gpt-4o-mini", "text-embedding-3-small"]
    assert (await backend(live.http, name)).json()["health"]["status"] == "healthy"
    assert probes_at(fake) == probes + 2  # one upstream probe per call, sent with the key
    assert all(
        r.headers.get("authorization") == f"Bearer {UPSTREAM_KEY}"
        for r in fake.requests_for("/models")
    )


async def test_probing_an_unknown_backend_is_404(live: Live) -> None:
    assert_error(await probe_now(live.http, unique_name("nobody")), 404, "backend_not_found")


async def test_registering_the_same_body_again_probes_at_once(
    live: Live, upstream: Upstream
) -> None:
    fake, url = upstream
    name = unique_name("again")
    body = served_body(name, url, tags=["t"])
    assert (await register_backend(live.http, **body)).status_code == 201
    await wait_healthy(live.http, name)
    registry = live.resources.backend_registry
    state = registry.get(name)
    fake.control.fail_status = 503
    await live.resources.health_checker.probe_all()  # a round marks it down
    assert (await backend(live.http, name)).json()["health"]["status"] == "unhealthy"
    fake.control.fail_status = None
    probes = probes_at(fake)

    again = await register_backend(live.http, **body)
    assert again.status_code == 201, again.text
    shown = await wait_healthy(live.http, name, within=5.0)
    assert shown["advertised_models"] == ["m", "gpt-4o-mini", "text-embedding-3-small"]
    assert probes_at(fake) == probes + 1
    # Nothing changed, so nothing was replaced: breaker, load and discovery kept.
    assert registry.get(name) is state


async def test_ollama_backends_ignore_api_key_and_models(admin_client: Client) -> None:
    fake = FakeOllama("ollama", models=["llama3:latest"])
    async with serve_asgi(fake) as url:
        name = unique_name("ollama")
        response = await register_backend(
            admin_client,
            name=name,
            type="ollama",
            url=url,
            api_key=UPSTREAM_KEY,
            models=["ignored-model"],
        )
        assert response.status_code == 201, response.text
        assert_no_key(response)
        body = response.json()
        assert body["type"] == "ollama"
        assert body["has_api_key"] is False
        assert body["models"] == []
        shown = await wait_healthy(admin_client, name)
        assert shown["advertised_models"] == ["llama3:latest"]
    settings = resources_of(admin_client).settings
    [(stored_key, stored_models)] = await execute(
        settings,
        select(BackendConfig.api_key_encrypted, BackendConfig.models).where(
            BackendConfig.name == name
        ),
    )
    assert (stored_key, stored_models) == (None, [])


# ---------------------------------------------------------------- tags


async def test_tags_are_trimmed_deduplicated_stored_and_given_to_routing(
    admin_client: Client, upstream: Upstream
) -> None:
    _, url = upstream
    name = unique_name("tags")
    response = await register_backend(
        admin_client,
        name=name,
        type="vllm",
        url=url,
        api_key=UPSTREAM_KEY,
        tags=[" general ", "smart", "general", "GPU-a100", "smart "],
    )
    assert response.status_code == 201, response.text
    # Trimmed, first occurrence kept, order kept, case kept.
    assert response.json()["tags"] == ["general", "smart", "GPU-a100"]
    assert (await backend(admin_client, name)).json()["tags"] == ["general", "smart", "GPU-a100"]
    listed = (await admin_client.get("/api/admin/backends?limit=500", headers=ADMIN)).json()
    [item] = [i for i in listed["items"] if i["name"] == name]
    assert item["tags"] == ["general", "smart", "GPU-a100"]
    settings = resources_of(admin_client).settings
    [(stored,)] = await execute(
        settings, select(BackendConfig.tags).where(BackendConfig.name == name)
    )
    assert stored == ["general", "smart", "GPU-a100"]
    state = resources_of(admin_client).backend_registry.get(name)
    assert state is not None
    assert state.spec.tags == frozenset({"general", "smart", "GPU-a100"})


async def test_a_change_of_tags_alone_reaches_the_registry(
    admin_client: Client, upstream: Upstream
) -> None:
    _, url = upstream
    name = unique_name("retag")
    body = served_body(name, url)
    assert (await register_backend(admin_client, **body, tags=["general"])).status_code == 201
    await wait_healthy(admin_client, name)
    registry = resources_of(admin_client).backend_registry

    def tags_in_registry() -> frozenset[str]:
        state = registry.get(name)
        assert state is not None
        return state.spec.tags

    assert tags_in_registry() == frozenset({"general"})

    retagged = await register_backend(admin_client, **body, tags=["general", "smart"])
    assert retagged.status_code == 201, retagged.text
    assert retagged.json()["tags"] == ["general", "smart"]
    assert tags_in_registry() == frozenset({"general", "smart"})
    await wait_healthy(admin_client, name)

    # Omitting tags clears them, like every other field of a re-registration.
    cleared = await register_backend(admin_client, **body)
    assert cleared.json()["tags"] == []
    assert tags_in_registry() == frozenset()


# ---------------------------------------------------------------- max_concurrency


async def test_max_concurrency_is_stored_shown_changed_cleared_and_given_to_routing(
    admin_client: Client, upstream: Upstream
) -> None:
    _, url = upstream
    name = unique_name("slots")
    body: dict[str, Any] = {"name": name, "type": "vllm", "url": url, "api_key": UPSTREAM_KEY}
    registry = resources_of(admin_client).backend_registry
    settings = resources_of(admin_client).settings

    def in_registry() -> tuple[int | None, int | None]:
        """What the router sees: the spec, and the capacity its load estimate uses."""
        state = registry.get(name)
        assert state is not None
        return state.spec.max_concurrency, state.load.max_concurrency

    async def stored() -> int | None:
        [(value,)] = await execute(
            settings, select(BackendConfig.max_concurrency).where(BackendConfig.name == name)
        )
        return value  # type: ignore[no-any-return]

    created = await register_backend(admin_client, **body, max_concurrency=64)
    assert created.status_code == 201, created.text
    assert created.json()["max_concurrency"] == 64
    assert (await backend(admin_client, name)).json()["max_concurrency"] == 64
    listed = (await admin_client.get("/api/admin/backends?limit=500", headers=ADMIN)).json()
    [item] = [i for i in listed["items"] if i["name"] == name]
    assert item["max_concurrency"] == 64
    assert await stored() == 64
    assert in_registry() == (64, 64)
    await wait_healthy(admin_client, name)

    # A change of it alone reaches routing at once; the largest value is accepted.
    changed = await register_backend(admin_client, **body, max_concurrency=100_000)
    assert changed.status_code == 201, changed.text
    assert changed.json()["max_concurrency"] == 100_000
    assert in_registry() == (100_000, 100_000)
    assert await stored() == 100_000

    # null clears it (routing learns the capacity from the metrics again) ...
    cleared = await register_backend(admin_client, **body, max_concurrency=None)
    assert cleared.status_code == 201, cleared.text
    assert cleared.json()["max_concurrency"] is None
    assert in_registry() == (None, None)
    assert await stored() is None

    # ... and so does a re-registration without it, like every other field.
    assert (await register_backend(admin_client, **body, max_concurrency=1)).status_code == 201
    assert in_registry() == (1, 1)
    omitted = await register_backend(admin_client, **body)
    assert omitted.json()["max_concurrency"] is None
    assert in_registry() == (None, None)


async def test_a_refused_max_concurrency_leaves_the_backend_as_it_was(
    admin_client: Client, upstream: Upstream
) -> None:
    _, url = upstream
    name = unique_name("slots-bad")
    body: dict[str, Any] = {"name": name, "type": "vllm", "url": url, "api_key": UPSTREAM_KEY}
    assert (await register_backend(admin_client, **body, max_concurrency=8)).status_code == 201
    for bad in (0, 100_001, "many"):
        error = assert_error(await register_backend(admin_client, **body, max_concurrency=bad), 400)
        assert (error["code"], error["param"]) == ("invalid_request", "max_concurrency")
    assert (await backend(admin_client, name)).json()["max_concurrency"] == 8
    state = resources_of(admin_client).backend_registry.get(name)
    assert state is not None
    assert state.spec.max_concurrency == 8


async def test_the_largest_tag_lists_are_accepted_and_ollama_keeps_its_tags(
    admin_client: Client,
) -> None:
    tags = [f"{n:02d}" + "t" * 62 for n in range(32)]
    response = await register_backend(
        admin_client, name=unique_name(), type="external", url="http://127.0.0.1:1", tags=tags
    )
    assert response.status_code == 201, response.text
    assert response.json()["tags"] == tags
    ollama = await register_backend(
        admin_client, name=unique_name(), type="ollama", url="http://127.0.0.1:1", tags=["cpu"]
    )
    assert ollama.status_code == 201, ollama.text
    assert ollama.json()["tags"] == ["cpu"]


# ---------------------------------------------------------------- validation


async def test_comfyui_is_refused(admin_client: Client) -> None:
    response = await register_backend(
        admin_client, name=unique_name(), type="comfyui", url="http://127.0.0.1:8188"
    )
    error = assert_error(response, 400)
    assert error["message"] == "comfyui backend removed"
    assert error["param"] == "type"


async def test_an_unknown_type_is_refused(admin_client: Client) -> None:
    response = await register_backend(
        admin_client, name=unique_name(), type="mainframe", url="http://127.0.0.1:1"
    )
    error = assert_error(response, 400, "unknown_type")
    assert error["param"] == "type"


async def test_agent_backend_names_are_reserved(admin_client: Client) -> None:
    name = unique_name("agent")
    response = await register_backend(
        admin_client, name=name, type="external", url="http://127.0.0.1:1"
    )
    error = assert_error(response, 400, "reserved_name")
    assert error["param"] == "name"
    assert_error(await backend(admin_client, name), 404, "backend_not_found")


@pytest.mark.parametrize(
    ("kind", "url", "message"),
    [
        ("engine", "http://127.0.0.1:1", "url must start with ws:// or wss://"),
        ("external", "ws://127.0.0.1:1", "url must start with http:// or https://"),
        ("engine", "evernight://node", "evernight url needs a service"),
    ],
)
async def test_the_url_scheme_follows_the_type(
    admin_client: Client, kind: str, url: str, message: str
) -> None:
    response = await register_backend(admin_client, name=unique_name(), type=kind, url=url)
    error = assert_error(response, 400, "invalid_url")
    assert error["param"] == "url"
    assert message in error["message"]


BAD_BODIES: list[tuple[dict[str, Any], str]] = [
    ({"name": "has space"}, "name"),
    ({"name": "slash/name"}, "name"),
    ({"name": ""}, "name"),
    ({"name": "x" * 101}, "name"),
    ({"url": "ftp://example.com"}, "url"),
    ({"url": "ws://127.0.0.1:9000"}, "url"),
    ({"url": "127.0.0.1:8000"}, "url"),
    ({"url": "http://"}, "url"),
    ({"url": "http://user:secret@example.com"}, "url"),
    ({"url": "http://example.com:99999"}, "url"),
    ({"url": "http://example.com/?q=1"}, "url"),
    ({"url": "http://example.com/" + "a" * 2048}, "url"),
    ({"models": [""]}, "models[0]"),
    ({"models": ["ok", "   "]}, "models[1]"),
    ({"models": ["m" * 201]}, "models[0]"),
    ({"models": [f"m{n}" for n in range(1001)]}, "models"),
    ({"models": "gpt-4o"}, "models"),
    ({"tags": [""]}, "tags[0]"),
    ({"tags": ["ok", "   "]}, "tags[1]"),
    ({"tags": ["t" * 65]}, "tags[0]"),
    ({"tags": [f"t{n}" for n in range(33)]}, "tags"),
    ({"tags": "general"}, "tags"),
    ({"tags": ["general", 7]}, "tags[1]"),
    ({"max_concurrency": 0}, "max_concurrency"),
    ({"max_concurrency": -4}, "max_concurrency"),
    ({"max_concurrency": 100_001}, "max_concurrency"),
    ({"max_concurrency": 2.5}, "max_concurrency"),
    ({"max_concurrency": "sixty-four"}, "max_concurrency"),
    ({"max_concurrency": True}, "max_concurrency"),
    ({"maxConcurrency": 64}, "maxConcurrency"),
    ({"tags": None}, "tags"),
    ({"unexpected": True}, "unexpected"),
]


async def test_bad_registrations_are_400_naming_the_field(admin_client: Client) -> None:
    for change, param in BAD_BODIES:
        body = {"name": unique_name(), "type": "external", "url": "http://127.0.0.1:1", **change}
        response = await register_backend(admin_client, **body)
        error = assert_error(response, 400)
        assert error["param"] == param, (change, error)
    for missing in ("name", "type", "url"):
        body = {"name": unique_name(), "type": "external", "url": "http://127.0.0.1:1"}
        del body[missing]
        assert assert_error(await register_backend(admin_client, **body), 400)["param"] == missing


async def test_a_thousand_models_are_accepted(admin_client: Client) -> None:
    models = [f"model-{n}" for n in range(1000)]
    response = await register_backend(
        admin_client, name=unique_name(), type="external", url="http://127.0.0.1:1", models=models
    )
    assert response.status_code == 201, response.text
    assert response.json()["models"] == models


# ---------------------------------------------------------------- access


async def test_only_platform_admins_reach_the_backend_api(
    routing_settings: Settings, make_app: AppFactory
) -> None:
    async with AsyncTestClient(app=make_app(routing_settings)) as client:
        name = unique_name("auth")
        body = {"name": name, "type": "external", "url": "http://127.0.0.1:1"}
        routes = [
            ("POST", "/api/admin/backends", body),
            ("GET", "/api/admin/backends", None),
            ("GET", f"/api/admin/backends/{name}", None),
            ("DELETE", f"/api/admin/backends/{name}", None),
            ("POST", f"/api/admin/backends/{name}/probe", None),
        ]
        # Not an admin even if this happens to be the database's first user.
        _, user, user_id = await user_with_id(client)
        await set_user_flags(routing_settings, user_id, is_admin=False)
        project = await new_project(client, user)
        api_key = await create_api_key(client, project["id"], user)
        for method, path, json in routes:
            assert_error(await client.request(method, path, json=json), 401)
            assert_error(
                await client.request(method, path, json=json, headers=user), 403, "admin_required"
            )
            key_headers = {"Authorization": f"Bearer {api_key['key']}"}
            assert_error(await client.request(method, path, json=json, headers=key_headers), 403)
        assert (await client.get(f"/api/admin/backends/{name}", headers=ADMIN)).status_code == 404

        # A platform admin user and the operator token both work.
        _, admin_user, admin_id = await user_with_id(client, "admin")
        await set_user_flags(routing_settings, admin_id, is_admin=True)
        created = await client.post("/api/admin/backends", json=body, headers=admin_user)
        assert created.status_code == 201, created.text
        assert (await client.get(f"/api/admin/backends/{name}", headers=ADMIN)).status_code == 200
        probed = await client.post(f"/api/admin/backends/{name}/probe", headers=admin_user)
        assert probed.status_code == 200, probed.text
        deleted = await client.delete(f"/api/admin/backends/{name}", headers=admin_user)
        assert deleted.status_code == 204, deleted.text


async def test_the_admin_token_is_refused_when_not_configured(
    routing_settings: Settings, make_app: AppFactory
) -> None:
    settings = with_settings(routing_settings, admin_token=None)
    async with AsyncTestClient(app=make_app(settings)) as client:
        assert_error(await client.get("/api/admin/backends", headers=ADMIN), 401)


# ---------------------------------------------------------------- delete


async def test_delete_removes_it_and_a_second_delete_is_404(
    admin_client: Client, upstream: Upstream
) -> None:
    _, url = upstream
    name = unique_name("del")
    assert (
        await register_backend(admin_client, name=name, type="external", url=url)
    ).status_code == 201
    registry = resources_of(admin_client).backend_registry
    assert registry.get(name) is not None

    response = await admin_client.delete(f"/api/admin/backends/{name}", headers=ADMIN)
    assert response.status_code == 204, response.text
    assert response.content == b""
    assert registry.get(name) is None
    assert_error(await backend(admin_client, name), 404, "backend_not_found")
    assert_error(
        await admin_client.delete(f"/api/admin/backends/{name}", headers=ADMIN),
        404,
        "backend_not_found",
    )


async def test_a_refused_registration_never_echoes_the_key(admin_client: Client) -> None:
    base = {"type": "external", "url": "http://127.0.0.1:1", "api_key": UPSTREAM_KEY}
    bodies: list[dict[str, Any]] = [
        {**base, "name": "bad name"},
        {**base, "name": unique_name(), "api_key": UPSTREAM_KEY * 400},
        {**base, "name": unique_name(), "api_key": [UPSTREAM_KEY]},
        {**base, "name": unique_name(), "type": "comfyui"},
        {**base, "name": unique_name(), "type": "unknown"},
        {**base, "name": unique_name(), "url": f"http://user:{UPSTREAM_KEY}@127.0.0.1:1"},
        {**base, "name": unique_name(), "url": f"http://127.0.0.1:{UPSTREAM_KEY}"},
        {**base, "name": unique_name(), "url": f"http://[{UPSTREAM_KEY}"},
    ]
    for body in bodies:
        response = await register_backend(admin_client, **body)
        assert_error(response, 400)
        assert_no_key(response)
