"""Keep every replica's ``OverrideIndex`` equal to the database.

The database is the source of truth; events on ``overrides.changed`` only say which
project to forget. A replica that writes drops its own entry at once and publishes
an event carrying its origin id; the others drop theirs and read the project again on
its next request. Events are hints: a lost one is repaired by the full invalidation
that follows every (re)subscription and by the periodic one the lifespan runs.

Event shape (a JSON object; the bus adds ``channel``)::

    {"kind": "override", "projectId": "<project uuid>", "origin": "<replica id>"}

No key material ever travels on the bus.
"""

from __future__ import annotations

import asyncio
from functools import partial
from uuid import UUID, uuid4

import structlog
from advanced_alchemy.extensions.litestar import SQLAlchemyAsyncConfig

from app.db.outage import unavailable_on_outage
from app.domain.overrides.index import OverrideIndex
from app.domain.overrides.services import load_project_overrides
from app.lib.events.base import Event, EventBus
from app.lib.events.follow import follow
from app.lib.vault import Vault

CHANNEL = "overrides.changed"
KIND_OVERRIDE = "override"
logger = structlog.get_logger()


class OverrideSync:
    def __init__(self, index: OverrideIndex, bus: EventBus) -> None:
        self.index = index
        """The index this sync invalidates (``resources.override_index``)."""
        self._bus = bus
        self.origin = uuid4().hex
        """This process's id in events, so it can skip what it published itself."""

    async def changed(self, project_id: UUID) -> None:
        """Called after this replica created or deleted an override of ``project_id``."""
        self.index.invalidate_project(project_id)
        try:
            await self._bus.publish(
                CHANNEL,
                {"kind": KIND_OVERRIDE, "projectId": str(project_id), "origin": self.origin},
            )
        except Exception as exc:  # a hint channel: the write itself has succeeded
            logger.warning("could not publish an override change", error=repr(exc))

    async def apply(self, event: Event) -> None:
        """Apply an event from another replica; our own are already applied."""
        if event.get("origin") == self.origin:
            return
        project = event.get("projectId")
        if event.get("kind") == KIND_OVERRIDE and isinstance(project, str):
            try:
                project_id = UUID(project)
            except ValueError:
                pass
            else:
                self.index.invalidate_project(project_id)
                return
        logger.warning("ignoring malformed override event", kind=event.get("kind"))

    async def reload(self) -> None:
        """Re-read every cached project on its next request (after (re)subscribing;
        periodic safety net); kept meanwhile to ride out a database outage."""
        self.index.mark_all_stale()

    async def run(self, ready: asyncio.Event | None = None) -> None:
        """Follow other replicas' changes until cancelled (``app.lib.events.follow``)."""
        await follow(self._bus, CHANNEL, reload=self.reload, apply=self.apply, ready=ready)


def build_override_sync(
    vault: Vault, bus: EventBus, db_config: SQLAlchemyAsyncConfig
) -> OverrideSync:
    """The index (reading ``db_config``, decrypting with ``vault`` on a miss) and the
    sync that keeps it current; the index is ``sync.index``."""
    index = OverrideIndex(
        unavailable_on_outage(
            partial(load_project_overrides, db_config, vault),
            "the database is unreachable and this project's override keys are not cached "
            "on this server; retry shortly",
        )
    )
    return OverrideSync(index, bus)
