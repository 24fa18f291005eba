"""Operations endpoints: liveness, readiness, Prometheus metrics."""

from __future__ import annotations

import asyncio
from typing import Annotated, Any

from litestar import Controller, MediaType, Response, get
from litestar.params import QueryParameter
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
        async def readyz(
            self,
            allow_degraded: Annotated[
                bool,
                QueryParameter(
                    name="allow_degraded",
                    description="Answer 200 while degraded (for load balancers).",
                ),
            ] = False,
        ) -> Response[dict[str, Any]]:
            """``ready`` (200) when every configured dependency answers; ``degraded``
            otherwise, with each check. Plain ``/readyz`` answers a degraded replica
            with 503, the strict view a monitor wants. A load balancer asks with
            ``?allow_degraded=true`` and gets 200: the replica rides a database or
            Redis outage out on its caches and local state, and taking every replica
            out at once would turn a partial outage into a total one."""
            database, redis = await asyncio.gather(
                _database_check(resources), _redis_check(resources)
            )
            checks: dict[str, Any] = {"database": database, "redis": redis}
            healthy = all(v in ("ok", "not configured") for v in checks.values())
            # Usage records waiting for the database (they are written when it returns).
            checks["usage_buffered"] = resources.usage_writer.pending
            body = {"status": "ready" if healthy else "degraded", "checks": checks}
            return Response(body, status_code=200 if healthy or allow_degraded else 503)

        @get("/metrics", media_type="text/plain; version=0.0.4; charset=utf-8")
        async def metrics(self) -> bytes:
            return resources.metrics.render()

    return OpsController
