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

from functools import partial
from uuid import UUID

from advanced_alchemy.extensions.litestar import SQLAlchemyAsyncConfig

from app.db.outage import unavailable_on_outage
from app.domain.overrides.index import OverrideIndex
from app.domain.overrides.services import load_project_overrides
from app.lib.events.base import EventBus
from app.lib.replicated_cache import CacheSync
from app.lib.vault import Vault

CHANNEL = "overrides.changed"
KIND_OVERRIDE = "override"


class OverrideSync(CacheSync):
    """``changed(project_id)`` is called by ``OverrideService`` after it wrote."""

    def __init__(self, index: OverrideIndex, bus: EventBus) -> None:
        super().__init__(bus, CHANNEL, KIND_OVERRIDE, "override keys")
        self.index = index
        """The index this sync invalidates (``resources.override_index``)."""

    async def forget(self, key: UUID) -> None:
        self.index.invalidate_project(key)

    async def reload(self) -> None:
        """Re-read every cached project on its next request (after (re)subscribing;
        periodic safety net); kept meanwhile to ride out a database outage."""
        self.index.mark_all_stale()


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
