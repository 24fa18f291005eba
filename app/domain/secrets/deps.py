"""Dependency providers of the secrets area (resolved by name by Litestar).

Every route takes the projects area's ``access`` (the caller's ``ProjectAccess`` to the
``projectId`` of the path). Members read; owners, platform admins and the project's API
keys write, as for the project's other credentials
(``ProjectAccess.can_manage_credentials``).
"""

from __future__ import annotations

from collections.abc import Sequence
from uuid import uuid4

from litestar.di import Provide

from app.domain.secrets.services import ProjectSecretService, SecretChanges, SecretListener
from app.domain.service_provider import service_provider
from app.lib.events.base import EventBus


def secrets_dependencies() -> dict[str, Provide]:
    """Called once per app: ``origin`` identifies this app (replica) in events."""
    origin = uuid4().hex

    def provide_secret_changes(
        event_bus: EventBus, secret_listeners: Sequence[SecretListener]
    ) -> SecretChanges:
        # Areas that cache what secrets open (custom LLMs) list themselves as
        # ``secret_listeners``: the writer drops its own copies at once, other
        # replicas on the event.
        return SecretChanges(event_bus, origin=origin, local=secret_listeners)

    return {
        "secrets_service": service_provider(ProjectSecretService, changes="secret_changes"),
        "secret_changes": Provide(provide_secret_changes, sync_to_thread=False),
    }
