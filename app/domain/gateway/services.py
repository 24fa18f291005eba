"""Glue between the ``/v1`` handlers, the routing service and the usage meter.

Every request that reaches a handler with valid credentials writes exactly one usage
record, whether it succeeded, was refused or failed mid-stream.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from dataclasses import dataclass
from uuid import UUID

import structlog

from app.domain.gateway.admission import Admission, CallAdmission
from app.domain.gateway.parsing import Endpoint, GatewayRequest, ListedModelOut
from app.domain.usage.entry import UsageEntry, UsageSink
from app.lib.clock import utcnow
from app.lib.errors import AronaError
from app.lib.sse import DONE, error_frame
from app.routing.service import CallOutcome, RelayedStream, RoutingService
from app.routing.types import RouteHints, Usage

logger = structlog.get_logger()
CLIENT_CLOSED_STATUS = 499


def done_frame_at(chunk: bytes) -> int:
    """Where the line ``data: [DONE]`` starts in ``chunk`` (relayed chunks end at line
    ends), or -1; ``[DONE]`` inside a content string is not at a line start."""
    at = chunk.find(b"[DONE]")
    while at >= 0:
        start = chunk.rfind(b"\n", 0, at) + 1
        if chunk[start:at].rstrip() == b"data:":
            return start
        at = chunk.find(b"[DONE]", at + 6)
    return -1


@dataclass(frozen=True, slots=True)
class Caller:
    """Who a call is for (``app.domain.gateway.callers`` resolves it): always a
    project, and the API key or the user that called on its behalf."""

    project_id: UUID
    api_key_id: UUID | None
    user_id: UUID | None

    @property
    def scope(self) -> str:
        """Namespace of conversation pins: the project."""
        return str(self.project_id)


@dataclass(slots=True)
class Metered:
    """What one request turned into, collected while it runs."""

    caller: Caller
    endpoint: Endpoint
    model: str
    conversation_id: str | None
    streamed: bool
    started: float
    backend: str | None = None
    served_model: str | None = None
    usage: Usage | None = None
    status: int = 200
    error_code: str | None = None
    ttft_ms: int | None = None
    is_custom: bool = False
    is_override_key: bool = False

    def admitted(self, admission: Admission) -> None:
        self.is_custom, self.is_override_key = admission.is_custom, admission.is_override_key


class GatewayService:
    def __init__(self, routing: RoutingService, usage: UsageSink, admission: CallAdmission) -> None:
        self.routing = routing
        self.usage = usage
        self.admission = admission

    async def list_models(self, caller: Caller) -> list[ListedModelOut]:
        shared = [ListedModelOut(m.id, m.owned_by) for m in self.routing.list_models()]
        return shared + await self.admission.custom_models(caller.project_id)

    def _hints(self, caller: Caller, request: GatewayRequest, admission: Admission) -> RouteHints:
        return RouteHints(
            provider=request.provider,
            conversation_id=request.conversation_id,
            affinity_scope=caller.scope,
            api_key=admission.api_key,
        )

    async def _admit(self, caller: Caller, request: GatewayRequest) -> Admission:
        return await self.admission.admit(caller.project_id, request.conversation_id, request.model)

    def _begin(self, caller: Caller, request: GatewayRequest, endpoint: Endpoint) -> Metered:
        return Metered(
            caller=caller,
            endpoint=endpoint,
            model=request.model,
            conversation_id=request.conversation_id,
            streamed=request.stream,
            started=self.routing.clock(),
        )

    async def complete(
        self, caller: Caller, request: GatewayRequest, endpoint: Endpoint
    ) -> CallOutcome:
        """A non-streaming chat completion or an embedding."""
        metered = self._begin(caller, request, endpoint)
        try:
            admission = await self._admit(caller, request)
            metered.admitted(admission)
            hints = self._hints(caller, request, admission)
            call = self.routing.chat if endpoint == "chat" else self.routing.embed
            outcome = await call(admission.model, request.body, hints, target=admission.target)
        except AronaError as exc:
            metered.status, metered.error_code = exc.status_code, exc.code
            await self._record(metered)
            raise
        metered.backend, metered.served_model = outcome.backend, outcome.served_model
        metered.usage = outcome.usage
        # Before the answer goes out: a completed call is never only in memory.
        await self._record(metered)
        return outcome

    async def open_stream(
        self, caller: Caller, request: GatewayRequest
    ) -> AsyncGenerator[bytes, None]:
        """Open the upstream stream (errors before it starts raise normally)."""
        metered = self._begin(caller, request, "chat")
        try:
            admission = await self._admit(caller, request)
            metered.admitted(admission)
            relay = await self.routing.open_chat_stream(
                admission.model,
                request.body,
                self._hints(caller, request, admission),
                include_usage=request.include_usage,
                target=admission.target,
            )
        except AronaError as exc:
            metered.status, metered.error_code = exc.status_code, exc.code
            await self._record(metered)
            raise
        return self._relay(relay, metered)

    async def _relay(self, relay: RelayedStream, metered: Metered) -> AsyncGenerator[bytes, None]:
        """Relays the upstream's frames but holds its ``[DONE]`` back until the call is
        recorded, so a client that saw the end of its stream was metered."""
        finished = False
        settled = False

        async def settle() -> None:
            nonlocal settled
            if settled:
                return
            settled = True
            try:
                await relay.aclose()
            finally:
                if not finished:
                    metered.status, metered.error_code = CLIENT_CLOSED_STATUS, "client_closed"
                metered.backend = relay.backend or None
                metered.served_model = relay.served_model
                metered.usage = relay.usage
                if relay.first_byte_at is not None:
                    metered.ttft_ms = int((relay.first_byte_at - metered.started) * 1000)
                await self._record(metered)

        try:
            held = b""
            try:
                async for chunk in relay:
                    if held:
                        held += chunk  # after [DONE]: normally nothing but the body's end
                        continue
                    cut = done_frame_at(chunk)
                    if cut < 0:
                        yield chunk
                        continue
                    if cut:
                        yield chunk[:cut]
                    held = chunk[cut:]
                finished = True
            except AronaError as exc:
                # Headers are gone already: the failure travels in the stream itself.
                metered.status, metered.error_code = exc.status_code, exc.code
                finished = True
                await settle()
                yield error_frame(exc.body()) + DONE
                return
            await settle()
            if held:
                yield held
        finally:
            await settle()

    async def _record(self, metered: Metered) -> None:
        usage = metered.usage or Usage()
        try:
            await self.usage.record(
                UsageEntry(
                    project_id=metered.caller.project_id,
                    api_key_id=metered.caller.api_key_id,
                    user_id=metered.caller.user_id,
                    model_requested=metered.model,
                    model_served=metered.served_model or None,
                    backend=metered.backend,
                    endpoint=metered.endpoint,
                    streamed=metered.streamed,
                    prompt_tokens=usage.prompt_tokens,
                    completion_tokens=usage.completion_tokens,
                    total_tokens=usage.total_tokens,
                    estimated=usage.estimated,
                    status=metered.status,
                    error_code=metered.error_code,
                    latency_ms=int((self.routing.clock() - metered.started) * 1000),
                    ttft_ms=metered.ttft_ms,
                    conversation_id=metered.conversation_id,
                    is_custom=metered.is_custom,
                    is_override_key=metered.is_override_key,
                    created_at=utcnow(),
                )
            )
        except Exception as exc:  # metering must never fail the request it meters
            logger.error("could not record usage", error=repr(exc))
