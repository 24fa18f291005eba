"""Which backend kinds exist, and building an adapter for a registered backend."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from app.lib.http import UpstreamHttp
from app.routing.backends.base import Backend
from app.routing.backends.engine import EngineBackend
from app.routing.backends.minimax import MinimaxVideoBackend
from app.routing.backends.ollama import OllamaBackend
from app.routing.backends.openai import OpenAICompatibleBackend
from app.routing.backends.vllm import VllmBackend
from app.routing.errors import UnsupportedBackendTypeError
from app.routing.types import BackendSpec

BACKEND_KINDS = ("external", "ollama", "vllm", "engine", "minimax-cloud")
REMOVED_KINDS: Mapping[str, str] = MappingProxyType({"comfyui": "comfyui backend removed"})


def check_kind(kind: str) -> str:
    """The normalized (lower-case) kind, or a 400 naming why it is refused."""
    normalized = kind.strip().lower()
    if normalized in BACKEND_KINDS:
        return normalized
    if normalized in REMOVED_KINDS:
        raise UnsupportedBackendTypeError(
            REMOVED_KINDS[normalized], code=f"{normalized}_removed", param="type"
        )
    raise UnsupportedBackendTypeError(
        f"unknown backend type: {kind}", code="unknown_type", param="type"
    )


def build_backend(spec: BackendSpec, http: UpstreamHttp) -> Backend:
    kind = check_kind(spec.kind)
    if kind == "ollama":
        return OllamaBackend(spec, http)
    if kind == "vllm":
        return VllmBackend(spec, http)
    if kind == "engine":
        return EngineBackend(spec)  # its own WebSocket, not the HTTP pool
    if kind == "minimax-cloud":
        return MinimaxVideoBackend(spec, http)
    return OpenAICompatibleBackend(spec, http)
