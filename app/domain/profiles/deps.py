"""Dependency providers of the profiles area (resolved by name by Litestar).

The catalog and the sync object are per-app resources, exposed by ``wiring.py``
as ``profile_catalog`` and ``profile_sync`` (and ``profile_table``).
"""

from __future__ import annotations

from advanced_alchemy.extensions.litestar.providers import create_service_provider
from litestar.di import Provide

from app.domain.profiles.services import ModelProfileService, ProjectModelsService


def profiles_dependencies() -> dict[str, Provide]:
    return {
        "model_profiles_service": Provide(create_service_provider(ModelProfileService)),
        "project_models_service": Provide(create_service_provider(ProjectModelsService)),
    }
