"""The agents area's life in the app: this replica's agent sockets and the commands
addressed to them."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from advanced_alchemy.extensions.litestar import SQLAlchemyAsyncConfig

from app.domain.agents.deps import agents_dependencies
from app.domain.agents.setup import build_agents
from app.domain.backends.sync import RoutingConfigSync
from app.lib.components import BackgroundTask, Component
from app.lib.events.base import EventBus
from app.lib.settings import Settings
from app.lib.vault import Vault


class AgentsWiring(Component):
    name = "agents"

    def __init__(
        self,
        settings: Settings,
        *,
        db_config: SQLAlchemyAsyncConfig,
        bus: EventBus,
        vault: Vault,
        routing_sync: RoutingConfigSync,
    ) -> None:
        self.agents = build_agents(
            settings, db_config=db_config, bus=bus, vault=vault, routing_sync=routing_sync
        )

    def provides(self) -> Mapping[str, object]:
        return {**agents_dependencies(), "agents": self.agents}

    def tasks(self) -> Sequence[BackgroundTask]:
        # Panel -> agent commands addressed to sockets held here.
        return (BackgroundTask("agent-hub", self.agents.hub.run),)

    async def stop(self) -> None:
        # Before the tasks and the engine go: each closing socket marks its agent offline.
        await self.agents.hub.close()
