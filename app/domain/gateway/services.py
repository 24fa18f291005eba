"""Glue between the ``/v1`` handlers and the call lifecycle (``app.domain.calls``).

Every request that reaches a handler with valid credentials writes exactly one usage
record, whether it succeeded, was refused or failed mid-stream.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator

from app.domain.calls.admission import Admission, CallAdmission
from app.domain.calls.callers import Caller
from app.domain.calls.estimate import CallShape
from app.domain.calls.metering import CallPricer, CallRecord, Meter
from app.domain.calls.streaming import StreamSteps, metered_stream
from app.domain.gateway.parsing import Endpoint, GatewayRequest, ListedModelOut
from app.domain.usage.entry import UsageSink
from app.routing.service import CallOutcome, RoutingService
from app.routing.types import RouteHints

__all__ = ["GatewayService", "done_frame_at"]


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


class _HoldDone(StreamSteps):
    """Relays the upstream's frames but holds its ``[DONE]`` back until the call is
    recorded, so a client that saw the end of its stream was metered."""

    __slots__ = ("_held",)

    def __init__(self) -> None:
        self._held = b""

    def feed(self, chunk: bytes) -> bytes:
        if self._held:
            self._held += chunk  # after [DONE]: normally nothing but the body's end
            return b""
        cut = done_frame_at(chunk)
        if cut < 0:
            return chunk
        self._held = chunk[cut:]
        return chunk[:cut]

    async def completed(self) -> bytes:
        return self._held


class GatewayService:
    def __init__(
        self,
        routing: RoutingService,
        usage: UsageSink,
        admission: CallAdmission,
        prices: CallPricer | None = None,
    ) -> None:
        self.routing = routing
        self.usage = usage
        self.admission = admission
        self.meter = Meter(usage, routing.clock, prices)

    async def list_models(self, caller: Caller) -> list[ListedModelOut]:
        shared = [ListedModelOut(m.id, m.owned_by) for m in self.routing.list_models()]
        custom = [
            ListedModelOut(
                id=entry.llm_id,
                owned_by="custom",
                context_window=entry.context_window_tokens,
                max_output_tokens=entry.max_output_tokens,
            )
            for entry in await self.admission.custom_llms(caller.project_id)
        ]
        listed = shared + custom
        if caller.key is not None and caller.key.policy.limits_models:
            policy = caller.key.policy
            listed = [m for m in listed if policy.allows(m.id)]
        return listed

    def _hints(self, caller: Caller, request: GatewayRequest, admission: Admission) -> RouteHints:
        return RouteHints(
            provider=request.provider,
            conversation_id=request.conversation_id,
            affinity_scope=caller.scope,
            api_key=admission.api_key,
        )

    async def _admit(
        self, caller: Caller, request: GatewayRequest, endpoint: Endpoint
    ) -> Admission:
        return await self.admission.admit(
            caller.project_id,
            request.conversation_id,
            request.model,
            key=caller.key,
            shape=CallShape(request.body, embedding=endpoint == "embeddings"),
        )

    def _begin(self, caller: Caller, request: GatewayRequest, endpoint: Endpoint) -> CallRecord:
        record = CallRecord(
            endpoint=endpoint,
            model_requested=request.model,
            conversation_id=request.conversation_id,
            streamed=request.stream,
            started=self.meter.now(),
        )
        record.charged_to(caller)
        return record

    async def complete(
        self, caller: Caller, request: GatewayRequest, endpoint: Endpoint
    ) -> CallOutcome:
        """A non-streaming chat completion or an embedding."""
        record = self._begin(caller, request, endpoint)
        async with self.meter.failures(record):
            admission = await self._admit(caller, request, endpoint)
            record.admitted(admission)
            hints = self._hints(caller, request, admission)
            call = self.routing.chat if endpoint == "chat" else self.routing.embed
            outcome = await call(admission.model, request.body, hints, target=admission.target)
        record.served(outcome)
        # Before the answer goes out: a completed call is never only in memory.
        await self.meter.record(record)
        return outcome

    async def open_stream(
        self, caller: Caller, request: GatewayRequest
    ) -> AsyncGenerator[bytes, None]:
        """Open the upstream stream (errors before it starts raise normally)."""
        record = self._begin(caller, request, "chat")
        async with self.meter.failures(record):
            admission = await self._admit(caller, request, "chat")
            record.admitted(admission)
            relay = await self.routing.open_chat_stream(
                admission.model,
                request.body,
                self._hints(caller, request, admission),
                include_usage=request.include_usage,
                target=admission.target,
            )
        return metered_stream(relay, record, self.meter, _HoldDone())
