"""The fake upstreams themselves: HTTP control, recording, shutdown, the CLI."""

from __future__ import annotations

import asyncio
import signal
import sys
import time

import httpx
import pytest

from app.fakes import FakeOllama, FakeOpenAI, serve_asgi
from tests.support.upstreams import UPSTREAM_KEY, Served, eventually

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


async def test_control_endpoint_steers_the_openai_fake(
    openai_upstream: Served[FakeOpenAI], web: httpx.AsyncClient
) -> None:
    url = openai_upstream.url
    changed = await web.post(f"{url}/__fake/control", json={"fail_status": 503, "models": ["z"]})
    assert changed.status_code == 200
    assert changed.json()["control"]["fail_status"] == 503
    failed = await web.get(f"{url}/v1/models")
    assert failed.status_code == 503
    assert failed.json()["error"]["type"] == "server_error"
    stats = (await web.get(f"{url}/__fake/stats")).json()
    assert stats["name"] == "alpha"
    assert stats["stats"]["failures"] == 1
    assert stats["stats"]["requests"] == 1  # control calls are not counted
    await web.post(f"{url}/__fake/control", json={"fail_status": None})
    listing = await web.get(f"{url}/v1/models")
    assert [m["id"] for m in listing.json()["data"]] == ["z"]
    reset = await web.post(f"{url}/__fake/control", json={"reset": True, "chunks": 2})
    assert reset.json()["control"]["models"] == ["gpt-4o-mini", "text-embedding-3-small"]
    assert reset.json()["stats"]["requests"] == 0
    assert openai_upstream.fake.control.chunks == 2


@pytest.mark.parametrize("patch", [{"bogus": 1}, {"hang": "yes"}, {"fail_status": "500"}])
async def test_control_endpoint_rejects_bad_switches(
    patch: dict[str, object], openai_upstream: Served[FakeOpenAI], web: httpx.AsyncClient
) -> None:
    response = await web.post(f"{openai_upstream.url}/__fake/control", json=patch)
    assert response.status_code == 400
    assert openai_upstream.fake.control.fail_status is None
    assert openai_upstream.fake.control.hang is False


async def test_control_endpoint_steers_the_ollama_fake(
    ollama_upstream: Served[FakeOllama], web: httpx.AsyncClient
) -> None:
    url = ollama_upstream.url
    await web.post(f"{url}/__fake/control", json={"models": ["qwen:7b"], "content": "yo there"})
    tags = (await web.get(f"{url}/api/tags")).json()
    assert [m["name"] for m in tags["models"]] == ["qwen:7b"]
    chat = await web.post(f"{url}/api/chat", json={**CHAT, "model": "qwen:7b", "stream": False})
    assert chat.json()["message"]["content"] == "yo there"
    assert (await web.post(f"{url}/api/chat", json={**CHAT, "stream": False})).status_code == 404
    await web.post(f"{url}/__fake/control", json={"listing_404": True})
    assert (await web.get(f"{url}/api/tags")).status_code == 404
    stats = (await web.get(f"{url}/__fake/stats")).json()["stats"]
    assert (stats["listings"], stats["chats"]) == (1, 1)


async def test_recording_and_auth(
    keyed_upstream: Served[FakeOpenAI], web: httpx.AsyncClient
) -> None:
    fake, url = keyed_upstream.fake, keyed_upstream.url
    assert (await web.post(f"{url}/v1/chat/completions", json=CHAT)).status_code == 401
    ok = await web.post(
        f"{url}/v1/chat/completions",
        json=CHAT,
        headers={"Authorization": f"Bearer {UPSTREAM_KEY}", "X-Trace": "t1"},
    )
    assert ok.json()["choices"][0]["message"]["content"] == "Hello from keyed"
    assert fake.stats.unauthorized == 1
    [first, second] = fake.requests_for("/chat/completions")
    assert first.body == CHAT
    assert second.headers["x-trace"] == "t1"
    assert (await web.get(f"{url}/__fake/stats")).status_code == 200  # control: no key
    fake.control.record_requests = False
    await web.get(f"{url}/v1/models")
    assert len(fake.requests) == 2


async def test_unknown_route_is_404(
    openai_upstream: Served[FakeOpenAI], web: httpx.AsyncClient
) -> None:
    response = await web.post(f"{openai_upstream.url}/v2/whatever", json={})
    assert response.status_code == 404
    assert "error" in response.json()


async def test_shutdown_releases_hung_requests(web: httpx.AsyncClient) -> None:
    fake = FakeOpenAI("hanger")
    fake.control.hang = True
    async with serve_asgi(fake) as url:
        pending = asyncio.create_task(web.get(f"{url}/v1/models"))
        await eventually(lambda: fake.stats.in_flight == 1)
        assert not pending.done()
    async with asyncio.timeout(10):
        response = await pending
    assert response.status_code == 503


async def test_reset_releases_hung_requests(
    openai_upstream: Served[FakeOpenAI], web: httpx.AsyncClient
) -> None:
    openai_upstream.fake.control.hang = True
    pending = asyncio.create_task(web.get(f"{openai_upstream.url}/v1/models"))
    await eventually(lambda: openai_upstream.fake.stats.in_flight == 1)
    openai_upstream.fake.reset()
    async with asyncio.timeout(5):
        assert (await pending).status_code == 503
    assert (await web.get(f"{openai_upstream.url}/v1/models")).status_code == 200
    assert openai_upstream.fake.stats.in_flight == 0


async def test_delay_holds_the_answer(
    openai_upstream: Served[FakeOpenAI], web: httpx.AsyncClient
) -> None:
    openai_upstream.fake.control.delay_seconds = 0.2
    started = time.monotonic()
    response = await web.get(f"{openai_upstream.url}/v1/models")
    assert response.status_code == 200
    assert time.monotonic() - started >= 0.2
    openai_upstream.fake.control.delay_seconds = 2.0  # longer than the client waits
    with pytest.raises(httpx.ReadTimeout):
        await web.get(f"{openai_upstream.url}/v1/models", timeout=httpx.Timeout(5.0, read=0.5))
    # The client gave up, so the fake stops waiting too.
    await eventually(lambda: openai_upstream.fake.stats.in_flight == 0)
    assert openai_upstream.fake.stats.disconnects == 1


async def test_module_runs_a_fake_in_another_process(web: httpx.AsyncClient) -> None:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "app.fakes",
        "--kind",
        "ollama",
        "--port",
        "0",
        "--name",
        "remote",
        "--models",
        "x:latest,y:latest",
        stdout=asyncio.subprocess.PIPE,
    )
    try:
        assert process.stdout is not None
        async with asyncio.timeout(30):
            line = (await process.stdout.readline()).decode()
        url = line.strip().rsplit(" ", 1)[-1]
        assert url.startswith("http://127.0.0.1:")
        tags = (await web.get(f"{url}/api/tags")).json()
        assert [m["name"] for m in tags["models"]] == ["x:latest", "y:latest"]
        await web.post(f"{url}/__fake/control", json={"fail_status": 500})
        assert (await web.post(f"{url}/api/chat", json=CHAT)).status_code == 500
    finally:
        if process.returncode is None:
            process.send_signal(signal.SIGTERM)
        async with asyncio.timeout(15):
            code = await process.wait()
    assert code == 0
