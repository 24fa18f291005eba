"""Start-up and shutdown: check the schema, then run every area's wiring in order.

Areas start, run their tasks and get ready in the order of ``resources.components``;
they stop and close in reverse (docs/architecture.md, "Wiring").
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager
from typing import Any

import structlog
from litestar import Litestar

from app.db.migrate import ensure_migrated
from app.lib.tasks import supervise
from app.server.redis_outage import outage_watcher
from app.server.resources import Resources

logger = structlog.get_logger()
TASK_STOP_SECONDS = 5.0


def build_lifespan(
    resources: Resources,
) -> Callable[[Litestar], AbstractAsyncContextManager[None]]:
    @contextlib.asynccontextmanager
    async def lifespan(_: Litestar) -> AsyncIterator[None]:
        await ensure_migrated(resources.db_config.get_engine())
        components = resources.components
        for component in components:
            await component.start()
        tasks: list[asyncio.Task[Any]] = [
            asyncio.create_task(supervise(spec.name, spec.run), name=spec.task_name)
            for component in components
            for spec in component.tasks()
        ]
        # Redis down: seed local state; Redis back: re-sync every area.
        if (watcher := outage_watcher(resources)) is not None:
            tasks.append(asyncio.create_task(supervise("state-store-outage", watcher)))
        try:
            for component in components:
                await component.ready()
            logger.info(
                "arona started",
                api_keys=len(resources.api_key_index),
                backends=len(resources.backend_registry),
            )
            yield
        finally:
            for component in reversed(components):
                await component.stop()
            for task in tasks:
                task.cancel()
            # Bounded: a loop that does not end on cancellation must not hold the
            # shutdown (and the usage flush in the closes below) hostage.
            _finished, stuck = await asyncio.wait(tasks, timeout=TASK_STOP_SECONDS)
            if stuck:
                logger.warning(
                    "background tasks did not stop when cancelled",
                    tasks=sorted(t.get_name() for t in stuck),
                )
            for component in reversed(components):
                await component.aclose()

    return lifespan
