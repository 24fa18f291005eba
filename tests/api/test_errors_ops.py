"""The error shape for framework-level failures, and the operations endpoints."""

from __future__ import annotations

import asyncio
import json
import logging
import logging.config
from collections.abc import AsyncIterator
from dataclasses import replace

import httpx
import openai
import pytest
import uvicorn.config
from litestar import get
from litestar.testing import AsyncTestClient

from tests.support.api import create_api_key
from tests.support.helpers import assert_error, bearer, new_project, new_user
from tests.support.live_server import live_server
from tests.support.redis_instance import RedisInstance


async def test_unknown_route_is_a_404_in_the_error_shape(any_client):
    response = await any_client.get("/api/nope", headers={"X-Request-ID": "lost-1"})
    error = assert_error(response, 404, "not_found")
    assert error["type"] == "not_found_error"
    assert response.headers["x-request-id"] == "lost-1"


BROWSER_ACCEPT = "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8"
NO_SUCH_ROUTE = {
    "error": {
        "message": "no such route",
        "type": "not_found_error",
        "code": "not_found",
        "param": None,
    }
}


@pytest.mark.parametrize(
    "path",
    ["/api/nope", "/api/projects/0190a0a0-0000-7000-8000-000000000000/nothing", "/v1/nope"],
)
async def test_api_404s_stay_json_even_for_a_browser(client, path):
    """The console's HTML 404 page must not leak onto the APIs: the body is exactly
    the error shape, whatever the client says it accepts."""
    for accept in (BROWSER_ACCEPT, "*/*", "application/json"):
        response = await client.get(path, headers={"Accept": accept})
        assert response.status_code == 404
        assert response.headers["content-type"].startswith("application/json")
        assert response.json() == NO_SUCH_ROUTE


async def test_an_unknown_page_is_the_console_404_page_for_a_browser(client):
    response = await client.get("/console/does-not-exist", headers={"Accept": BROWSER_ACCEPT})
    assert response.status_code == 404
    assert response.headers["content-type"].startswith("text/html")
    assert "<h1>Not found</h1>" in response.text
    assert 'href="/projects"' in response.text
    # A client that did not ask for HTML (a script, curl) still gets the error shape.
    assert (await client.get("/console/does-not-exist")).json() == NO_SUCH_ROUTE


async def test_wrong_method_is_a_405_in_the_error_shape(any_client):
    assert_error(await any_client.put("/api/auth/login", json={}), 405, "method_not_allowed")


async def test_malformed_json_is_a_400(any_client):
    response = await any_client.post(
        "/api/auth/login",
        content=b'{"email": "a@b.c", "password": ',
        headers={"Content-Type": "application/json"},
    )
    assert_error(response, 400)


async def test_body_over_the_limit_is_a_413(make_app, pg_settings):
    settings = replace(pg_settings, max_body_bytes=2048)
    async with AsyncTestClient(app=make_app(settings)) as client:
        body = {"email": "big@example.com", "password": "x" * 4000}
        assert_error(await client.post("/api/auth/login", json=body), 413, "request_too_large")
        # Just under the limit is processed normally (here: a validation error, not 413).
        small = await client.post("/api/auth/login", json={"email": "x", "password": "y"})
        assert small.status_code == 400


async def test_gateway_bodies_over_the_limit_are_a_413(make_app, pg_settings):
    """The /v1 relay routes read their bodies themselves (raw ASGI, outside Litestar's
    limit): the same 413 in the same shape, through the openai SDK and without a
    Content-Length."""
    settings = replace(pg_settings, max_body_bytes=2048)
    app = make_app(settings)
    async with AsyncTestClient(app=app) as setup:
        _, owner = await new_user(setup)
        project = await new_project(setup, owner)
        key = (await create_api_key(setup, project["id"], owner))["key"]
    async with live_server(make_app(settings)) as url:
        sdk = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0)
        with pytest.raises(openai.APIStatusError) as chat:
            await sdk.chat.completions.create(
                model="m", messages=[{"role": "user", "content": "x" * 4000}]
            )
        with pytest.raises(openai.APIStatusError) as embed:
            await sdk.embeddings.create(model="m", input="x" * 4000)
        for raised in (chat.value, embed.value):
            assert_error(raised.response, 413, "request_too_large")
            assert raised.response.headers["x-request-id"]
        await sdk.close()

        async def streamed() -> AsyncIterator[bytes]:
            yield b'{"model": "m", "input": "'
            for _ in range(10):
                yield b"x" * 400
            yield b'"}'

        async with httpx.AsyncClient(base_url=url) as client:
            response = await client.post("/v1/embeddings", content=streamed(), headers=bearer(key))
        assert response.request.headers.get("transfer-encoding") == "chunked"
        assert_error(response, 413, "request_too_large")


