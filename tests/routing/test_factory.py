"""Backend kinds: normalization, refusals, and building adapters."""

from __future__ import annotations

import pytest

from app.lib.errors import BadRequestError
from app.lib.http import UpstreamHttp
from app.routing.backends.engine import EngineBackend
from app.routing.backends.factory import BACKEND_KINDS, build_backend, check_kind
from app.routing.backends.ollama import OllamaBackend
from app.routing.backends.openai import OpenAICompatibleBackend
from app.routing.errors import UnsupportedBackendTypeError
from app.routing.types import BackendSpec


@pytest.mark.parametrize(
    ("kind", "normalized"),
    [("external", "external"), ("OLLAMA", "ollama"), (" External ", "external")],
)
def test_check_kind_normalizes(kind: str, normalized: str) -> None:
    assert check_kind(kind) == normalized
    assert normalized in BACKEND_KINDS


@pytest.mark.parametrize("kind", ["comfyui", "ComfyUI"])
def test_comfyui_is_refused(kind: str) -> None:
    with pytest.raises(UnsupportedBackendTypeError) as caught:
        check_kind(kind)
    error = caught.value
    assert (error.status_code, error.code, error.param) == (400, "comfyui_removed", "type")
    assert error.message == "comfyui backend removed"


@pytest.mark.parametrize("kind", ["", "grpc", "openai-ish"])
def test_unknown_kind_is_refused(kind: str) -> None:
    with pytest.raises(UnsupportedBackendTypeError) as caught:
        check_kind(kind)
    assert caught.value.code == "unknown_type"
    assert caught.value.param == "type"
    assert caught.value.message == f"unknown backend type: {kind}"


async def test_build_backend_by_kind(http: UpstreamHttp) -> None:
    external = build_backend(BackendSpec("a", "External", "http://h:1", api_key="k"), http)
    assert isinstance(external, OpenAICompatibleBackend)
    assert (external.kind, external.name, external.spec.api_key) == ("external", "a", "k")
    assert external.capabilities == frozenset({"chat", "embeddings"})
    ollama = build_backend(BackendSpec("b", "ollama", "http://h:2"), http)
    assert isinstance(ollama, OllamaBackend)
    assert ollama.kind == "ollama"
    with pytest.raises(UnsupportedBackendTypeError):
        build_backend(BackendSpec("c", "comfyui", "http://h:3"), http)


async def test_build_engine_backend(http: UpstreamHttp) -> None:
    assert check_kind(" Engine ") == "engine"
    engine = build_backend(BackendSpec("e", "engine", "ws://h:4/cep", api_key="token"), http)
    assert isinstance(engine, EngineBackend)
    assert (engine.kind, engine.spec.api_key, engine.spec.url) == (
        "engine",
        "token",
        "ws://h:4/cep",
    )
    assert engine.capabilities == frozenset({"chat", "embeddings"})
    assert engine.connection is None  # dialled on first use, not when built
    await engine.aclose()
    with pytest.raises(BadRequestError) as caught:
        build_backend(BackendSpec("e", "engine", "http://h:4"), http)
    assert caught.value.code == "invalid_url"
