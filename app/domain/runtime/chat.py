"""``POST /api/runtime/chat``: from a runtime's turn to a relayed, stored, metered answer.

The order of a call:

1. Prepare (``preparing.py``): conversation, profile, sticky pin, latency failover,
   then admission (``app.domain.calls``).
2. Open the upstream stream on a backend carrying the profile's tags (retries on
   other backends happen here, before the runtime has seen a byte), store the new
   user turn(s), and only then answer with headers naming profile, backend and any
   failover.
3. Relay through the shared metered stream (``app.domain.calls.streaming``) with the
   runtime's steps (``streaming.py``): store the assistant turn and end with a usage
   chunk and ``[DONE]``; pin the conversation to its fallback when the stream drops.
4. Meter every call (the routing service feeds time-to-first-token to latency
   failover).
"""

from __future__ import annotations

from uuid import UUID

from app.domain.calls.admission import CallAdmission
from app.domain.calls.callers import CallKey
from app.domain.calls.metering import CallPricer, Meter
from app.domain.calls.streaming import metered_stream
from app.domain.profiles.catalog import ProfileCatalog
from app.domain.runtime.conversation_store import ConversationStore
from app.domain.runtime.deps import ChatDeps
from app.domain.runtime.prepared import ChatReply, PreparedChat
from app.domain.runtime.preparing import ChatPreparer
from app.domain.runtime.schemas import RuntimeChatRequest
from app.domain.runtime.streaming import RuntimeStreamSteps
from app.domain.runtime.transcript import completion_message
from app.domain.usage.entry import UsageSink
from app.routing.failover import FailoverPolicy
from app.routing.profiles import ProfileTable
from app.routing.relay import RelayedStream
from app.routing.service import RoutingService
from app.routing.types import RouteHints


class RuntimeChatService:
    def __init__(
        self,
        *,
        routing: RoutingService,
        profiles: ProfileTable,
        catalog: ProfileCatalog,
        failover: FailoverPolicy,
        conversations: ConversationStore,
        usage: UsageSink,
        admission: CallAdmission,
        prices: CallPricer | None = None,
    ) -> None:
        self._routing = routing
        self._deps = ChatDeps(
            router=routing.router,
            profiles=profiles,
            catalog=catalog,
            failover=failover,
            conversations=conversations,
            admission=admission,
            meter=Meter(usage, routing.clock, prices),
        )
        self._preparer = ChatPreparer(self._deps)

    async def prepare(
        self, project_id: UUID, request: RuntimeChatRequest, key: CallKey | None = None
    ) -> PreparedChat:
        """``key``: the runtime token's governance (allowed models, rate)."""
        return await self._preparer.prepare(project_id, request, key)

    def _stream_steps(self, prepared: PreparedChat, relay: RelayedStream) -> RuntimeStreamSteps:
        return RuntimeStreamSteps(prepared, relay, self._deps)

    def _hints(self, prepared: PreparedChat) -> RouteHints:
        return RouteHints(
            conversation_id=str(prepared.conversation_id),
            affinity_scope=str(prepared.project_id),
            tags=prepared.profile.tags,
            api_key=prepared.admission.api_key,
            score=prepared.profile.routing_score,
        )

    def _headers(self, prepared: PreparedChat, backend: str) -> list[tuple[bytes, bytes]]:
        headers = [
            (b"x-arona-profile", prepared.profile.id.encode()),
            (b"x-arona-backend", backend.encode()),
            (b"x-arona-conversation", str(prepared.conversation_id).encode()),
            (b"x-arona-failover", b"none"),
        ]
        if prepared.failover is not None:
            headers[-1] = (b"x-arona-failover", prepared.failover.header.encode())
        return headers

    async def reply(self, prepared: PreparedChat) -> ChatReply:
        if prepared.stream:
            return await self._open_stream(prepared)
        return await self._complete(prepared)

    async def _complete(self, prepared: PreparedChat) -> ChatReply:
        record = prepared.call_record()
        async with self._deps.meter.failures(record):
            result = await self._routing.chat(
                prepared.profile.base_model,
                prepared.body,
                self._hints(prepared),
                target=prepared.admission.target,
            )
        record.served(result)
        # No latency sample: a complete answer's latency includes the whole generation,
        # which the profile's time-to-first-token threshold does not describe.
        content, tool_calls = completion_message(result.content)
        try:
            await self._deps.conversations.append_user_turns(
                prepared.conversation_id, prepared.new_turns
            )
            await self._deps.conversations.append_assistant(
                prepared.conversation_id,
                content=content,
                tool_calls=tool_calls,
                profile_id=prepared.profile.id,
                backend=result.backend,
                usage=result.usage,
            )
        finally:
            await self._deps.meter.record(record)
        return ChatReply(headers=self._headers(prepared, result.backend), body=result.content)

    async def _open_stream(self, prepared: PreparedChat) -> ChatReply:
        record = prepared.call_record()
        async with self._deps.meter.failures(record):
            relay = await self._routing.open_chat_stream(
                prepared.profile.base_model,
                prepared.body,
                self._hints(prepared),
                include_usage=True,
                target=prepared.admission.target,
            )
        try:
            # Stored once an upstream took the call: a refused call leaves no orphan
            # user turn behind for the runtime's retry to duplicate.
            await self._deps.conversations.append_user_turns(
                prepared.conversation_id, prepared.new_turns
            )
        except BaseException:
            await relay.aclose()
            record.status, record.error_code = 500, "conversation_store_failed"
            await self._deps.meter.record(record)
            raise
        return ChatReply(
            headers=self._headers(prepared, relay.backend),
            events=metered_stream(
                relay, record, self._deps.meter, self._stream_steps(prepared, relay)
            ),
        )
