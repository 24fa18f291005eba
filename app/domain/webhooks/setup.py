"""The per-process objects of the webhooks area, built once by ``build_resources``.

``resources.webhook_dispatcher`` is the ``AlertSink`` (``alert_sinks`` lists it for
the quota gate); the bundle (DI name ``webhooks``) adds what the REST API and the
console need: the write-time URL guard under the same policy as the delivery pool.

The address policy is ``ARONA_WEBHOOK_ALLOW_PRIVATE`` (implied by ``arona demo``):
off, a webhook must be ``https://`` and reach only public addresses, checked when it
is written (``UrlGuard``) and again on every connection (the guarded pool, so DNS
that changes afterwards cannot point a delivery inside); on, loopback, private and
plain ``http://`` receivers are allowed too (tests, demos, lab networks). Cloud
metadata addresses are refused either way.
"""

from __future__ import annotations

import ssl
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from uuid import UUID

import structlog
from aiohttp.abc import AbstractResolver
from prometheus_client import CollectorRegistry
from sqlalchemy.ext.asyncio import AsyncEngine

from app.domain.secrets.aad import webhook_previous_aad, webhook_secret_aad
from app.domain.webhooks.dispatcher import RetrySchedule, SecretsFor, WebhookDispatcher
from app.domain.webhooks.metrics import WebhookMetrics
from app.domain.webhooks.sender import WebhookSender
from app.domain.webhooks.store import DeliveryStore, Target
from app.lib.http import build_guarded_http_client
from app.lib.settings import Settings
from app.lib.ssrf import SsrfPolicy, UrlGuard
from app.lib.vault import Vault, VaultError

logger = structlog.get_logger()
MAX_CONNECTIONS = 64
"""Receivers are few and attempts bounded per replica; a small pool is plenty."""


@dataclass(frozen=True, slots=True)
class Webhooks:
    dispatcher: WebhookDispatcher
    guard: UrlGuard
    allow_http: bool
    """Plain ``http://`` receivers are accepted (with private addresses allowed)."""


def ssrf_policy(settings: Settings) -> SsrfPolicy:
    return SsrfPolicy(allow_private=settings.webhook_allow_private or settings.demo)


def trust(settings: Settings) -> ssl.SSLContext | None:
    """The system's trust store plus ``ARONA_WEBHOOK_CA_FILE``; None: the default."""
    if settings.webhook_ca_file is None:
        return None
    return trust_with(settings.webhook_ca_file)


def trust_with(ca_file: Path) -> ssl.SSLContext:
    context = ssl.create_default_context()
    context.load_verify_locations(cafile=str(ca_file))
    return context


def secrets_opener(vault: Vault) -> SecretsFor:
    def secrets_for(webhook_id: UUID, target: Target, now: datetime) -> list[str]:
        keys = [
            vault.decrypt(
                target.secret_encrypted, webhook_secret_aad(target.project_id, webhook_id)
            )
        ]
        previous, until = target.previous_secret_encrypted, target.previous_secret_expires_at
        if previous is not None and until is not None and until > now:
            try:
                keys.append(
                    vault.decrypt(previous, webhook_previous_aad(target.project_id, webhook_id))
                )
            except VaultError as exc:  # the current secret still signs
                logger.warning(
                    "previous webhook secret cannot be opened",
                    webhook_id=str(webhook_id),
                    error=str(exc),
                )
        return keys

    return secrets_for


def build_webhooks(
    settings: Settings,
    engine: AsyncEngine,
    vault: Vault,
    *,
    origin: str,
    ssl_context: ssl.SSLContext | None = None,
    resolver_factory: Callable[[], AbstractResolver] | None = None,
    max_in_flight: int = 8,
    registry: CollectorRegistry | None = None,
) -> Webhooks:
    """``ssl_context`` replaces the trust (default: ``trust(settings)``);
    ``resolver_factory`` the system resolver under the guard (tests); ``registry``
    gets the delivery figures (``metrics.py``)."""
    policy = ssrf_policy(settings)
    timeout = settings.webhook_timeout_seconds
    http = build_guarded_http_client(
        policy,
        connect_timeout=timeout,
        read_timeout=timeout,
        resolver_factory=resolver_factory,
        max_connections=MAX_CONNECTIONS,
        ssl_context=ssl_context or trust(settings),
    )
    dispatcher = WebhookDispatcher(
        DeliveryStore(engine, owner=origin),
        WebhookSender(http, timeout),
        secrets_opener(vault),
        RetrySchedule(settings.webhook_max_attempts, settings.webhook_retry_base_seconds),
        origin=origin,
        max_in_flight=max_in_flight,
    )
    if registry is not None:
        registry.register(WebhookMetrics(dispatcher))
    return Webhooks(dispatcher=dispatcher, guard=UrlGuard(policy), allow_http=policy.allow_private)
