"""The overrides area's life in the app: BYO keys cached per project, kept current
over the ``EventBus``."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from advanced_alchemy.extensions.litestar import SQLAlchemyAsyncConfig

from app.domain.overrides.deps import overrides_dependencies
from app.domain.overrides.sync import build_override_sync
from app.lib.components import BackgroundTask, Component, periodic
from app.lib.events.base import EventBus
from app.lib.vault import Vault

# The same safety net under the overrides.changed events (marks every project stale).
OVERRIDE_RELOAD_SECONDS = 60.0


class OverridesWiring(Component):
    name = "overrides"

    def __init__(self, *, db_config: SQLAlchemyAsyncConfig, vault: Vault, bus: EventBus) -> None:
        self.sync = build_override_sync(vault, bus, db_config)
        self.index = self.sync.index

    def provides(self) -> Mapping[str, object]:
        return {
            **overrides_dependencies(),
            "override_index": self.index,
            "override_sync": self.sync,
        }

    def tasks(self) -> Sequence[BackgroundTask]:
        return (
            # Subscribes, then marks every project's cached override keys stale.
            BackgroundTask("override-sync", self.sync.run),
            periodic("override-reload", OVERRIDE_RELOAD_SECONDS, self.sync.reload),
        )

    async def resync_after_outage(self) -> None:
        await self.sync.reload()
