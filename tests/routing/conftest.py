"""Fixtures for the routing tests: fake upstreams on real loopback ports.

Each fake server is started once per session and reset before every test that uses
it, so tests see fresh switches, records and counters without paying for a restart.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest

from app.fakes import FakeOllama, FakeOpenAI, serve_asgi
from app.fakes.engine_echo import EchoEngine
from app.fakes.engine_misbehaving import MisbehavingEngine
from app.fakes.minimax_upstream import FakeMinimax
from app.lib.http import UpstreamHttp, build_http_client
from app.lib.ports import free_port
from app.routing.backends.engine import EngineBackend
from app.routing.types import BackendSpec
from tests.support.upstreams import (
    MINIMAX_KEY,
    PATH_PREFIX,
    UPSTREAM_KEY,
    EngineFactory,
    Served,
    ServedMinimax,
)


@pytest.fixture(scope="session")
async def http() -> AsyncIterator[UpstreamHttp]:
    """The adapters' upstream client, as the app builds it."""
    client = build_http_client()
    yield client
    await client.aclose()


@pytest.fixture
async def short_http() -> AsyncIterator[UpstreamHttp]:
    """An upstream client whose reads give up quickly, for upstreams that hang."""
    client = build_http_client(connect_timeout=5.0, read_timeout=0.5)
    yield client
    await client.aclose()


@pytest.fixture(scope="session")
async def web() -> AsyncIterator[httpx.AsyncClient]:
    """A plain HTTP client, for talking to the fakes themselves."""
    async with httpx.AsyncClient(trust_env=False) as client:
        yield client


@pytest.fixture(scope="session")
async def _openai_server() -> AsyncIterator[Served[FakeOpenAI]]:
    fake = FakeOpenAI("alpha", prefix=PATH_PREFIX)
    async with serve_asgi(fake) as url:
        yield Served(fake, url)


@pytest.fixture(scope="session")
async def _keyed_server() -> AsyncIterator[Served[FakeOpenAI]]:
    fake = FakeOpenAI("keyed", api_key=UPSTREAM_KEY)
    async with serve_asgi(fake) as url:
        yield Served(fake, url)


@pytest.fixture(scope="session")
async def _ollama_server() -> AsyncIterator[Served[FakeOllama]]:
    fake = FakeOllama("llama-box")
    async with serve_asgi(fake) as url:
        yield Served(fake, url)


@pytest.fixture
def openai_upstream(_openai_server: Served[FakeOpenAI]) -> Served[FakeOpenAI]:
    _openai_server.fake.reset()
    return _openai_server


@pytest.fixture
def keyed_upstream(_keyed_server: Served[FakeOpenAI]) -> Served[FakeOpenAI]:
    _keyed_server.fake.reset()
    return _keyed_server


@pytest.fixture
def ollama_upstream(_ollama_server: Served[FakeOllama]) -> Served[FakeOllama]:
    _ollama_server.fake.reset()
    return _ollama_server


@pytest.fixture
def refused_url() -> str:
    """A loopback URL nothing listens on."""
    return f"http://127.0.0.1:{free_port()}"


@pytest.fixture
async def echo_engine() -> AsyncIterator[EchoEngine]:
    """The reference CEP engine on a loopback port of its own (counters start at zero)."""
    async with EchoEngine() as engine:
        yield engine


@pytest.fixture
async def misbehaving_engine() -> AsyncIterator[MisbehavingEngine]:
    async with MisbehavingEngine() as engine:
        yield engine


@pytest.fixture
async def engine_backend() -> AsyncIterator[EngineFactory]:
    """Builds ``EngineBackend`` adapters (``url``, then ``api_key=``/``models=`` for the
    spec and adapter options) and closes every one of them after the test."""
    built: list[EngineBackend] = []

    def build(
        url: str, *, api_key: str | None = None, models: tuple[str, ...] = (), **options: object
    ) -> EngineBackend:
        options.setdefault("drain_timeout", 1.0)
        spec = BackendSpec("engine-test", "engine", url, api_key=api_key, models=models)
        adapter = EngineBackend(spec, **options)  # type: ignore[arg-type]
        built.append(adapter)
        return adapter

    yield build
    for adapter in built:
        await adapter.aclose()


@pytest.fixture(scope="module")
async def _minimax_server(request: pytest.FixtureRequest) -> AsyncIterator[ServedMinimax]:
    """One fake MiniMax per module; a module sets ``MINIMAX_PROCESSING_POLLS`` to change
    how many ``Processing`` polls a task goes through (the fake's default otherwise)."""
    polls = getattr(request.module, "MINIMAX_PROCESSING_POLLS", None)
    options = {} if polls is None else {"processing_polls": polls}
    fake = FakeMinimax("mm", api_key=MINIMAX_KEY, **options)
    async with serve_asgi(fake) as url:
        yield ServedMinimax(fake, url)


@pytest.fixture
def minimax(_minimax_server: ServedMinimax) -> ServedMinimax:
    """The module's fake MiniMax, reset to its defaults for this test."""
    _minimax_server.fake.reset()
    return _minimax_server
