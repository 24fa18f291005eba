"""What the request path meters: one ``UsageEntry`` per call, handed to a ``UsageSink``
(the batched ``UsageWriter`` or, with Redis, the write-ahead ``UsageRecorder``)."""

from __future__ import annotations

import datetime
from typing import Protocol
from uuid import UUID

import msgspec

from app.lib.clock import utcnow
from app.lib.ids import uuid7


class UsageEntry(msgspec.Struct, frozen=True, kw_only=True):
    """One metered call, as it becomes a ``usage_records`` row."""

    model_requested: str
    endpoint: str
    """``chat`` or ``embeddings`` (``/v1``), ``runtime_chat`` (the runtime API)."""
    status: int
    """The HTTP status sent to the client."""
    project_id: UUID | None = None
    api_key_id: UUID | None = None
    user_id: UUID | None = None
    model_served: str | None = None
    backend: str | None = None
    streamed: bool = False
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    estimated: bool = False
    error_code: str | None = None
    latency_ms: int = 0
    ttft_ms: int | None = None
    conversation_id: str | None = None
    model_profile_id: str | None = None
    """The runtime profile that served the call (None on ``/v1``)."""
    is_custom: bool = False
    """Served by the project's own custom LLM (outside the quota)."""
    is_override_key: bool = False
    """Sent with the project's BYO override key (outside the quota)."""
    cost: float | None = None
    """``cost_micros`` as a float amount (what readers before the price book read)."""
    cost_micros: int | None = None
    """What the call cost in micro-units of ``currency``; None when unpriced."""
    currency: str | None = None
    cost_estimated: bool = False
    """Priced from estimated usage (the upstream reported none)."""
    created_at: datetime.datetime = msgspec.field(default_factory=utcnow)
    id: UUID = msgspec.field(default_factory=uuid7)


class UsageSink(Protocol):
    """What the request path meters through (``resources.usage_writer``)."""

    async def record(self, entry: UsageEntry) -> None:
        """Keep ``entry`` for the database; never raises. When it returns with Redis
        configured and reachable, the entry is in the write-ahead stream."""
