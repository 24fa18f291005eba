"""Dependency providers of the prices area (resolved by name by Litestar).

The book and its sync object are per-app resources, exposed by ``wiring.py`` as
``price_book`` and ``price_sync``.
"""

from __future__ import annotations

from litestar.di import Provide

from app.domain.prices.services import ModelPriceService
from app.domain.service_provider import service_provider


def prices_dependencies() -> dict[str, Provide]:
    return {"prices_service": service_provider(ModelPriceService, changes="price_sync")}
