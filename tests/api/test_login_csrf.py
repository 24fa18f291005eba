"""Login CSRF: the console's log-in and register forms carry a token bound to a
pre-session cookie, so another site cannot sign a browser into its own account."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator

import httpx
import pytest
from litestar import Litestar
from litestar.testing import AsyncTestClient

from app.domain.web.presession import PRESESSION_COOKIE
from app.lib.settings import Settings
from tests.support.helpers import PASSWORD, console_login, register, unique_email
from tests.support.settings import AppFactory

TOKEN = re.compile(r'name="csrf_token" value="([^"]*)"')


@pytest.fixture
async def site(
    pg_settings: Settings, make_app: AppFactory
) -> AsyncIterator[AsyncTestClient[Litestar]]:
    async with AsyncTestClient(app=make_app(pg_settings)) as client:
        yield client


async def form_token(client: AsyncTestClient[Litestar], path: str) -> str:
    page = await client.get(path)
    assert page.status_code == 200, page.text
    found = TOKEN.search(page.text)
    assert found is not None, page.text
    assert found.group(1), page.text
    assert client.cookies.get(PRESESSION_COOKIE)
    return found.group(1)


def signed_in(response: httpx.Response) -> bool:
    return any(
        "arona_session=" in h and "Max-Age=0" not in h
        for h in response.headers.get_list("set-cookie")
    )


async def test_a_cross_site_login_without_the_token_signs_nobody_in(
    site: AsyncTestClient[Litestar],
) -> None:
    email = unique_email("victim")
    await register(site, email)
    # What an attacker's page can send: the credentials of its own account, no token.
    response = await site.post("/login", data={"email": email, "password": PASSWORD})
    assert response.status_code == 403, response.text
    assert "reload the page" in response.text
    assert not signed_in(response)
    # A token from another browser's cookie does not fit this one.
    other = await form_token(site, "/login")
    site.cookies.set(PRESESSION_COOKIE, "planted-by-a-sibling-site")
    response = await site.post(
        "/login", data={"email": email, "password": PASSWORD, "csrf_token": other}
    )
    assert response.status_code == 403
    assert not signed_in(response)


async def test_the_sites_own_form_logs_in(site: AsyncTestClient[Litestar]) -> None:
    email = unique_email("user")
    await register(site, email)
    response = await console_login(site, email)
    assert response.status_code == 303, response.text
    assert signed_in(response)
    # A wrong password on a genuine form is the usual message, and a fresh token.
    site.cookies.clear()
    response = await console_login(site, email, "not the password")
    assert response.status_code == 401
    assert TOKEN.search(response.text)


async def test_register_is_protected_the_same_way(site: AsyncTestClient[Litestar]) -> None:
    data = {"email": unique_email("new"), "password": PASSWORD, "name": "New"}
    response = await site.post("/register", data=data)
    assert response.status_code == 403
    assert not signed_in(response)
    token = await form_token(site, "/register")
    response = await site.post(
        "/register", data={**data, "csrf_token": token}, follow_redirects=False
    )
    assert response.status_code == 303, response.text
    assert signed_in(response)
