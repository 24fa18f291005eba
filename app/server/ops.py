"""Operations endpoints: liveness, readiness, Prometheus metrics."""

from __future__ import annotations

import asyncio
from typing import Any

from litestar import Controller, MediaType, get
from sqlalchemy import text

from app.server.resources import Resources

# Below the readiness probe's own timeout (3 s in infra/k8s): an unanswered probe
# counts as a failure, and a black-holed database must read as "unreachable".
DATABASE_CHECK_SECONDS = 2.0


async def _database_check(resources: Resources) -> str:
    try:
        async with asyncio.timeout(DATABASE_CHECK_SECONDS):
            async with resources.db_config.get_engine().connect() as connection:
                await connection.execute(text("SELECT 1"))
    except Exception as exc:
        return f"unreachable: {type(exc).__name__}"
    return "ok"


async def _redis_check(resources: Resources) -> str:
    if not resources.settings.redis_url:
        return "not configured"
    return "ok" if await resources.state_store.ping() else "unreachable"


def ops_controller(resources: Resources) -> type[Controller]:
    class OpsController(Controller):
        tags = ["operations"]
        include_in_schema = False

        @get("/healthz", media_type=MediaType.JSON)
        async def healthz(self) -> dict[str, str]:
            return {"status": "ok"}

        @get("/readyz", media_type=MediaType.JSON)
        async def readyz(self) -> dict[str, Any]:
            """Always 200 once started: ``ready``, or ``degraded`` while the database or
            Redis is unreachable. A replica rides such an outage out on its caches and
            local state, so a load balancer must keep sending it traffic; taking every
            replica out at once would turn a partial outage into a total one."""
            database, redis = await asyncio.gather(
                _database_check(resources), _redis_check(resources)
            )
            checks: dict[str, Any] = {"database": database, "redis": redis}
            healthy = all(v in ("ok", "not configured") for v in checks.values())
            # Usage records waiting for the database (they are written when it returns).
            checks["usage_buffered"] = resources.usage_writer.pending
            return {"status": "ready" if healthy else "degraded", "checks": checks}

        @get("/metrics", media_type="text/plain; version=0.0.4; charset=utf-8")
        async def metrics(self) -> bytes:
            return resources.metrics.render()

    return OpsController
