"""``/v1``: models and health. Chat completions and embeddings are raw ASGI handlers
(``app/domain/gateway/asgi.py``): they carry the traffic."""

from __future__ import annotations

from typing import Any

from litestar import Controller, get

from app.domain.gateway.deps import GatewayCall
from app.domain.gateway.parsing import model_list


class GatewayController(Controller):
    path = "/v1"
    tags = ["gateway"]

    @get("/models")
    async def models(self, gateway_call: GatewayCall) -> dict[str, Any]:
        return model_list(await gateway_call.gateway.list_models(gateway_call.caller))

    @get("/health")
    async def health(self, gateway_call: GatewayCall) -> dict[str, Any]:
        states = list(gateway_call.gateway.routing.registry)
        healthy = sum(1 for s in states if s.health.healthy)
        status = "ok" if states and healthy == len(states) else "degraded" if healthy else "down"
        return {"status": status, "backends": {"total": len(states), "healthy": healthy}}
