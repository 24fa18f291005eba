"""The profiles area's per-app objects and their life: model profiles in the routing
table and the runtime catalog, kept current over the ``EventBus``."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from advanced_alchemy.extensions.litestar import SQLAlchemyAsyncConfig

from app.domain.profiles.deps import profiles_dependencies
from app.domain.profiles.sync import build_profile_sync
from app.lib.components import BackgroundTask, Component, periodic
from app.lib.events.base import EventBus
from app.routing.profiles import ProfileTable

# A safety net under the profiles.config events.
PROFILE_RELOAD_SECONDS = 60.0


class ProfilesWiring(Component):
    name = "profiles"

    def __init__(self, *, db_config: SQLAlchemyAsyncConfig, bus: EventBus) -> None:
        self.table = ProfileTable()
        self.sync = build_profile_sync(self.table, bus, db_config)
        self.catalog = self.sync.catalog

    def provides(self) -> Mapping[str, object]:
        return {
            **profiles_dependencies(),
            "profile_table": self.table,
            "profile_catalog": self.catalog,
            "profile_sync": self.sync,
        }

    async def start(self) -> None:
        # Model profiles into the routing table before serving (the catalog reads
        # each project's settings on its first request).
        await self.sync.load_all()

    def tasks(self) -> Sequence[BackgroundTask]:
        return (
            # Subscribes, then reloads (and drops cached project settings).
            BackgroundTask("profile-sync", self.sync.run),
            periodic("profile-reload", PROFILE_RELOAD_SECONDS, self.sync.load_all),
        )

    async def resync_after_outage(self) -> None:
        await self.sync.load_all()
