"""Small helpers for API tests: unique users, login, auth headers, waiting."""

from __future__ import annotations

import asyncio
import contextlib
import re
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from litestar.testing import AsyncTestClient

PASSWORD = "correct horse battery"


def unique_email(tag: str = "user") -> str:
    return f"{tag}-{uuid.uuid4().hex[:12]}@example.com"


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def register(
    client: AsyncTestClient[Any], email: str | None = None, password: str = PASSWORD
) -> dict[str, Any]:
    email = email or unique_email()
    response = await client.post("/api/auth/register", json={"email": email, "password": password})
    assert response.status_code == 201, response.text
    body: dict[str, Any] = response.json()
    return body


async def login(
    client: AsyncTestClient[Any], email: str, password: str = PASSWORD
) -> dict[str, Any]:
    response = await client.post("/api/auth/login", json={"email": email, "password": password})
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


async def new_user(client: AsyncTestClient[Any], tag: str = "user") -> tuple[str, dict[str, str]]:
    """Register and log in a fresh user; returns (email, auth headers)."""
    email = unique_email(tag)
    await register(client, email)
    tokens = await login(client, email)
    return email, bearer(tokens["accessToken"])


async def new_project(
    client: AsyncTestClient[Any], headers: dict[str, str], name: str = "Acme"
) -> dict[str, Any]:
    slug = f"p-{uuid.uuid4().hex[:12]}"
    response = await client.post(
        "/api/projects", json={"name": name, "slug": slug}, headers=headers
    )
    assert response.status_code == 201, response.text
    body: dict[str, Any] = response.json()
    return body


OPTIONAL_ERROR_FIELDS = frozenset({"upstream_status"})
"""Fields the error object may carry beside the standard four (docs/api.md)."""


def assert_error(response: Any, status: int, code: str | None = None) -> dict[str, Any]:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"}, body
    error: dict[str, Any] = body["error"]
    assert set(error) - OPTIONAL_ERROR_FIELDS == {"message", "type", "code", "param"}, error
    if "upstream_status" in error:  # a 502 says what the upstream answered, when it did
        assert status == 502, error
        assert isinstance(error["upstream_status"], int), error
    assert isinstance(error["message"], str)
    assert error["message"]
    if code is not None:
        assert error["code"] == code, error
    return error


async def until(condition: Callable[[], bool], within: float = 2.0, step: float = 0.005) -> None:
    """Wait until ``condition()`` holds (something another task or process changes);
    ``TimeoutError`` past ``within`` seconds."""
    async with asyncio.timeout(within):
        while True:
            if condition():
                return
            await asyncio.sleep(step)


@contextlib.asynccontextmanager
async def running(*loops: Callable[[], Awaitable[None]]) -> AsyncIterator[None]:
    """Run each loop (a follower, a subscriber) as a task for the block, then cancel it;
    a moment is left for them to subscribe before the block starts."""
    tasks = [asyncio.ensure_future(loop()) for loop in loops]
    await asyncio.sleep(0.01)
    try:
        yield
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


_FORM_TOKEN = re.compile(r'name="csrf_token" value="([^"]*)"')


async def console_login(
    http: Any, email: str, password: str = PASSWORD, *, follow_redirects: bool = False
) -> Any:
    """Sign a client (httpx or Litestar's test client, which keep cookies) into the
    console as a browser does: load the form (its CSRF cookie and token), then post it."""
    page = await http.get("/login")
    found = _FORM_TOKEN.search(page.text)
    assert found is not None, page.text
    return await http.post(
        "/login",
        data={"email": email, "password": password, "csrf_token": found.group(1)},
        follow_redirects=follow_redirects,
    )


def custom_llm_body(name: str, url: str, model: str, **fields: Any) -> dict[str, Any]:
    """A Custom-template custom LLM on ``url`` (an OpenAI-compatible fake's base);
    ``fields`` add its credential (``apiKey`` or ``secretId``) or change the rest."""
    return {
        "template": "custom",
        "name": name,
        "baseUrl": f"{url}/v1",
        "model": model,
        "authScheme": "bearer",
        "provider": "lab",
        "maxInputTokens": 32000,
        "maxOutputTokens": 4000,
        **fields,
    }
