"""Dependency providers of the quotas area (resolved by name by Litestar).

The gate and the sync object are per-app resources, exposed by ``wiring.py`` as
``quota_gate`` and ``quota_sync``.
"""

from __future__ import annotations

from litestar.di import Provide

from app.domain.quotas.services import ProjectQuotaService
from app.domain.service_provider import service_provider


def quotas_dependencies() -> dict[str, Provide]:
    return {
        "project_quotas_service": service_provider(
            ProjectQuotaService, changes="quota_sync", windows="quota_gate"
        ),
    }
