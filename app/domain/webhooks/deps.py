"""Dependency providers of the webhooks area (resolved by name by Litestar).

The per-process bundle (dispatcher, URL guard) is the ``webhooks`` resource
(``app.domain.webhooks.setup.Webhooks``), exposed by ``wiring.py``.
"""

from __future__ import annotations

from advanced_alchemy.extensions.litestar.providers import create_service_provider
from litestar.di import Provide

from app.domain.webhooks.services import WebhookService


def webhooks_dependencies() -> dict[str, Provide]:
    return {"webhooks_service": Provide(create_service_provider(WebhookService))}
