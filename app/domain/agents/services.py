"""Stored agents and deployments: identities, live state, deploy requests.

The replica holding an agent's socket writes its state; any replica reads it. An
agent is *online* while its socket is open somewhere (``connection_id`` set) and its
last heartbeat is younger than ``settings.agent_offline_seconds``.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterable, Sequence
from typing import Any
from uuid import UUID

import msgspec
from advanced_alchemy.filters import LimitOffset, OrderBy
from advanced_alchemy.repository import SQLAlchemyAsyncRepository
from advanced_alchemy.service import SQLAlchemyAsyncRepositoryService
from sqlalchemy import CursorResult, select, update

from app.db.models import AgentDeployment, AgentNode
from app.domain.agents import events
from app.domain.agents.schemas import ACTIVE_STATUSES
from app.domain.paging import ascending, newest_first
from app.domain.races import RACED
from app.lib.agent_frames import Gpu, Heartbeat, Register, average_utilization
from app.lib.clock import utcnow
from app.lib.errors import ConflictError, NotFoundError
from app.lib.events.base import EventBus
from app.lib.hashing import random_secret, sha256_hex

TOKEN_PREFIX = "agt-"  # noqa: S105 (a display prefix, not a secret)
DISPLAY_PREFIX_LENGTH = 12


def agent_not_found() -> NotFoundError:
    return NotFoundError("no such agent", code="agent_not_found")


def deployment_not_found() -> NotFoundError:
    return NotFoundError("no such deployment", code="deployment_not_found")


def is_online(row: AgentNode, now: datetime.datetime, offline_seconds: float) -> bool:
    if row.connection_id is None or row.last_heartbeat_at is None:
        return False
    return (now - row.last_heartbeat_at).total_seconds() < offline_seconds


def stored_gpus(row: AgentNode) -> list[Gpu]:
    """The last reported GPUs; an entry that no longer decodes is dropped."""
    gpus: list[Gpu] = []
    for item in row.gpus or ():
        try:
            gpus.append(msgspec.convert(item, Gpu))
        except msgspec.ValidationError:
            continue
    return gpus


def load_key(row: AgentNode) -> tuple[bool, float, str]:
    """Sort key for "least loaded": agents without telemetry last, then by name."""
    average = average_utilization(stored_gpus(row))
    return (average is None, average or 0.0, row.name)


def _gpu_dicts(gpus: Iterable[Gpu]) -> list[dict[str, Any]]:
    return [msgspec.to_builtins(g) for g in gpus]


class AgentNodeService(SQLAlchemyAsyncRepositoryService[AgentNode]):
    class Repo(SQLAlchemyAsyncRepository[AgentNode]):
        model_type = AgentNode

    repository_type = Repo
    bus: EventBus | None = None
    """Set by the request's provider: a new identity is announced to every replica's
    dashboard (``events.agent_changed``)."""

    async def create_identity(self, name: str) -> tuple[AgentNode, str]:
        """A new identity; the token is returned once and only its hash is kept."""
        if await self.get_one_or_none(AgentNode.name == name) is not None:
            raise _name_taken()
        token = random_secret(TOKEN_PREFIX)
        row = AgentNode(
            name=name,
            token_hash=sha256_hex(token),
            token_prefix=token[:DISPLAY_PREFIX_LENGTH],
            gpus=[],
            models=[],
        )
        try:
            created = await self.create(row, auto_commit=True)
        except RACED as exc:
            await self.repository.session.rollback()
            raise _name_taken() from exc
        if self.bus is not None:
            await events.agent_changed(self.bus, created.id)
        return created, token

    async def page(self, limit: int, offset: int) -> tuple[Sequence[AgentNode], int]:
        return await self.get_many_and_count(*ascending("name", limit, offset))

    async def require(self, agent_id: UUID) -> AgentNode:
        row = await self.get_one_or_none(AgentNode.id == agent_id)
        if row is None:
            raise agent_not_found()
        return row

    async def by_token(self, token: str) -> AgentNode | None:
        return await self.get_one_or_none(AgentNode.token_hash == sha256_hex(token))

    async def online(self, offline_seconds: float) -> list[AgentNode]:
        now = utcnow()
        rows = await self.get_many(AgentNode.connection_id.is_not(None))
        return [row for row in rows if is_online(row, now, offline_seconds)]

    async def _update(self, agent_id: UUID, *where: Any, **values: Any) -> bool:
        session = self.repository.session
        result = await session.execute(
            update(AgentNode).where(AgentNode.id == agent_id, *where).values(**values)
        )
        await session.commit()
        return bool(isinstance(result, CursorResult) and result.rowcount)

    async def mark_registered(
        self, agent_id: UUID, frame: Register, host: str, connection_id: str
    ) -> bool:
        """False when the identity is gone (deleted while connecting)."""
        now = utcnow()
        return await self._update(
            agent_id,
            machine_name=frame.machine_name,
            version=frame.version,
            host=host,
            gpus=_gpu_dicts(frame.gpus),
            connection_id=connection_id,
            connected_at=now,
            last_heartbeat_at=now,
            updated_at=now,
        )

    async def record_heartbeat(self, agent_id: UUID, frame: Heartbeat, connection_id: str) -> bool:
        """False when the identity is gone or another socket has taken over."""
        now = utcnow()
        return await self._update(
            agent_id,
            AgentNode.connection_id == connection_id,
            gpus=_gpu_dicts(frame.gpus),
            models=list(dict.fromkeys(frame.models)),
            last_heartbeat_at=now,
            updated_at=now,
        )

    async def mark_disconnected(self, agent_id: UUID, connection_id: str) -> bool:
        return await self._update(
            agent_id,
            AgentNode.connection_id == connection_id,
            connection_id=None,
            updated_at=utcnow(),
        )


def _name_taken() -> ConflictError:
    return ConflictError("an agent with this name exists", code="agent_exists", param="name")


class AgentDeploymentService(SQLAlchemyAsyncRepositoryService[AgentDeployment]):
    class Repo(SQLAlchemyAsyncRepository[AgentDeployment]):
        model_type = AgentDeployment

    repository_type = Repo

    async def start(self, agent_id: UUID, model_id: str) -> tuple[AgentDeployment, list[str]]:
        """A new ``deploying`` row; earlier active rows of the same model on the same
        agent are marked replaced (the agent restarts the model). Returns the row and
        the models whose backend must be re-synced."""
        now = utcnow()
        replaced = await self.get_many(
            AgentDeployment.agent_id == agent_id,
            AgentDeployment.model_id == model_id,
            AgentDeployment.status.in_(ACTIVE_STATUSES),
        )
        for old in replaced:
            old.status, old.message, old.finished_at = "stopped", "replaced", now
        row = AgentDeployment(
            agent_id=agent_id, model_id=model_id, status="deploying", progress=0, message=""
        )
        self.repository.session.add_all([*replaced, row])
        await self.repository.session.commit()
        return row, [model_id] if replaced else []

    async def require(self, deployment_id: UUID) -> AgentDeployment:
        row = await self.get_one_or_none(AgentDeployment.id == deployment_id)
        if row is None:
            raise deployment_not_found()
        return row

    async def current(
        self, agent_id: UUID, model_id: str, statuses: Iterable[str]
    ) -> AgentDeployment | None:
        """The newest row of ``model_id`` on the agent in one of ``statuses``."""
        found = await self.get_many(
            AgentDeployment.agent_id == agent_id,
            AgentDeployment.model_id == model_id,
            AgentDeployment.status.in_(tuple(statuses)),
            OrderBy(field_name="created_at", sort_order="desc"),
            LimitOffset(limit=1, offset=0),
        )
        return found[0] if found else None

    async def running_of_agent(self, agent_id: UUID) -> Sequence[AgentDeployment]:
        return await self.get_many(
            AgentDeployment.agent_id == agent_id, AgentDeployment.status == "running"
        )

    async def active_models_of_agent(self, agent_id: UUID) -> list[str]:
        rows = await self.get_many(
            AgentDeployment.agent_id == agent_id,
            AgentDeployment.status.in_(ACTIVE_STATUSES),
        )
        return sorted({row.model_id for row in rows})

    async def save(self, row: AgentDeployment, **values: Any) -> AgentDeployment:
        for key, value in values.items():
            setattr(row, key, value)
        if values.get("status") in ("failed", "stopped"):
            row.finished_at = utcnow()
        return await self.update(row, auto_commit=True)

    async def page(
        self, limit: int, offset: int, *, agent_id: UUID | None = None, status: str | None = None
    ) -> tuple[Sequence[AgentDeployment], int]:
        where: list[Any] = []
        if agent_id is not None:
            where.append(AgentDeployment.agent_id == agent_id)
        if status is not None:
            where.append(AgentDeployment.status == status)
        return await self.get_many_and_count(*where, *newest_first(limit, offset))

    async def serving(self, model_id: str) -> tuple[AgentDeployment, AgentNode] | None:
        """The newest running deployment of ``model_id`` (any agent) and its agent."""
        session = self.repository.session
        found = (
            await session.execute(
                select(AgentDeployment, AgentNode)
                .join(AgentNode, AgentNode.id == AgentDeployment.agent_id)
                .where(AgentDeployment.model_id == model_id, AgentDeployment.status == "running")
                .order_by(AgentDeployment.created_at.desc(), AgentDeployment.id.desc())
                .limit(1)
            )
        ).first()
        return None if found is None else (found[0], found[1])
