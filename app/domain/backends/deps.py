"""Dependency providers of the backends area (resolved by name by Litestar).

The registry, alias table and sync object are per-app resources, exposed by
``wiring.py`` as ``backend_registry``, ``alias_table`` and ``routing_sync``.
"""

from __future__ import annotations

from litestar.di import Provide

from app.domain.accounts.deps import require_platform_admin
from app.domain.backends.services import AliasService, BackendConfigService
from app.domain.service_provider import service_provider


def backends_dependencies() -> dict[str, Provide]:
    return {
        "backend_configs_service": service_provider(BackendConfigService, changes="routing_sync"),
        "aliases_service": service_provider(AliasService, changes="routing_sync"),
    }


# Set as the ``platform_admin`` dependency of the admin controllers; every handler
# takes it, so an unauthenticated call is a 401 and a non-admin one a 403.
platform_admin = Provide(require_platform_admin)
