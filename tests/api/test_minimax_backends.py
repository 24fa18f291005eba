"""``minimax-cloud`` backends through the real app: registration rules, health from a
real probe of the fake MiniMax server, what the gateway does with their models, and
the dashboard's backend pages and form for the kind."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from typing import Any

import pytest

from app.fakes.minimax_upstream import FakeMinimax
from app.fakes.serve import serve_asgi
from tests.support.api import (
    Client,
    create_api_key,
    eventually,
    resources_of,
    set_user_flags,
    user_with_id,
)
from tests.support.helpers import assert_error, bearer, console_login, new_project
from tests.support.routing import (
    ADMIN,
    admin_client,
    backend,
    register_backend,
    routing_settings,
    unique_name,
    wait_healthy,
)

__all__ = ["admin_client", "routing_settings"]

KEY = "mm-admin-key-" + "m" * 20
MODELS = ["MiniMax-Hailuo-02", "T2V-01-Director"]
CSRF = re.compile(r'"X-CSRF-Token": "([^"]+)"')
HTMX = {"HX-Request": "true"}

Minimax = tuple[FakeMinimax, str]


@pytest.fixture
async def minimax() -> AsyncIterator[Minimax]:
    fake = FakeMinimax("mm-admin", api_key=KEY)
    async with serve_asgi(fake) as url:
        yield fake, url


def registration(url: str, **changes: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "name": unique_name("mm"),
        "type": "minimax-cloud",
        "url": url,
        "api_key": KEY,
        "models": MODELS,
    }
    body.update(changes)
    return {k: v for k, v in body.items() if v is not ...}


# ---------------------------------------------------------------- registration


async def test_register_a_minimax_backend_and_watch_it_turn_healthy(
    admin_client: Client, minimax: Minimax
) -> None:
    fake, url = minimax
    body = registration(url, type=" MiniMax-Cloud ")
    response = await register_backend(admin_client, **body)
    assert response.status_code == 201, response.text
    assert KEY not in response.text
    created = response.json()
    assert (created["type"], created["has_api_key"], created["models"]) == (
        "minimax-cloud",
        True,
        MODELS,
    )
    shown = await wait_healthy(admin_client, body["name"])
    assert shown["health"]["reason"] == "ok"
    assert shown["advertised_models"] == MODELS  # the static list alone: no discovery
    # The probe is an authenticated query that created nothing.
    probes = fake.requests_for("/v1/query/video_generation")
    assert probes
    assert probes[-1].headers["authorization"] == f"Bearer {KEY}"
    assert probes[-1].path == "/v1/query/video_generation?task_id=arona-probe"
    assert fake.stats.creates == 0
    state = resources_of(admin_client).backend_registry.get(body["name"])
    assert state is not None
    assert state.adapter.capabilities == frozenset({"video"})


@pytest.mark.parametrize("models", [..., []])
async def test_a_minimax_backend_needs_its_models(
    admin_client: Client, minimax: Minimax, models: Any
) -> None:
    body = registration(minimax[1], models=models)
    error = assert_error(await register_backend(admin_client, **body), 400, "models_required")
    assert error["param"] == "models"
    assert_error(await backend(admin_client, body["name"]), 404, "backend_not_found")


@pytest.mark.parametrize("api_key", [..., None, ""])
async def test_a_minimax_backend_needs_its_key(
    admin_client: Client, minimax: Minimax, api_key: Any
) -> None:
    body = registration(minimax[1], api_key=api_key)
    error = assert_error(await register_backend(admin_client, **body), 400, "api_key_required")
    assert error["param"] == "api_key"
    assert_error(await backend(admin_client, body["name"]), 404, "backend_not_found")


async def test_the_models_rule_comes_before_the_key_rule(
    admin_client: Client, minimax: Minimax
) -> None:
    body = registration(minimax[1], models=[], api_key=None)
    assert_error(await register_backend(admin_client, **body), 400, "models_required")


async def test_other_kinds_still_register_without_models_or_key(admin_client: Client) -> None:
    response = await register_backend(
        admin_client, name=unique_name("ext"), type="external", url="http://127.0.0.1:9"
    )
    assert response.status_code == 201, response.text


async def test_the_url_must_be_http_for_minimax(admin_client: Client) -> None:
    body = registration("ws://127.0.0.1:9")
    error = assert_error(await register_backend(admin_client, **body), 400, "invalid_url")
    assert "http://" in error["message"]


# ---------------------------------------------------------------------- health


async def test_a_wrong_key_turns_the_backend_unhealthy(
    admin_client: Client, minimax: Minimax
) -> None:
    fake, url = minimax
    body = registration(url, api_key="not-the-key")
    assert (await register_backend(admin_client, **body)).status_code == 201
    last: dict[str, Any] = {}

    async def unhealthy() -> bool:
        last.update((await backend(admin_client, body["name"])).json())
        return bool(last["health"]["status"] == "unhealthy")

    await eventually(unhealthy, within=5)
    assert last["health"]["reason"].startswith("authentication failed (1004)")
    assert fake.stats.unauthorized >= 1


async def test_a_backend_out_of_balance_is_unhealthy_with_the_reason(
    admin_client: Client, minimax: Minimax
) -> None:
    fake, url = minimax
    fake.control.poll_error = 1008
    body = registration(url)
    assert (await register_backend(admin_client, **body)).status_code == 201

    async def unhealthy() -> bool:
        shown = (await backend(admin_client, body["name"])).json()
        return bool(shown["health"]["reason"] == "insufficient balance (1008): fake error 1008")

    await eventually(unhealthy, within=5)


async def test_an_unreachable_minimax_backend_is_unhealthy(admin_client: Client) -> None:
    body = registration("http://127.0.0.1:9")
    assert (await register_backend(admin_client, **body)).status_code == 201

    async def refused() -> bool:
        shown = (await backend(admin_client, body["name"])).json()
        return bool(shown["health"]["reason"] == "connection refused")

    await eventually(refused, within=5)


# --------------------------------------------------------------------- gateway


async def test_chat_for_a_video_model_is_a_404_and_never_reaches_minimax(
    admin_client: Client, minimax: Minimax
) -> None:
    fake, url = minimax
    model = f"video-only-{unique_name()}"
    body = registration(url, models=[model])
    fake.control.models = []  # accept any model, should a call get through
    assert (await register_backend(admin_client, **body)).status_code == 201
    await wait_healthy(admin_client, body["name"])
    _, user, _ = await user_with_id(admin_client)
    project = await new_project(admin_client, user)
    key = bearer((await create_api_key(admin_client, project["id"], user))["key"])
    listed = await admin_client.get("/v1/models", headers=key)
    assert listed.status_code == 200, listed.text
    assert model in [m["id"] for m in listed.json()["data"]]
    response = await admin_client.post(
        "/v1/chat/completions",
        json={"model": model, "messages": [{"role": "user", "content": "hi"}]},
        headers=key,
    )
    error = assert_error(response, 404, "model_not_found")
    assert "a video model" in error["message"]
    assert fake.stats.creates == 0
    assert {r.path.split("?")[0] for r in fake.requests} == {"/v1/query/video_generation"}


# -------------------------------------------------------------------- dashboard


async def _admin_session(client: Client) -> str:
    """Sign a platform admin in through the console; returns the CSRF token."""
    email, _, user_id = await user_with_id(client, "mm-admin")
    await set_user_flags(resources_of(client).settings, user_id, is_admin=True)
    response = await console_login(client, email)
    assert response.status_code == 303, response.text
    client.cookies.set("arona_session", response.cookies["arona_session"])
    page = await client.get("/projects")
    found = CSRF.search(page.text)
    assert found, page.text
    return found.group(1)


async def test_the_dashboard_shows_and_validates_minimax_backends(
    admin_client: Client, minimax: Minimax
) -> None:
    body = registration(minimax[1])
    assert (await register_backend(admin_client, **body)).status_code == 201
    csrf = await _admin_session(admin_client)
    page = await admin_client.get("/admin/backends")
    assert page.status_code == 200, page.text
    assert body["name"] in page.text
    assert "MiniMax video (cloud)" in page.text  # the type choice
    rows = await admin_client.get("/admin/backend-rows", headers=HTMX)
    assert rows.status_code == 200, rows.text
    assert f'id="backend-{body["name"]}"' in rows.text
    form = await admin_client.get("/admin/backend-form?type=minimax-cloud", headers=HTMX)
    assert form.status_code == 200, form.text
    assert "video generation only" in form.text
    edit = await admin_client.get(f"/admin/backends/{body['name']}/edit", headers=HTMX)
    assert edit.status_code == 200, edit.text
    assert KEY not in edit.text

    headers = {"X-CSRF-Token": csrf, **HTMX}
    fields = {"type": "minimax-cloud", "name": unique_name("mm"), "url": minimax[1]}
    no_models = await admin_client.post("/admin/backends", data=fields, headers=headers)
    assert "list the ones it serves in models" in no_models.text
    no_key = await admin_client.post(
        "/admin/backends", data={**fields, "models": "MiniMax-Hailuo-02"}, headers=headers
    )
    assert "needs its API key" in no_key.text
    assert_error(await backend(admin_client, fields["name"]), 404, "backend_not_found")
    created = await admin_client.post(
        "/admin/backends",
        data={**fields, "models": "MiniMax-Hailuo-02", "api_key": KEY},
        headers=headers,
    )
    assert created.status_code == 200, created.text
    assert "registered" in created.headers["hx-trigger"]
    stored = (await admin_client.get(f"/api/admin/backends/{fields['name']}", headers=ADMIN)).json()
    assert (stored["type"], stored["has_api_key"]) == ("minimax-cloud", True)
