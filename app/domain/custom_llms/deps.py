"""Dependency providers of the custom LLMs area (resolved by name by Litestar).

The per-process bundle (directory, guarded HTTP pool, URL guard, sync) is the
``custom_llms`` resource (``app.domain.custom_llms.setup.CustomLlms``), exposed by
``wiring.py``.
"""

from __future__ import annotations

from advanced_alchemy.extensions.litestar.providers import create_service_provider
from litestar.di import Provide

from app.domain.custom_llms.services import CustomLlmService


def custom_llms_dependencies() -> dict[str, Provide]:
    return {"custom_llms_service": Provide(create_service_provider(CustomLlmService))}
