"""The custom LLMs area's life in the app: its bundle (``setup.py``) provided as
``custom_llms``, kept current over the ``EventBus``, its HTTP pool closed at the end."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from advanced_alchemy.extensions.litestar import SQLAlchemyAsyncConfig

from app.domain.custom_llms.deps import custom_llms_dependencies
from app.domain.custom_llms.setup import build_custom_llms
from app.domain.profiles.catalog import ProfileCatalog
from app.lib.components import BackgroundTask, Component, periodic
from app.lib.events.base import EventBus
from app.lib.settings import Settings
from app.lib.vault import Vault

# The same safety net under the custom_llms.changed and secrets.changed events.
CUSTOM_LLM_RELOAD_SECONDS = 60.0


class CustomLlmsWiring(Component):
    name = "custom_llms"

    def __init__(
        self,
        settings: Settings,
        *,
        db_config: SQLAlchemyAsyncConfig,
        vault: Vault,
        bus: EventBus,
        catalog: ProfileCatalog,
    ) -> None:
        self.custom_llms = build_custom_llms(settings, db_config, vault, bus, catalog)

    def provides(self) -> Mapping[str, object]:
        return {**custom_llms_dependencies(), "custom_llms": self.custom_llms}

    def tasks(self) -> Sequence[BackgroundTask]:
        sync = self.custom_llms.sync
        return (
            # Subscribes (custom LLM and secret changes), then marks every project stale.
            BackgroundTask("custom-llm-sync", sync.run),
            periodic("custom-llm-reload", CUSTOM_LLM_RELOAD_SECONDS, sync.reload),
        )

    async def resync_after_outage(self) -> None:
        await self.custom_llms.sync.reload()

    async def aclose(self) -> None:
        await self.custom_llms.close()
