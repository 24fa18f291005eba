"""OpenAI-compatible adapter: health probes and model discovery against real servers."""

from __future__ import annotations

import time

import msgspec
import pytest

from app.fakes import FakeOpenAI, serve_asgi
from app.lib.http import PROBE_TIMEOUT_SECONDS, UpstreamHttp
from app.routing.backends.openai import OpenAICompatibleBackend
from app.routing.types import BackendSpec
from tests.support.upstreams import PATH_PREFIX, UPSTREAM_KEY, ScriptedUpstream, Served


def backend(url: str, http: UpstreamHttp, api_key: str | None = None) -> OpenAICompatibleBackend:
    return OpenAICompatibleBackend(BackendSpec("b1", "external", url, api_key=api_key), http)


async def test_probe_discovers_models_root_style(
    openai_upstream: Served[FakeOpenAI], http: UpstreamHttp
) -> None:
    openai_upstream.fake.control.models = ["m-one", "m-two"]
    result = await backend(openai_upstream.url, http).probe()
    assert result.healthy
    assert result.models == ("m-one", "m-two")
    assert openai_upstream.fake.requests_for("/v1/models")


async def test_probe_path_style_uses_the_prefix(
    openai_upstream: Served[FakeOpenAI], http: UpstreamHttp
) -> None:
    result = await backend(openai_upstream.url + PATH_PREFIX + "/", http).probe()
    assert result.healthy
    assert result.models == ("gpt-4o-mini", "text-embedding-3-small")
    assert [r.path for r in openai_upstream.fake.requests] == [f"{PATH_PREFIX}/models"]


@pytest.mark.parametrize(
    ("listing", "expected"),
    [
        ({"data": [{"id": "a"}, {"id": "b"}]}, ("a", "b")),
        ({"models": [{"name": "n1"}, {"name": "n2", "id": 7}]}, ("n1", "n2")),
        ({"data": ["s1", "s2", "s1"]}, ("s1", "s2")),
        ({"models": ["x", {"id": "y"}, {"name": "z"}]}, ("x", "y", "z")),
        (
            {"data": [None, 3, {"id": ""}, {"other": "q"}, ["nested"], {"id": "ok"}, "  "]},
            ("ok",),
        ),
        ({"data": "not-a-list", "models": {"id": "nope"}}, ()),
        (["bare", {"id": "list"}], ("bare", "list")),
        ({"object": "list"}, ()),
    ],
)
async def test_probe_discovery_shapes(
    listing: object, expected: tuple[str, ...], http: UpstreamHttp
) -> None:
    upstream = ScriptedUpstream([msgspec.json.encode(listing)], content_type=b"application/json")
    async with serve_asgi(upstream) as url:
        result = await backend(url, http).probe()
    assert result.healthy
    assert result.models == expected


async def test_probe_non_json_listing_is_healthy_without_models(http: UpstreamHttp) -> None:
    upstream = ScriptedUpstream([b"<html>hi</html>"], content_type=b"text/html")
    async with serve_asgi(upstream) as url:
        result = await backend(url, http).probe()
    assert result.healthy
    assert result.models == ()


async def test_probe_listing_404_is_healthy_static_only(
    openai_upstream: Served[FakeOpenAI], http: UpstreamHttp
) -> None:
    openai_upstream.fake.control.listing_404 = True
    result = await backend(openai_upstream.url, http).probe()
    assert result.healthy
    assert result.models == ()
    assert "404" in result.reason
    assert "static models only" in result.reason


@pytest.mark.parametrize("status", [500, 503, 401])
async def test_probe_error_status_is_unhealthy(
    status: int, openai_upstream: Served[FakeOpenAI], http: UpstreamHttp
) -> None:
    openai_upstream.fake.control.fail_status = status
    result = await backend(openai_upstream.url, http).probe()
    assert not result.healthy
    assert result.reason == f"status {status}"
    assert result.models == ()


async def test_probe_hang_is_unhealthy_by_timeout(
    openai_upstream: Served[FakeOpenAI], http: UpstreamHttp
) -> None:
    openai_upstream.fake.control.hang = True
    started = time.monotonic()
    result = await backend(openai_upstream.url, http).probe()
    elapsed = time.monotonic() - started
    assert not result.healthy
    assert result.reason == f"timeout after {PROBE_TIMEOUT_SECONDS}s"
    assert elapsed >= PROBE_TIMEOUT_SECONDS * 0.9  # it did wait for the deadline...
    assert elapsed < PROBE_TIMEOUT_SECONDS * 5  # ...and not for the default read timeout


async def test_probe_connection_refused_is_unhealthy(refused_url: str, http: UpstreamHttp) -> None:
    result = await backend(refused_url, http).probe()
    assert not result.healthy
    assert result.reason == "connection refused"


async def test_probe_bad_url_is_unhealthy_and_does_not_raise(http: UpstreamHttp) -> None:
    result = await backend("ftp://example.invalid", http).probe()
    assert not result.healthy
    assert result.reason


async def test_probe_sends_the_backend_key(
    keyed_upstream: Served[FakeOpenAI], http: UpstreamHttp
) -> None:
    assert (await backend(keyed_upstream.url, http, api_key=UPSTREAM_KEY).probe()).healthy
    unauthorized = await backend(keyed_upstream.url, http, api_key="wrong").probe()
    assert not unauthorized.healthy
    assert unauthorized.reason == "status 401"
    headers = [r.headers.get("authorization") for r in keyed_upstream.fake.requests]
    assert headers == [f"Bearer {UPSTREAM_KEY}", "Bearer wrong"]
