"""The usage area's life in the app: the recorder (write-ahead stream or memory
buffer) provided as ``usage_writer``, run in the background, drained at shutdown; and
the usage records service."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from prometheus_client import CollectorRegistry
from redis.asyncio import Redis
from sqlalchemy.ext.asyncio import AsyncEngine

from app.domain.usage.deps import usage_dependencies
from app.domain.usage.recorder import build_usage_recorder
from app.lib.components import BackgroundTask, Component
from app.lib.settings import Settings
from app.lib.state.script_pipe import StoreScripts


class UsageWiring(Component):
    name = "usage"

    def __init__(
        self,
        settings: Settings,
        *,
        engine: AsyncEngine,
        redis: Redis | None,
        registry: CollectorRegistry,
        scripts: StoreScripts | None = None,
    ) -> None:
        self.writer = build_usage_recorder(
            settings, engine, redis, registry=registry, scripts=scripts
        )

    def provides(self) -> Mapping[str, object]:
        return {"usage_writer": self.writer, **usage_dependencies()}

    def tasks(self) -> Sequence[BackgroundTask]:
        return (BackgroundTask("usage-writer", self.writer.run),)

    async def aclose(self) -> None:
        # Nothing metered is lost on a graceful stop: the database engine closes after
        # this (the core closes last).
        await self.writer.close()
