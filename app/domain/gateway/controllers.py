"""``/v1``: OpenAI-compatible chat completions, embeddings, models and health."""

from __future__ import annotations

from typing import Any

from litestar import Controller, MediaType, Request, Response, get, post
from litestar.response import Stream

from app.domain.accounts.principals import Principal
from app.domain.gateway.parsing import model_list, parse_request
from app.domain.gateway.services import Caller, GatewayService
from app.lib.sse import STREAM_HEADERS
from app.routing.registry import BackendRegistry


class GatewayController(Controller):
    path = "/v1"
    tags = ["gateway"]

    @post("/chat/completions", status_code=200)
    async def chat_completions(
        self, request: Request[Any, Any, Any], principal: Principal, gateway: GatewayService
    ) -> Response[bytes] | Stream:
        caller = Caller.of(principal)
        parsed = parse_request(await request.body(), "chat")
        if parsed.stream:
            events = await gateway.open_stream(caller, parsed)
            return Stream(events, media_type="text/event-stream", headers=STREAM_HEADERS)
        outcome = await gateway.complete(caller, parsed, "chat")
        return Response(outcome.content, media_type=MediaType.JSON)

    @post("/embeddings", status_code=200)
    async def embeddings(
        self, request: Request[Any, Any, Any], principal: Principal, gateway: GatewayService
    ) -> Response[bytes]:
        caller = Caller.of(principal)
        parsed = parse_request(await request.body(), "embeddings")
        outcome = await gateway.complete(caller, parsed, "embeddings")
        return Response(outcome.content, media_type=MediaType.JSON)

    @get("/models")
    async def models(self, principal: Principal, gateway: GatewayService) -> dict[str, Any]:
        Caller.of(principal)
        return model_list([(m.id, m.owned_by) for m in gateway.routing.list_models()])

    @get("/health")
    async def health(
        self, principal: Principal, backend_registry: BackendRegistry
    ) -> dict[str, Any]:
        Caller.of(principal)
        states = list(backend_registry)
        healthy = sum(1 for s in states if s.health.healthy)
        status = "ok" if states and healthy == len(states) else "degraded" if healthy else "down"
        return {"status": status, "backends": {"total": len(states), "healthy": healthy}}
