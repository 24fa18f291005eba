"""Keep every replica's ``ProfileTable`` and catalog cache equal to the database.

Modelled on ``RoutingConfigSync``: the database is the source of truth and events
on ``profiles.config`` only say *what* to re-read. A replica that writes applies the
change to itself at once and publishes an event carrying its origin id; the others
re-read that profile (or drop that project's cached settings). Events are hints: a
lost one is repaired by the reload that follows every (re)subscription and by the
periodic reload the lifespan runs.

Event shapes (JSON objects, the bus adds ``channel``)::

    {"kind": "profile", "id": "<profile id>", "origin": "<replica id>"}
    {"kind": "project", "projectId": "<project uuid>", "origin": "<replica id>"}

A profile that is gone when re-read was deleted, and its deletion rewrote project
settings in the same transaction: every cached project entry is dropped then.
"""

from __future__ import annotations

import asyncio
from functools import partial
from uuid import UUID

import structlog
from advanced_alchemy.extensions.litestar import SQLAlchemyAsyncConfig

from app.db.outage import is_database_outage, unavailable_on_outage
from app.domain.profiles.catalog import ProfileCatalog
from app.domain.profiles.services import load_profile, load_profiles, load_project_models
from app.lib.events.base import Event, EventBus
from app.lib.replicated_cache import CacheSync
from app.routing.profiles import ProfileTable

CHANNEL = "profiles.config"
KIND_PROFILE = "profile"
KIND_PROJECT = "project"
logger = structlog.get_logger()


class ProfileSync(CacheSync):
    """``profile_changed`` / ``project_changed`` are called by the profile services
    after they wrote."""

    def __init__(
        self,
        *,
        table: ProfileTable,
        catalog: ProfileCatalog,
        bus: EventBus,
        db_config: SQLAlchemyAsyncConfig,
    ) -> None:
        super().__init__(bus, CHANNEL, KIND_PROJECT, "model profiles")
        self._table = table
        self.catalog = catalog
        """The catalog this sync invalidates (``resources.profile_catalog``)."""
        self._db_config = db_config
        # Serialises reloads: a local write and another replica's event for the same
        # profile must not interleave their read and apply steps out of order.
        self._lock = asyncio.Lock()

    # ------------------------------------------------------------------ loading

    async def load_all(self) -> None:
        """Make the table match the database and have every project's cached
        settings re-read (start-up, resubscription, periodic safety net); they stay
        readable meanwhile, to ride out a database outage."""
        async with self._lock:
            profiles = await load_profiles(self._db_config)
            self._table.replace_all(profiles)
            self.catalog.mark_all_stale()
        logger.debug("model profiles loaded", profiles=len(profiles))

    async def reload(self) -> None:
        """``load_all`` after a (re)subscription. With the database down, events are
        followed anyway (the table keeps what it holds, project entries go stale)
        and the periodic reload catches up once it is back."""
        try:
            await self.load_all()
        except Exception as exc:
            if not is_database_outage(exc):
                raise
            self.catalog.mark_all_stale()
            logger.warning("model profiles not reloaded: database unreachable")

    async def reload_profile(self, profile_id: str) -> None:
        async with self._lock:
            profile = await load_profile(self._db_config, profile_id)
            if profile is None:
                self._table.remove(profile_id)
                # Its deletion cleaned project settings up in the same transaction.
                self.catalog.invalidate_all()
            else:
                self._table.put(profile)

    # --------------------------------------------------------------- local writes

    async def profile_changed(self, profile_id: str) -> None:
        """Called after this replica wrote (or deleted) profile ``profile_id``."""
        await self.reload_profile(profile_id)
        await self.publish({"kind": KIND_PROFILE, "id": profile_id})

    async def project_changed(self, project_id: UUID) -> None:
        """Called after this replica wrote the model settings of ``project_id``."""
        await self.changed(project_id)

    async def forget(self, key: UUID) -> None:
        self.catalog.invalidate_project(key)

    # --------------------------------------------------------- other replicas

    async def apply_other(self, event: Event) -> bool:
        if event.get("kind") == KIND_PROFILE and isinstance(event.get("id"), str):
            await self.reload_profile(event["id"])
            return True
        return False


def build_profile_sync(
    table: ProfileTable, bus: EventBus, db_config: SQLAlchemyAsyncConfig
) -> ProfileSync:
    """The catalog over ``table`` (settings read from ``db_config`` on a miss) and the
    sync that keeps both current; the catalog is ``sync.catalog``."""
    catalog = ProfileCatalog(
        table,
        unavailable_on_outage(
            partial(load_project_models, db_config),
            "the database is unreachable and this project's model settings are not cached "
            "on this server; retry shortly",
        ),
    )
    return ProfileSync(table=table, catalog=catalog, bus=bus, db_config=db_config)
