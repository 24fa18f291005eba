"""Operations endpoints: liveness, readiness, Prometheus metrics."""

from __future__ import annotations

from typing import Any

from litestar import Controller, MediaType, Response, get
from sqlalchemy import text

from app.server.resources import Resources


def ops_controller(resources: Resources) -> type[Controller]:
    class OpsController(Controller):
        tags = ["operations"]
        include_in_schema = False

        @get("/healthz", media_type=MediaType.JSON)
        async def healthz(self) -> dict[str, str]:
            return {"status": "ok"}

        @get("/readyz", media_type=MediaType.JSON)
        async def readyz(self) -> Response[dict[str, Any]]:
            checks: dict[str, str] = {}
            try:
                async with resources.db_config.get_engine().connect() as connection:
                    await connection.execute(text("SELECT 1"))
                checks["database"] = "ok"
            except Exception as exc:
                checks["database"] = f"unreachable: {type(exc).__name__}"
            if resources.settings.redis_url:
                reachable = await resources.state_store.ping()
                checks["redis"] = "ok" if reachable else "unreachable"
            else:
                checks["redis"] = "not configured"
            ready = all(v in ("ok", "not configured") for v in checks.values())
            return Response(
                {"status": "ready" if ready else "unavailable", "checks": checks},
                status_code=200 if ready else 503,
            )

        @get("/metrics", media_type="text/plain; version=0.0.4; charset=utf-8")
        async def metrics(self) -> bytes:
            return resources.metrics.render()

    return OpsController
