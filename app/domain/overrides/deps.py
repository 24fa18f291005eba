"""Dependency providers of the overrides area (resolved by name by Litestar).

The index and its sync object are per-app resources, exposed by ``wiring.py`` as
``override_index`` and ``override_sync``.
"""

from __future__ import annotations

from advanced_alchemy.extensions.litestar.providers import create_service_provider
from litestar.di import Provide

from app.domain.overrides.services import OverrideService


def overrides_dependencies() -> dict[str, Provide]:
    return {"overrides_service": Provide(create_service_provider(OverrideService))}
