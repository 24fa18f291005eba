"""Dependency providers of the overrides area (resolved by name by Litestar).

The index and its sync object are per-app resources, exposed by ``wiring.py`` as
``override_index`` and ``override_sync``.
"""

from __future__ import annotations

from litestar.di import Provide

from app.domain.overrides.services import OverrideService
from app.domain.service_provider import service_provider


def overrides_dependencies() -> dict[str, Provide]:
    return {"overrides_service": service_provider(OverrideService, changes="override_sync")}
