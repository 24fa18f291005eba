"""Dependency providers of the usage area (resolved by name by Litestar).

The recorder (``usage_writer``) is a per-app resource, provided by ``wiring.py``.
"""

from __future__ import annotations

from advanced_alchemy.extensions.litestar.providers import create_service_provider
from litestar.di import Provide

from app.domain.usage.services import UsageRecordService


def usage_dependencies() -> dict[str, Provide]:
    return {
        "usage_records_service": Provide(create_service_provider(UsageRecordService)),
    }
