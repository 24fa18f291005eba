"""What the agents page shows, and its live feed (``/admin/stream/agents``).

The feed follows the ``agents`` channel (register, heartbeats, deploy progress and
results written by whichever replica holds the agent's socket) and re-reads the
database on each event; a timer re-reads it too, since an agent turns offline by
silence, which publishes nothing. Fragments:

- ``agents``: the agent rows (online state, GPUs, version, models);
- ``agent-deployments``: the deployment rows with live progress;
- ``agent-choices``: the deploy form's agent options (the online agents);
- ``agents-clock``: the time of the last update.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from uuid import UUID

from advanced_alchemy.extensions.litestar import SQLAlchemyAsyncConfig

from app.db.models import AgentDeployment
from app.domain.agents.events import CHANNEL as AGENTS_CHANNEL
from app.domain.agents.schemas import ACTIVE_STATUSES, AgentOut, DeploymentOut
from app.domain.agents.services import AgentDeploymentService, AgentNodeService
from app.domain.agents.views import agent_out, deployment_out
from app.domain.dashboard.feeds import Render
from app.domain.dashboard.stream import Fragment, SentCache
from app.lib.clock import utcnow
from app.lib.events.base import Event

AGENT_ROWS = "dashboard/partials/agent_rows.html"
DEPLOYMENT_ROWS = "dashboard/partials/agent_deployment_rows.html"
CHOICES = "dashboard/partials/agent_choices.html"
CLOCK_TEMPLATE = "dashboard/partials/clock.html"
TICK_SECONDS = 2.0
MAX_AGENTS = 500
RECENT_DEPLOYMENTS = 50


@dataclass(frozen=True, slots=True)
class DeploymentView:
    out: DeploymentOut

    @property
    def tone(self) -> str:
        return {"running": "ok", "failed": "bad", "stopped": "muted"}.get(self.out.status, "warn")

    @property
    def active(self) -> bool:
        return self.out.status in ACTIVE_STATUSES


@dataclass(frozen=True, slots=True)
class AgentsView:
    agents: list[AgentOut]
    deployments: list[DeploymentView]

    @property
    def online(self) -> list[AgentOut]:
        return [agent for agent in self.agents if agent.online]


async def agents_view(db_config: SQLAlchemyAsyncConfig, offline_seconds: float) -> AgentsView:
    """Every agent and the recent deployments (short sessions: a stream lives long)."""
    async with AgentNodeService.new(config=db_config) as agents:
        rows, _ = await agents.page(MAX_AGENTS, 0)
    async with AgentDeploymentService.new(config=db_config) as deployments:
        recent, _ = await deployments.page(RECENT_DEPLOYMENTS, 0)
    now = utcnow()
    names: dict[UUID, str] = {row.id: row.name for row in rows}
    return AgentsView(
        agents=[agent_out(row, offline_seconds, now) for row in rows],
        deployments=_deployment_views(recent, names),
    )


def _deployment_views(
    rows: Sequence[AgentDeployment], names: dict[UUID, str]
) -> list[DeploymentView]:
    return [DeploymentView(deployment_out(row, names.get(row.agent_id, ""))) for row in rows]


class AgentsFeed:
    channels: tuple[str, ...] = (AGENTS_CHANNEL,)
    tick_seconds = TICK_SECONDS

    def __init__(
        self, *, db_config: SQLAlchemyAsyncConfig, offline_seconds: float, render: Render
    ) -> None:
        self._db_config = db_config
        self._offline_seconds = offline_seconds
        self._render = render
        self._sent = SentCache()

    async def _fragments(self) -> list[Fragment]:
        view = await agents_view(self._db_config, self._offline_seconds)
        return [
            ("agents", self._render(AGENT_ROWS, {"view": view})),
            ("agent-deployments", self._render(DEPLOYMENT_ROWS, {"view": view})),
            ("agent-choices", self._render(CHOICES, {"view": view, "values": {}})),
        ]

    def _clock(self) -> Fragment:
        return "agents-clock", self._render(CLOCK_TEMPLATE, {"now": utcnow()})

    async def snapshot(self) -> list[Fragment]:
        fragments = await self._fragments()
        self._sent.record(fragments)
        return [*fragments, self._clock()]

    async def on_event(self, event: Event) -> list[Fragment]:
        changed = self._sent.changed(await self._fragments())
        return [*changed, self._clock()] if changed else []

    async def on_tick(self) -> list[Fragment]:
        return [*self._sent.changed(await self._fragments()), self._clock()]
