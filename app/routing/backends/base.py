"""The adapter interface every backend kind implements.

Adapters speak one upstream protocol and translate it to OpenAI's shapes. They raise
``UpstreamError`` for failures before any byte reached the client (the caller may
retry elsewhere) and ``StreamInterruptedError`` from a stream's iterator once it has
started (it cannot be retried).

Video kinds implement ``VideoBackend`` instead: task-style generation (submit, poll,
resolve the file), no chat and no embeddings; capability filtering keeps every chat
and embeddings call away from them, and every video call away from the chat kinds.
"""

from __future__ import annotations

import abc
from collections.abc import AsyncIterator, Awaitable, Callable

from app.routing.types import (
    BackendSpec,
    Capability,
    ChatResult,
    EmbeddingResult,
    ProbeResult,
    UpstreamCall,
    Usage,
    VideoPoll,
    VideoTask,
)


class ChatStream(abc.ABC):
    """An opened upstream stream: status checked, body not yet consumed.

    Iterating yields SSE bytes in OpenAI's chunk format (``data: {...}\\n\\n``) and
    ends with ``data: [DONE]\\n\\n``. After the iteration, ``usage`` holds what the
    upstream reported (None if it reported nothing) and ``completion_text_chars`` the
    generated characters when the adapter could count them.
    """

    usage: Usage | None = None
    completion_text_chars: int = 0
    count_text: bool = True
    """Whether to count generated characters (off once an upstream proved it reports
    usage, so its relay does no per-chunk scanning)."""

    @abc.abstractmethod
    def __aiter__(self) -> AsyncIterator[bytes]: ...

    @abc.abstractmethod
    async def aclose(self) -> None:
        """Release the upstream connection (idempotent; called on client disconnect)."""


class Backend(abc.ABC):
    kind: str = ""
    capabilities: frozenset[Capability] = frozenset()
    static_models_first: bool = True
    """Whether the registered static list leads the advertised models (HTTP kinds) or
    follows the discovered ones (engines, whose listing is authoritative)."""

    def __init__(self, spec: BackendSpec) -> None:
        self.spec = spec

    @property
    def name(self) -> str:
        return self.spec.name

    @abc.abstractmethod
    async def probe(self) -> ProbeResult:
        """Cheap health check that also discovers models; never raises."""

    async def chat(self, call: UpstreamCall) -> ChatResult:
        raise NotImplementedError(f"{self.kind} backends do not serve chat")

    async def chat_stream(self, call: UpstreamCall) -> ChatStream:
        raise NotImplementedError(f"{self.kind} backends do not stream chat")

    async def embed(self, call: UpstreamCall) -> EmbeddingResult:
        raise NotImplementedError(f"{self.kind} backends do not serve embeddings")

    def metrics_source(self) -> Callable[[], Awaitable[str]] | None:
        """Where this backend's load can be read (Prometheus text), if anywhere; routing
        scores backends without one by their in-flight count alone."""
        return None

    async def aclose(self) -> None:
        """Release adapter-owned resources (the shared HTTP client is not owned)."""
        return None


class VideoBackend(Backend):
    """A task-style video generator: submit returns a provider task id, polls say where
    it stands, and a finished task's file id resolves to a download URL.

    Every method raises ``UpstreamError``: retryable for transport errors, 5xx, 408/429
    and the provider's rate-limit or server codes; not retryable for auth, invalid
    parameters, sensitive content or insufficient balance. The provider's code is kept
    as ``provider_code`` and its message is part of the error's message.
    """

    capabilities: frozenset[Capability] = frozenset({"video"})

    @abc.abstractmethod
    async def submit_video(self, task: VideoTask) -> str:
        """Create the generation; returns the provider's task id."""

    @abc.abstractmethod
    async def poll_video(self, task_id: str) -> VideoPoll:
        """Where the task stands now."""

    @abc.abstractmethod
    async def video_url(self, file_id: str) -> str:
        """The download URL of a finished task's file."""
