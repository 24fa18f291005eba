"""Keep every replica's custom LLM directory (and the catalog entries built from it)
equal to the database, and drop revealed secrets when they rotate.

The database is the source of truth; events only say which project to forget. Two
channels are followed (``app.lib.events.follow``), each reloading on (re)subscription:

- ``custom_llms.changed``, published here after a write::

      {"kind": "custom_llm", "projectId": "<project uuid>", "origin": "<replica id>"}

  The writing replica drops the project from its directory and catalog at once; the
  others do on the event (their own events are skipped by ``origin``).
- ``secrets.changed`` (published by ``app.domain.secrets``)::

      {"kind": "secret", "projectId", "secretId", "origin"}

  Applied on every replica including the writer's (the origin is the secrets area's,
  not ours): the project's cached entry goes, so the next call reveals the new value.

A lost event is repaired by the full invalidation that follows every
(re)subscription and by the periodic ``reload`` the lifespan runs.
"""

from __future__ import annotations

import asyncio
from uuid import UUID

import structlog

from app.domain.custom_llms.directory import CustomLlmDirectory
from app.domain.profiles.catalog import ProfileCatalog
from app.domain.secrets.services import CHANNEL as SECRETS_CHANNEL
from app.domain.secrets.services import KIND_SECRET
from app.lib.events.base import Event, EventBus
from app.lib.events.follow import follow
from app.lib.replicated_cache import CacheSync, uuid_field

CHANNEL = "custom_llms.changed"
KIND_CUSTOM_LLM = "custom_llm"
logger = structlog.get_logger()


class CustomLlmSync(CacheSync):
    """``changed(project_id)`` is called by ``CustomLlmService`` after it wrote;
    ``secret_changed`` is this area's listener of the secrets area's changes."""

    def __init__(
        self, directory: CustomLlmDirectory, catalog: ProfileCatalog, bus: EventBus
    ) -> None:
        super().__init__(bus, CHANNEL, KIND_CUSTOM_LLM, "custom LLMs")
        self.directory = directory
        self._catalog = catalog

    async def forget(self, key: UUID) -> None:
        # The directory first: the catalog rebuilds its entry from the directory.
        self.directory.invalidate_project(key)
        self._catalog.invalidate_project(key)

    def secret_changed(self, project_id: UUID) -> None:
        """A secret of the project was rotated or deleted on this replica: its keys
        are read again before the write is answered (the bus event comes later)."""
        # Only keys are cached from secrets, not catalog entries.
        self.directory.invalidate_project(project_id)

    async def apply_secret(self, event: Event) -> None:
        """A ``secrets.changed`` event, whoever published it."""
        project_id = uuid_field(event, "projectId")
        if event.get("kind") == KIND_SECRET and project_id is not None:
            self.secret_changed(project_id)
            return
        logger.warning("ignoring malformed secret event", kind=event.get("kind"))

    async def reload(self) -> None:
        """Re-read everything cached on its next use (after (re)subscribing; periodic
        safety net); kept meanwhile to ride out a database outage."""
        self.directory.mark_all_stale()
        self._catalog.mark_all_stale()

    async def reload_secrets(self) -> None:
        self.directory.mark_all_stale()

    async def run(self, ready: asyncio.Event | None = None) -> None:
        """Follow both channels until cancelled; ``ready`` is set once both are
        subscribed and reloaded."""
        changes, secrets = asyncio.Event(), asyncio.Event()
        async with asyncio.TaskGroup() as group:
            group.create_task(super().run(changes))
            group.create_task(
                follow(
                    self._bus,
                    SECRETS_CHANNEL,
                    reload=self.reload_secrets,
                    apply=self.apply_secret,
                    ready=secrets,
                )
            )
            await changes.wait()
            await secrets.wait()
            if ready is not None:
                ready.set()
