"""Bodies of the webhooks API (camelCase on the wire, like the rest of the Projects API).

The signing secret goes out twice only: in the answer that created it (``POST``) and
in the one that replaced it (``rotate-secret``); every other answer has its hint.
"""

from __future__ import annotations

import datetime
from typing import Annotated, Any, Literal
from uuid import UUID

import msgspec

from app.domain.bodies import Camel, Strict

EventType = Literal["budget.threshold"]
"""What a webhook can subscribe to (``webhook.test`` is sent on request whatever)."""
EVENT_TYPES: tuple[EventType, ...] = ("budget.threshold",)
MAX_URL_LENGTH = 2048
MAX_WEBHOOKS_PER_PROJECT = 10
MAX_GRACE_SECONDS = 7 * 24 * 3600
DEFAULT_GRACE_SECONDS = 24 * 3600

WebhookUrl = Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_URL_LENGTH)]
Description = Annotated[str, msgspec.Meta(max_length=500)]
Events = Annotated[list[EventType], msgspec.Meta(min_length=1, max_length=len(EVENT_TYPES))]


def _all_events() -> list[EventType]:
    return list(EVENT_TYPES)


class WebhookCreate(Strict):
    url: WebhookUrl
    description: Description = ""
    enabled: bool = True
    events: Events = msgspec.field(default_factory=_all_events)


class WebhookUpdate(Strict):
    url: WebhookUrl | msgspec.UnsetType = msgspec.UNSET
    description: Description | msgspec.UnsetType = msgspec.UNSET
    enabled: bool | msgspec.UnsetType = msgspec.UNSET
    events: Events | msgspec.UnsetType = msgspec.UNSET


class WebhookOut(Camel):
    id: UUID
    url: str
    description: str
    enabled: bool
    events: list[str]
    secret_hint: str
    """The masked end of the signing secret (``••••abcd``)."""
    previous_secret_expires_at: datetime.datetime | None
    """After a rotation: until when the previous secret also signs (a second ``v1``)."""
    created_at: datetime.datetime
    updated_at: datetime.datetime


class WebhookWithSecret(WebhookOut):
    secret: str
    """The signing secret: shown in this answer only. Store it with the receiver."""

    def __repr__(self) -> str:
        # Keeps the secret out of tracebacks and debug output that repr the answer.
        return f"WebhookWithSecret(id={self.id!r}, secret=<hidden>)"


class DeliveryAttempt(Camel):
    at: str
    status_code: int | None
    error: str | None
    duration_ms: int


class DeliveryOut(Camel):
    id: UUID
    webhook_id: UUID
    event: str
    """``budget.threshold`` or ``webhook.test`` (also the body's ``type``)."""
    alert_id: str | None
    status: str
    """``pending`` (due at ``nextAttemptAt``), ``delivered`` or ``failed``."""
    attempts: int
    last_status_code: int | None
    last_error: str | None
    last_response: str | None
    """The first characters of the receiver's last answer."""
    next_attempt_at: datetime.datetime | None
    delivered_at: datetime.datetime | None
    created_at: datetime.datetime
    updated_at: datetime.datetime
    payload: dict[str, Any]
    """The JSON body sent (``type``, ``id``, ``createdAt``, ``data``)."""
    attempt_log: list[DeliveryAttempt]
    """The latest attempts, oldest first."""
