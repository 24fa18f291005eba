"""The agents area's per-app objects, built once with the other resources."""

from __future__ import annotations

from advanced_alchemy.extensions.litestar import SQLAlchemyAsyncConfig

from app.domain.agents.backends import AgentBackends
from app.domain.agents.deploy import AgentDeployer
from app.domain.agents.hub import AgentHub
from app.domain.agents.sessions import SessionDeps
from app.domain.agents.tokens import AgentTokens
from app.domain.backends.sync import RoutingConfigSync
from app.lib.events.base import EventBus
from app.lib.settings import Settings
from app.lib.vault import Vault


class Agents:
    """A plain class, not a dataclass: Litestar would otherwise walk its fields' types
    when it is injected into a handler."""

    __slots__ = ("deployer", "hub", "offline_seconds", "session_deps", "tokens")

    def __init__(
        self,
        *,
        hub: AgentHub,
        deployer: AgentDeployer,
        tokens: AgentTokens,
        session_deps: SessionDeps,
        offline_seconds: float,
    ) -> None:
        self.hub = hub
        """This replica's agent sockets and command routing (run it in the lifespan)."""
        self.deployer = deployer
        self.tokens = tokens
        self.session_deps = session_deps
        self.offline_seconds = offline_seconds


def build_agents(
    settings: Settings,
    *,
    db_config: SQLAlchemyAsyncConfig,
    bus: EventBus,
    vault: Vault,
    routing_sync: RoutingConfigSync,
) -> Agents:
    hub = AgentHub(bus)
    backends = AgentBackends(db_config=db_config, vault=vault, routing_sync=routing_sync)
    return Agents(
        hub=hub,
        deployer=AgentDeployer(
            db_config=db_config,
            hub=hub,
            backends=backends,
            bus=bus,
            offline_seconds=settings.agent_offline_seconds,
        ),
        tokens=AgentTokens(db_config),
        session_deps=SessionDeps(db_config=db_config, hub=hub, backends=backends, bus=bus),
        offline_seconds=settings.agent_offline_seconds,
    )
