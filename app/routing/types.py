"""Typed values passed in and out of the routing service."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Literal

import msgspec

from app.lib.errors import BadRequestError

Capability = Literal["chat", "embeddings", "video"]
AuthScheme = Literal["bearer", "api-key", "ApiKey", "none"]
ScoreKind = Literal["seed", "capacity"]
"""How candidates are ranked (``app.routing.load``): the seed's ``running + 10 *
waiting``, or capacity-aware (a free batch slot first, then the shortest wait)."""
SCORE_KINDS: tuple[ScoreKind, ...] = ("seed", "capacity")
Clock = Callable[[], float]
"""Monotonic seconds; tests hand in a fake."""

RawBody = dict[str, msgspec.Raw]
"""A JSON object whose values are kept as undecoded bytes: large prompts are relayed,
not parsed; only the fields routing needs are decoded."""

monotonic: Clock = time.monotonic


def decode_field(body: RawBody, key: str) -> Any:
    """One field of ``body`` decoded, or None when it is absent or not valid JSON."""
    raw = body.get(key)
    if raw is None:
        return None
    try:
        return msgspec.json.decode(raw)
    except msgspec.DecodeError:
        return None


def decode_messages(body: RawBody) -> list[Any]:
    """The chat body's ``messages`` decoded, or a 400 naming them when they are not an
    array (what every translating adapter needs before it can rewrite them)."""
    messages = decode_field(body, "messages")
    if not isinstance(messages, list):
        raise BadRequestError(
            "'messages' must be an array", code="invalid_messages", param="messages"
        )
    return messages


class HealthStatus(StrEnum):
    UNKNOWN = "unknown"
    HEALTHY = "healthy"
    UNHEALTHY = "unhealthy"


@dataclass(frozen=True, slots=True)
class Health:
    status: HealthStatus
    reason: str
    checked_at: float | None
    """Wall-clock epoch seconds of the probe (None before the first probe)."""

    @property
    def healthy(self) -> bool:
        return self.status is HealthStatus.HEALTHY


NOT_PROBED = Health(HealthStatus.UNKNOWN, "not probed yet", None)


@dataclass(frozen=True, slots=True)
class BackendSpec:
    """A registered backend as the router needs it (the API key already decrypted)."""

    name: str
    kind: str
    url: str
    api_key: str | None = None
    models: tuple[str, ...] = ()
    """The static model list; it comes first and keeps precedence over discovery."""
    tags: frozenset[str] = frozenset()
    """A call that requires tags goes only to backends carrying every one of them."""
    auth_scheme: AuthScheme = "bearer"
    """How the key is sent: ``Authorization: Bearer``, an ``api-key`` header,
    ``Authorization: ApiKey`` or not at all."""
    configured_url: str | None = None
    """The URL as registered when ``url`` was resolved from it (``evernight://``
    URLs run against a local tunnel port); None when ``url`` is the registered one."""
    max_concurrency: int | None = None
    """Requests the backend runs at once (its batch slots), when the operator knows it;
    otherwise routing learns it from the backend's metrics (``app.routing.load``)."""


@dataclass(frozen=True, slots=True)
class ProbeResult:
    healthy: bool
    reason: str
    models: tuple[str, ...] = ()
    """Models discovered by the probe (empty when the backend has no listing)."""


@dataclass(slots=True)
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    estimated: bool = False
    cached_tokens: int = 0
    """Of ``prompt_tokens``, those the upstream served from its prompt cache
    (``prompt_tokens_details.cached_tokens``); priced at the cached-input price."""

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclass(slots=True)
class UpstreamCall:
    """One call as an adapter receives it.

    ``body`` is the client's JSON object minus the fields routing consumed
    (``provider``, ``conversation_id``, ``extra`` already merged); ``model`` is the
    name the chosen backend advertises, which replaces the body's ``model``.
    """

    model: str
    body: RawBody
    stream: bool = False
    include_usage: bool = False
    """The client asked for ``stream_options.include_usage``."""
    api_key: str | None = None
    """A key to send instead of the backend's own (a project's BYO override key)."""


@dataclass(slots=True)
class ChatResult:
    """A complete (non-streaming) response: OpenAI JSON bytes, relayed as-is."""

    content: bytes
    usage: Usage | None
    """None when the upstream reported no usage (the caller estimates)."""
    completion_text_chars: int = 0
    """Characters of generated text, for estimating usage when none was reported."""


@dataclass(slots=True)
class EmbeddingResult:
    content: bytes
    usage: Usage | None


@dataclass(slots=True)
class RouteHints:
    """What the caller knows beyond the model name."""

    provider: str | None = None
    conversation_id: str | None = None
    affinity_scope: str = ""
    """Namespaces conversation pins (the project id), so tenants never share a pin."""
    tags: frozenset[str] = frozenset()
    """Required backend tags (a profile's tags): a subset of the backend's tags."""
    exclude: frozenset[str] = field(default_factory=frozenset)
    api_key: str | None = field(default=None, repr=False)
    """A key to send instead of the chosen backend's own (a BYO override key)."""
    score: ScoreKind | None = None
    """How to rank the candidates (a profile's choice); None: the router's default."""


@dataclass(frozen=True, slots=True)
class VideoTask:
    """One generation as a video adapter receives it (already validated)."""

    model: str
    """The name the backend advertises."""
    prompt: str
    duration_seconds: float
    width: int | None
    height: int | None
    negative_prompt: str | None = None
    first_frame_image: str | None = None
    """A data URL (``data:image/png;base64,...``)."""
    extra: Mapping[str, Any] = field(default_factory=dict)
    """Passed through to the provider (``prompt_optimizer``, ``callback_url``, ...)."""


VideoPhase = Literal["queued", "running", "succeeded", "failed"]


@dataclass(frozen=True, slots=True)
class VideoPoll:
    """Where a provider task stands, as one poll saw it."""

    phase: VideoPhase
    provider_status: str
    """The provider's own word, as sent (MiniMax: ``Preparing``, ``Queueing``,
    ``Processing``, ``Success``, ``Fail``)."""
    file_id: str | None = None
    error: str | None = None
    """The provider's message when ``phase == "failed"``."""


@dataclass(frozen=True, slots=True)
class VideoSubmission:
    """A task accepted by a provider: poll it on ``backend`` (the one that created it)."""

    backend: str
    model_served: str
    task_id: str