async def test_cors_answers_only_the_listed_origins(make_app, sqlite_settings):
    listed, other = "https://console.example", "https://evil.example"
    app = make_app(replace(sqlite_settings, cors_origins=(listed,)))
    async with AsyncTestClient(app=app) as client:
        for path in ("/api/projects", "/v1/chat/completions"):
            preflight = await client.options(
                path,
                headers={
                    "Origin": listed,
                    "Access-Control-Request-Method": "POST",
                    "Access-Control-Request-Headers": "authorization, content-type",
                },
            )
            assert preflight.status_code in (200, 204), preflight.text
            assert preflight.headers["access-control-allow-origin"] == listed
            assert "POST" in preflight.headers["access-control-allow-methods"]
        simple = await client.get("/healthz", headers={"Origin": listed})
        assert simple.headers["access-control-allow-origin"] == listed
        refused = await client.get("/healthz", headers={"Origin": other})
        assert "access-control-allow-origin" not in refused.headers
        denied = await client.options(
            "/api/projects", headers={"Origin": other, "Access-Control-Request-Method": "POST"}
        )
        assert "access-control-allow-origin" not in denied.headers

    # The default (ARONA_CORS_ORIGINS unset): no origin gets CORS headers.
    async with AsyncTestClient(app=make_app(sqlite_settings)) as client:
        plain = await client.get("/healthz", headers={"Origin": listed})
        assert "access-control-allow-origin" not in plain.headers


async def test_unexpected_error_is_a_500_with_request_id_and_no_trace(make_app, pg_settings):
    @get("/test/explode", sync_to_thread=False)
    def explode() -> None:
        raise RuntimeError("secret internal detail")

    app = make_app(pg_settings)
    app.register(explode)
    async with AsyncTestClient(app=app) as client:
        response = await client.get("/test/explode", headers={"X-Request-ID": "req-123"})
    error = assert_error(response, 500, "internal_error")
    assert "req-123" in error["message"]
    assert "secret internal detail" not in response.text
    assert "Traceback" not in response.text
    assert response.headers["x-request-id"] == "req-123"


async def test_json_logs_are_one_object_per_line_with_the_request_id(
    make_app, sqlite_settings, capsys
):
    """``ARONA_LOG_FORMAT=json``: Arona's own events and the standard library's
    (uvicorn, SQLAlchemy) come out as one JSON object per line, and a line logged
    while serving a request carries its request id."""

    @get("/test/explode-logged", sync_to_thread=False)
    def explode() -> None:
        logging.getLogger("uvicorn.error").warning("stdlib line inside the request")
        raise RuntimeError("boom")

    # As the uvicorn CLI leaves things before it imports the app: its own handlers on
    # its loggers, propagation off. The app's configuration takes them back.
    logging.config.dictConfig(uvicorn.config.LOGGING_CONFIG)
    app = make_app(replace(sqlite_settings, log_format="json", log_level="INFO"))
    app.register(explode)
    async with AsyncTestClient(app=app) as client:
        capsys.readouterr()
        response = await client.get("/test/explode-logged", headers={"X-Request-ID": "req-json-1"})
        assert response.status_code == 500
        lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]

    events = [json.loads(line) for line in lines]  # every line parses
    stdlib = [e for e in events if e.get("event") == "stdlib line inside the request"]
    assert len(stdlib) == 1, lines
    assert stdlib[0]["logger"] == "uvicorn.error"
    assert stdlib[0]["level"] == "warning"
    assert stdlib[0]["request_id"] == "req-json-1"
    crash = [e for e in events if "RuntimeError" in e.get("exception", "")]
    assert len(crash) == 1, lines
    assert crash[0]["request_id"] == "req-json-1"
    assert crash[0]["level"] == "error"


async def test_console_logs_carry_the_request_id(make_app, sqlite_settings, capsys):
    @get("/test/log-console", sync_to_thread=False)
    def logged() -> None:
        logging.getLogger("sqlalchemy.engine").warning("stdlib console line")

    app = make_app(replace(sqlite_settings, log_format="console", log_level="INFO"))
    app.register(logged)
    async with AsyncTestClient(app=app) as client:
        capsys.readouterr()
        await client.get("/test/log-console", headers={"X-Request-ID": "req-console-1"})
        err = capsys.readouterr().err
    line = next(line for line in err.splitlines() if "stdlib console line" in line)
    assert "request_id=req-console-1" in line
    assert "[warning" in line


async def test_request_id_is_echoed_or_generated(any_client):
    given = await any_client.get("/healthz", headers={"X-Request-ID": "abc-42"})
    assert given.headers["x-request-id"] == "abc-42"
    generated = await any_client.get("/healthz")
    assert len(generated.headers["x-request-id"]) == 32
    hostile = await any_client.get("/healthz", headers={"X-Request-ID": "a b\tc" + "x" * 200})
    assert hostile.headers["x-request-id"] != "a b\tc" + "x" * 200
    assert len(hostile.headers["x-request-id"]) == 32


async def test_healthz_and_readyz(client):
    assert (await client.get("/healthz")).json() == {"status": "ok"}
    ready = await client.get("/readyz")
    assert ready.status_code == 200
    assert ready.json() == {
        "status": "ready",
        "checks": {"database": "ok", "redis": "ok", "usage_buffered": 0},
    }
    lenient = await client.get("/readyz", params={"allow_degraded": "true"})
    assert (lenient.status_code, lenient.json()) == (200, ready.json())


