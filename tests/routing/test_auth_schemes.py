"""How the OpenAI-compatible adapter sends a key: per scheme, and a call's override key
in place of the backend's own (never both)."""

from __future__ import annotations

import pytest

from app.fakes import FakeOpenAI
from app.lib.http import UpstreamHttp
from app.routing.backends.openai import OpenAICompatibleBackend
from app.routing.types import AuthScheme, BackendSpec
from tests.support.upstreams import Served, chat_call, collect


def backend(
    url: str, http: UpstreamHttp, key: str | None, scheme: AuthScheme = "bearer"
) -> OpenAICompatibleBackend:
    spec = BackendSpec("b1", "external", url, api_key=key, auth_scheme=scheme)
    return OpenAICompatibleBackend(spec, http)


def auth_of(fake: FakeOpenAI) -> tuple[str | None, str | None]:
    headers = fake.requests_for("/chat/completions")[-1].headers
    return headers.get("authorization"), headers.get("api-key")


@pytest.mark.parametrize(
    ("scheme", "expected"),
    [
        ("bearer", ("Bearer k-1", None)),
        ("ApiKey", ("ApiKey k-1", None)),
        ("api-key", (None, "k-1")),
        ("none", (None, None)),
    ],
)
async def test_each_scheme_sends_the_key_its_own_way(
    openai_upstream: Served[FakeOpenAI],
    http: UpstreamHttp,
    scheme: AuthScheme,
    expected: tuple[str | None, str | None],
) -> None:
    adapter = backend(openai_upstream.url, http, "k-1", scheme)
    await adapter.chat(chat_call("gpt-4o-mini"))
    assert auth_of(openai_upstream.fake) == expected
    await collect(await adapter.chat_stream(chat_call("gpt-4o-mini", stream=True)))
    assert auth_of(openai_upstream.fake) == expected


async def test_an_override_key_replaces_the_backends_own(
    openai_upstream: Served[FakeOpenAI], http: UpstreamHttp
) -> None:
    adapter = backend(openai_upstream.url, http, "backend-key", "api-key")
    call = chat_call("gpt-4o-mini")
    call.api_key = "project-own-key"
    await adapter.chat(call)
    assert auth_of(openai_upstream.fake) == (None, "project-own-key")

    streamed = chat_call("gpt-4o-mini", stream=True)
    streamed.api_key = "project-own-key"
    await collect(await adapter.chat_stream(streamed))
    assert auth_of(openai_upstream.fake) == (None, "project-own-key")

    # The next ordinary call is back on the backend's key.
    await adapter.chat(chat_call("gpt-4o-mini"))
    assert auth_of(openai_upstream.fake) == (None, "backend-key")


async def test_an_override_key_reaches_a_backend_that_has_none(
    openai_upstream: Served[FakeOpenAI], http: UpstreamHttp
) -> None:
    adapter = backend(openai_upstream.url, http, None)
    call = chat_call("gpt-4o-mini")
    call.api_key = "byo"
    await adapter.chat(call)
    assert auth_of(openai_upstream.fake) == ("Bearer byo", None)
