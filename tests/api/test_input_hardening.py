"""Malformed input gets a 400 in the error shape, never a 500: NUL characters (which
PostgreSQL cannot store) in bodies, forms, path and query parameters, and JSON nested
past the bound, on every surface, before any database call.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
from litestar import Litestar
from litestar.testing import AsyncTestClient

from app.domain.conversations.schemas import MAX_MESSAGES
from app.domain.paging import MAX_OFFSET
from app.lib.input_checks import MAX_JSON_DEPTH
from app.lib.settings import Settings
from tests.support.api import create_runtime_token
from tests.support.helpers import (
    PASSWORD,
    assert_error,
    bearer,
    console_login,
    new_project,
    new_user,
    unique_email,
)
from tests.support.settings import AppFactory, with_settings

ADMIN_TOKEN = "hardening-admin-" + "h" * 32
ADMIN = bearer(ADMIN_TOKEN)
NUL = "a\x00b"


@pytest.fixture
async def app_client(
    pg_settings: Settings, make_app: AppFactory
) -> AsyncIterator[AsyncTestClient[Litestar]]:
    app = make_app(with_settings(pg_settings, admin_token=ADMIN_TOKEN))
    async with AsyncTestClient(app=app) as client:
        yield client


def nested(depth: int) -> bytes:
    """A login body nested ``depth`` levels deep (its own object is the first)."""
    return b'{"password": "p", "email": ' + b"[" * (depth - 1) + b"]" * (depth - 1) + b"}"


# -- NUL in stored text ----------------------------------------------------------------


async def test_nul_in_login_and_register_is_a_400_naming_the_field(
    app_client: AsyncTestClient[Litestar],
) -> None:
    for path in ("/api/auth/login", "/api/auth/register"):
        response = await app_client.post(path, json={"email": NUL, "password": PASSWORD})
        error = assert_error(response, 400, "unsupported_character")
        assert error["param"] == "email"
    # Register used to answer a misleading 409 for it; the address is still free.
    email = unique_email("nul")
    response = await app_client.post(
        "/api/auth/register", json={"email": email, "password": "pass\x00word-long-enough"}
    )
    assert_error(response, 400, "unsupported_character")
    response = await app_client.post(
        "/api/auth/register", json={"email": email, "password": PASSWORD}
    )
    assert response.status_code == 201, response.text


async def test_nul_in_a_stored_field_names_its_path(
    app_client: AsyncTestClient[Litestar],
) -> None:
    _, headers = await new_user(app_client, "nul")
    response = await app_client.post(
        "/api/projects", json={"name": NUL, "slug": f"p-{uuid.uuid4().hex[:8]}"}, headers=headers
    )
    assert assert_error(response, 400, "unsupported_character")["param"] == "name"
    project = await new_project(app_client, headers)
    response = await app_client.post(
        f"/api/projects/{project['id']}/secrets",
        json={"name": "ok", "value": "v\x00alue"},
        headers=headers,
    )
    assert assert_error(response, 400, "unsupported_character")["param"] == "value"


async def test_nul_in_a_runtime_turn_names_the_message(
    app_client: AsyncTestClient[Litestar],
) -> None:
    _, headers = await new_user(app_client, "rt")
    project = await new_project(app_client, headers)
    token = (await create_runtime_token(app_client, project["id"], headers))["token"]
    response = await app_client.post(
        "/api/runtime/chat",
        json={"messages": [{"role": "user", "content": "fine"}, {"role": "user", "content": NUL}]},
        headers=bearer(token),
    )
    error = assert_error(response, 400, "unsupported_character")
    assert error["param"] == "messages[1].content"


async def test_lone_surrogates_are_refused_as_invalid_json(
    app_client: AsyncTestClient[Litestar],
) -> None:
    response = await app_client.post(
        "/api/auth/login",
        content=b'{"email": "\\ud800@example.com", "password": "x"}',
        headers={"content-type": "application/json"},
    )
    assert_error(response, 400)


async def test_nul_in_a_console_form_is_refused(
    app_client: AsyncTestClient[Litestar],
) -> None:
    response = await console_login(app_client, NUL)
    assert response.status_code == 400, response.text
    assert "NUL character" in response.text


# -- path and query parameters, every documented operation -------------------------------


def _operations(schema: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    found = []
    for path, item in schema["paths"].items():
        for method, operation in item.items():
            if method in ("get", "post", "put", "patch", "delete"):
                found.append((method.upper(), path, operation))
    return found


def _params(operation: dict[str, Any], where: str) -> list[dict[str, Any]]:
    return [p for p in operation.get("parameters", []) if p.get("in") == where]


def _is_text(parameter: dict[str, Any]) -> bool:
    schema = parameter.get("schema", {})
    kinds = [schema, *schema.get("oneOf", []), *schema.get("anyOf", [])]
    return any(k.get("type") == "string" and "format" not in k for k in kinds)


def _refusal(response: Any) -> dict[str, Any] | None:
    """The error of a 400 ``unsupported_character``, else None."""
    if response.status_code != 400 or "json" not in response.headers.get("content-type", ""):
        return None
    error: dict[str, Any] = response.json()["error"]
    return error if error["code"] == "unsupported_character" else None


async def test_nul_in_any_path_or_query_parameter_is_never_a_500(
    app_client: AsyncTestClient[Litestar],
) -> None:
    schema = (await app_client.get("/schema/openapi.json")).json()
    checked = 0
    named: dict[str, int] = {}
    for method, path, operation in _operations(schema):
        path_params = _params(operation, "path")
        concrete = path
        for parameter in path_params:
            value = "a%00b" if _is_text(parameter) else str(uuid.uuid4())
            concrete = concrete.replace("{" + parameter["name"] + "}", value)
        targets: list[tuple[str, dict[str, Any] | None]] = []
        if any(_is_text(p) for p in path_params):
            targets.append((concrete, None))
        for parameter in _params(operation, "query"):
            plain = path
            for other in path_params:
                plain = plain.replace("{" + other["name"] + "}", str(uuid.uuid4()))
            targets.append((f"{plain}?{parameter['name']}=a%00b", parameter))
        for url, query in targets:
            response = await app_client.request(method, url, headers=ADMIN, json={})
            checked += 1
            assert response.status_code < 500, (method, url, response.text)
            refused = _refusal(response)
            if refused is not None:
                named[refused["param"]] = named.get(refused["param"], 0) + 1
                if query is not None:
                    assert refused["param"] == query["name"], (method, url, refused)
    assert checked > 20
    # The check was reached (not only refusals for other reasons), path and query alike.
    assert sum(named.values()) > 10, named
    assert "name" in named, named


async def test_nul_in_a_path_segment_names_the_parameter(
    app_client: AsyncTestClient[Litestar],
) -> None:
    response = await app_client.get("/api/admin/backends/a%00b", headers=ADMIN)
    error = assert_error(response, 400, "unsupported_character")
    assert error["param"] == "name"
    response = await app_client.get("/api/admin/backends?limit=5&status=a%00b", headers=ADMIN)
    assert response.status_code < 500


# -- JSON nesting ----------------------------------------------------------------------


async def test_json_nested_a_thousand_deep_is_a_400_before_authentication(
    app_client: AsyncTestClient[Litestar],
) -> None:
    for path in ("/api/auth/login", "/api/auth/register", "/api/projects"):
        response = await app_client.post(
            path, content=nested(1000), headers={"content-type": "application/json"}
        )
        assert_error(response, 400, "json_too_deep")


async def test_nesting_up_to_the_bound_is_accepted(
    app_client: AsyncTestClient[Litestar],
) -> None:
    response = await app_client.post(
        "/api/auth/login",
        content=nested(MAX_JSON_DEPTH),
        headers={"content-type": "application/json"},
    )
    # Parsed: what is refused now is the field's type, not the depth.
    error = assert_error(response, 400)
    assert error["code"] != "json_too_deep"
    assert error["param"] == "email"
    response = await app_client.post(
        "/api/auth/login",
        content=nested(MAX_JSON_DEPTH + 1),
        headers={"content-type": "application/json"},
    )
    assert_error(response, 400, "json_too_deep")


async def test_deep_json_on_the_runtime_api_is_a_400(
    app_client: AsyncTestClient[Litestar],
) -> None:
    _, headers = await new_user(app_client, "deep")
    project = await new_project(app_client, headers)
    token = (await create_runtime_token(app_client, project["id"], headers))["token"]
    body = b'{"messages": [{"role": "user", "content": ' + b"[" * 999 + b"]" * 999 + b"}]}"
    response = await app_client.post(
        "/api/runtime/chat",
        content=body,
        headers={**bearer(token), "content-type": "application/json"},
    )
    assert_error(response, 400, "json_too_deep")


# -- integers past any database integer ----------------------------------------------


def _is_integer(parameter: dict[str, Any]) -> bool:
    schema = parameter.get("schema", {})
    kinds = [schema, *schema.get("oneOf", []), *schema.get("anyOf", [])]
    return any(k.get("type") == "integer" for k in kinds)


@pytest.mark.parametrize("value", [str(2**63), str(10**30), "-1"])
async def test_huge_or_negative_integers_in_any_query_are_never_a_500(
    app_client: AsyncTestClient[Litestar], value: str
) -> None:
    schema = (await app_client.get("/schema/openapi.json")).json()
    pages = 0
    for method, path, operation in _operations(schema):
        concrete = path
        for parameter in _params(operation, "path"):
            concrete = concrete.replace("{" + parameter["name"] + "}", str(uuid.uuid4()))
        for parameter in _params(operation, "query"):
            if not _is_integer(parameter):
                continue
            url = f"{concrete}?{parameter['name']}={value}"
            response = await app_client.request(method, url, headers=ADMIN)
            assert response.status_code < 500, (method, url, response.text)
            if parameter["name"] in ("limit", "offset") and response.status_code == 400:
                pages += 1
                assert response.json()["error"]["param"] == parameter["name"], response.text
    assert pages >= 13  # every paginated list refuses it, naming the parameter


async def test_the_offset_bound_is_documented_and_shared(
    app_client: AsyncTestClient[Litestar],
) -> None:
    schema = (await app_client.get("/schema/openapi.json")).json()
    offsets = [
        parameter["schema"]
        for _, _, operation in _operations(schema)
        for parameter in _params(operation, "query")
        if parameter["name"] == "offset"
    ]
    assert len(offsets) >= 13
    for offset in offsets:
        assert offset.get("minimum") == 0, offset
        assert offset.get("maximum") == MAX_OFFSET, offset


async def test_a_request_carries_a_bounded_number_of_messages(
    app_client: AsyncTestClient[Litestar],
) -> None:
    _, headers = await new_user(app_client, "many")
    project = await new_project(app_client, headers)
    token = (await create_runtime_token(app_client, project["id"], headers))["token"]
    too_many = [{"role": "user", "content": ""}] * (MAX_MESSAGES + 1)
    for path, body in (
        ("/api/runtime/conversations", {"messages": too_many}),
        ("/api/runtime/chat", {"conversationId": str(uuid.uuid4()), "messages": too_many}),
    ):
        response = await app_client.post(path, json=body, headers=bearer(token))
        assert assert_error(response, 400)["param"] == "messages", path