async def test_readyz_refuses_a_malformed_flag(client):
    response = await client.get("/readyz", params={"allow_degraded": "perhaps"})
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "invalid_request"
    assert response.json()["error"]["param"] == "allow_degraded"


async def test_readyz_without_redis_configured(make_app, sqlite_settings):
    async with AsyncTestClient(app=make_app(sqlite_settings)) as client:
        ready = await client.get("/readyz")
    assert ready.status_code == 200
    assert ready.json()["checks"] == {
        "database": "ok",
        "redis": "not configured",
        "usage_buffered": 0,
    }


async def test_readyz_reports_degraded_when_redis_goes_away(make_app, pg_settings, tmp_path):
    redis = RedisInstance(tmp_path)  # of its own: the shared Redis is never stopped
    await asyncio.to_thread(redis.start)
    try:
        settings = replace(pg_settings, redis_url=redis.url)
        async with AsyncTestClient(app=make_app(settings)) as client:
            assert (await client.get("/readyz")).status_code == 200
            await asyncio.to_thread(redis.kill)
            strict = await client.get("/readyz")
            # The strict view (monitors): a configured dependency is unreachable.
            assert strict.status_code == 503
            assert strict.json()["status"] == "degraded"
            assert strict.json()["checks"]["redis"] == "unreachable"
            assert strict.json()["checks"]["database"] == "ok"
            # The load balancer's view: still 200, since the replica keeps serving on
            # local state and must not be taken (with every other replica) out.
            response = await client.get("/readyz", params={"allow_degraded": "true"})
            assert response.status_code == 200
            assert response.json() == strict.json()
            # Liveness is about the process, not its dependencies.
            assert (await client.get("/healthz")).status_code == 200
    finally:
        await asyncio.to_thread(redis.kill)


async def test_metrics_count_requests_by_route_template(client):
    _, headers = await new_user(client)
    await client.get("/api/projects", headers=headers)
    await client.get("/api/does-not-exist")
    text = (await client.get("/metrics")).text
    assert 'arona_http_requests_total{method="GET",route="/api/projects",status="200"}' in text
    assert 'route="unmatched",status="404"' in text
    # Latency by route and status too: a fast 404 must not hide a slow 200.
    labels = 'method="GET",route="/api/projects",status="200"'
    assert f"arona_http_request_duration_seconds_count{{{labels}}} 1.0" in text
    assert (
        'arona_http_request_duration_seconds_bucket{le="+Inf",method="GET",route="unmatched",status="404"}'
        in text
    )


@pytest.mark.parametrize("path", ["/api/auth/me", "/api/projects"])
async def test_missing_credentials_are_a_401(any_client, path):
    response = await any_client.get(path)
    assert_error(response, 401, "missing_credentials")
    assert response.headers["www-authenticate"] == "Bearer"


async def test_openapi_schema_is_served_and_lists_the_api(client):
    response = await client.get("/schema/openapi.json")
    assert response.status_code == 200
    paths = response.json()["paths"]
    assert "/api/auth/login" in paths
    assert "/api/projects/{project_id}/api-keys" in paths
    assert "/healthz" not in paths


async def test_openapi_documents_every_error_in_the_one_shape(client):
    document = (await client.get("/schema/openapi.json")).json()
    assert set(document["components"]["schemas"]["Error"]["properties"]) == {"error"}
    missing = []
    for path, item in document["paths"].items():
        for method, operation in item.items():
            if method not in {"get", "post", "put", "patch", "delete"}:
                continue
            responses = operation["responses"]
            expected = {"400"}
            if "{" in path:
                expected.add("404")
            if not path.startswith(("/api/auth/login", "/api/auth/register", "/api/auth/refresh")):
                expected |= {"401", "403"}
            for status in expected - set(responses):
                missing.append(f"{method.upper()} {path}: {status}")
            for status, response in responses.items():
                if status.startswith(("4", "5")):
                    ref = response["content"]["application/json"]["schema"]["$ref"]
                    assert ref == "#/components/schemas/Error", (path, status)
    assert missing == []
    chat = document["paths"]["/api/runtime/chat"]["post"]["responses"]
    assert {"429", "502"} <= set(chat)


DOCUMENTED_SINCE_STEP_10 = [
    ("post", "/api/auth/login", {"401", "429"}),
    ("post", "/api/auth/refresh", {"401"}),
    ("post", "/api/auth/register", {"403", "409"}),
    ("post", "/api/runtime/conversations", {"404"}),
    ("post", "/api/admin/agent-deployments", {"404", "503"}),
    ("post", "/v1/video/generations", {"404", "429"}),
    ("get", "/api/projects", {"503"}),
]


async def test_openapi_lists_the_statuses_these_operations_really_answer(client):
    # Each was answered by the server and missing from the document; the suite keeps
    # the rest honest (tests/support/status_contract.py) and so does the schemathesis job.
    paths = (await client.get("/schema/openapi.json")).json()["paths"]
    for method, path, statuses in DOCUMENTED_SINCE_STEP_10:
        documented = set(paths[path][method]["responses"])
        assert statuses <= documented, (method, path, statuses - documented)
