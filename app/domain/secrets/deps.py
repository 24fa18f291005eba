"""Dependency providers of the secrets area (resolved by name by Litestar).

Every route takes the projects area's ``access`` (the caller's ``ProjectAccess`` to the
``projectId`` of the path). Members read; owners, platform admins and the project's API
keys write, as for the project's other credentials
(``ProjectAccess.can_manage_credentials``).
"""

from __future__ import annotations

from uuid import uuid4

from advanced_alchemy.extensions.litestar.providers import create_service_provider
from litestar.di import Provide

from app.domain.custom_llms.setup import CustomLlms
from app.domain.secrets.services import ProjectSecretService, SecretChanges
from app.lib.events.base import EventBus


def secrets_dependencies() -> dict[str, Provide]:
    """Called once per app: ``origin`` identifies this app (replica) in events."""
    origin = uuid4().hex

    def provide_secret_changes(event_bus: EventBus, custom_llms: CustomLlms) -> SecretChanges:
        # Custom LLMs resolve secrets at call time from a cache: the writer drops its
        # own copy at once, other replicas on the event.
        return SecretChanges(
            event_bus, origin=origin, local=(custom_llms.directory.invalidate_project,)
        )

    return {
        "secrets_service": Provide(create_service_provider(ProjectSecretService)),
        "secret_changes": Provide(provide_secret_changes, sync_to_thread=False),
    }
