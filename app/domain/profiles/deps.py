"""Dependency providers of the profiles area (resolved by name by Litestar).

The catalog and the sync object are per-app resources, exposed by ``wiring.py``
as ``profile_catalog`` and ``profile_sync`` (and ``profile_table``).
"""

from __future__ import annotations

from litestar.di import Provide

from app.domain.profiles.services import ModelProfileService, ProjectModelsService
from app.domain.service_provider import service_provider


def profiles_dependencies() -> dict[str, Provide]:
    return {
        "model_profiles_service": service_provider(ModelProfileService, changes="profile_sync"),
        "project_models_service": service_provider(ProjectModelsService, changes="profile_sync"),
    }
