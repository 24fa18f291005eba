"""``/v1``: OpenAI-compatible chat completions, embeddings, models and health."""

from __future__ import annotations

from typing import Any

from litestar import Controller, MediaType, Request, Response, get, post
from litestar.response import Stream

from app.domain.gateway.deps import GatewayCall
from app.domain.gateway.parsing import model_list, parse_request
from app.lib.sse import STREAM_HEADERS


class GatewayController(Controller):
    path = "/v1"
    tags = ["gateway"]

    @post("/chat/completions", status_code=200)
    async def chat_completions(
        self, request: Request[Any, Any, Any], gateway_call: GatewayCall
    ) -> Response[bytes] | Stream:
        parsed = parse_request(await request.body(), "chat")
        gateway = gateway_call.gateway
        if parsed.stream:
            events = await gateway.open_stream(gateway_call.caller, parsed)
            return Stream(events, media_type="text/event-stream", headers=STREAM_HEADERS)
        outcome = await gateway.complete(gateway_call.caller, parsed, "chat")
        return Response(outcome.content, media_type=MediaType.JSON)

    @post("/embeddings", status_code=200)
    async def embeddings(
        self, request: Request[Any, Any, Any], gateway_call: GatewayCall
    ) -> Response[bytes]:
        parsed = parse_request(await request.body(), "embeddings")
        outcome = await gateway_call.gateway.complete(gateway_call.caller, parsed, "embeddings")
        return Response(outcome.content, media_type=MediaType.JSON)

    @get("/models")
    async def models(self, gateway_call: GatewayCall) -> dict[str, Any]:
        listed = gateway_call.gateway.routing.list_models()
        return model_list([(m.id, m.owned_by) for m in listed])

    @get("/health")
    async def health(self, gateway_call: GatewayCall) -> dict[str, Any]:
        states = list(gateway_call.gateway.routing.registry)
        healthy = sum(1 for s in states if s.health.healthy)
        status = "ok" if states and healthy == len(states) else "degraded" if healthy else "down"
        return {"status": status, "backends": {"total": len(states), "healthy": healthy}}
