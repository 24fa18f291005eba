"""``POST /api/runtime/chat``: from a runtime's turn to a relayed, stored, metered answer.

The order of a call:

1. Load the conversation (project-scoped) with its history and any sticky pin.
2. Resolve the profile: the request's, else the conversation's, else the project
   default; it must be enabled for the project.
3. Sticky fallback: a conversation pinned away from that profile goes to the pin's
   target instead.
4. Latency failover: unless the conversation is a priority one, a slow profile is
   swapped for the first healthy link of its preference chain.
5. Open the upstream stream on a backend carrying the profile's tags (retries on
   other backends happen here, before the runtime has seen a byte), store the new
   user turn(s), and only then answer with headers naming profile, backend and any
   failover.
6. Relay; when the stream completes, store the assistant turn and end with a usage
   chunk and ``[DONE]``. When it drops (upstream cut or runtime gone) and the
   profile has a fallback, pin the conversation to it (a priority conversation's
   drop is logged, never pinned, and an existing pin does not move it).
7. Meter every call (the routing service feeds time-to-first-token to latency
   failover).
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from dataclasses import dataclass
from uuid import UUID

import structlog

from app.domain.conversations.messages import NewMessage, validate_messages
from app.domain.conversations.selection import choose_profile
from app.domain.custom_llms.directory import parse_llm_id
from app.domain.gateway.admission import CallAdmission
from app.domain.profiles.catalog import ProfileCatalog
from app.domain.runtime.conversation_store import ChatHistory, ConversationStore
from app.domain.runtime.prepared import (
    ChatReply,
    Failover,
    Outcome,
    PreparedChat,
    custom_profile,
)
from app.domain.runtime.schemas import RuntimeChatRequest
from app.domain.runtime.transcript import Transcript, completion_message
from app.domain.runtime.upstream_body import check_capabilities, upstream_body
from app.domain.usage.entry import UsageEntry, UsageSink
from app.lib.clock import utcnow
from app.lib.errors import AronaError
from app.lib.sse import DONE, error_frame
from app.routing.failover import Availability, FailoverPolicy
from app.routing.profiles import Profile, ProfileTable
from app.routing.service import RelayedStream, RoutingService
from app.routing.types import RouteHints

logger = structlog.get_logger()
ENDPOINT = "runtime_chat"
CLIENT_CLOSED_STATUS = 499
PIN_UPSTREAM_DROPPED = "upstream_dropped"
PIN_CLIENT_DISCONNECTED = "client_disconnected"


@dataclass(slots=True)
class _Refused:
    """What is known of a call when it is refused, for its usage row."""

    requested: str
    profile_id: str | None = None
    is_custom: bool = False


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
    ) -> None:
        self._admission = admission
        self._routing = routing
        self._profiles = profiles
        self._catalog = catalog
        self._failover = failover
        self._conversations = conversations
        self._usage = usage

    # ---------------------------------------------------------------- preparing

    async def prepare(self, project_id: UUID, request: RuntimeChatRequest) -> PreparedChat:
        started = self._routing.clock()
        # Cheap checks first: a malformed turn is a 400 before anything touches the
        # database (not a call yet, so not metered, as on /v1).
        turns = validate_messages(request.messages)
        refused = _Refused(request.model_profile_id or request.llm_id or "")
        try:
            return await self._prepare(project_id, request, turns, started, refused)
        except AronaError as exc:
            # A refused call is metered too (a 429 counts against nobody's quota but
            # shows in the project's usage, as on /v1).
            await self._meter_refusal(project_id, request, refused, exc, started)
            raise

    async def _prepare(
        self,
        project_id: UUID,
        request: RuntimeChatRequest,
        turns: list[NewMessage],
        started: float,
        refused: _Refused,
    ) -> PreparedChat:
        choice = choose_profile(
            self._profiles,
            request.model_profile_id,
            request.llm_id,
            request.provider,
            null_clears=False,
        )
        history = await self._conversations.load(project_id, request.conversation_id)
        requested = choice.profile_id or history.model_profile_id
        refused.requested = requested or refused.requested
        new_turns = [m.to_openai() for m in request.messages]
        conversation = str(history.conversation_id)
        failover: Failover | None = None
        if requested is not None and parse_llm_id(requested) is not None:
            # The project's own endpoint: no profile policies, no shared pool.
            refused.is_custom = True
            admission = await self._admission.admit(project_id, conversation, requested)
            profile = custom_profile(requested, admission)
        else:
            profile = await self._catalog.resolve(project_id, requested)
            refused.requested = refused.requested or profile.id
            # A priority conversation stays where its owner put it: no pin moves it.
            pinned = (
                None
                if history.priority
                else await self._pinned_target(project_id, history, profile)
            )
            if pinned is not None:
                failover = Failover("pin", profile.id)
                profile = pinned
            decision = self._failover.route(
                profile,
                priority=history.priority,
                available=await self._available_links(project_id, profile),
            )
            if decision.redirected_from is not None and failover is None:
                failover = Failover("latency", decision.redirected_from)
            profile = decision.profile
            refused.profile_id = profile.id
            check_capabilities(profile, request, new_turns)
            # Last: a refused request must not spend quota.
            admission = await self._admission.admit(
                project_id, conversation, profile.base_model, also_known_as=(profile.id,)
            )
        return PreparedChat(
            project_id=project_id,
            history=history,
            requested_profile=requested or profile.id,
            profile=profile,
            failover=failover,
            body=upstream_body(profile, request, [*history.messages, *new_turns]),
            new_turns=turns,
            stream=request.stream,
            started=started,
            admission=admission,
        )

    async def _pinned_target(
        self, project_id: UUID, history: ChatHistory, profile: Profile
    ) -> Profile | None:
        """The pin's target, when the pin is about this profile and its target is usable.

        A pin moves a conversation off one profile; a turn that asks for another
        profile (say, one that reads images) is not dragged along.
        """
        pin = history.pin
        if pin is None or pin.from_profile_id != profile.id:
            return None
        target = self._profiles.get(pin.to_profile_id)
        if target is None or not await self._catalog.is_enabled_for(project_id, target.id):
            logger.warning(
                "fallback pin ignored: its target profile is gone or disabled",
                conversation=str(history.conversation_id),
                target=pin.to_profile_id,
            )
            return None
        return target

    async def _available_links(self, project_id: UUID, profile: Profile) -> Availability:
        """The chain links latency failover may use: enabled for the project and
        served by at least one usable backend right now."""
        usable: set[str] = set()
        for link_id in profile.failover_chain:
            link = self._profiles.get(link_id)
            if link is None or not await self._catalog.is_enabled_for(project_id, link_id):
                continue
            if self._routing.router.can_serve(link.base_model, link.tags):
                usable.add(link_id)

        def available(link: Profile) -> bool:
            return link.id in usable

        return available

    # ----------------------------------------------------------------- serving

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
        outcome = Outcome()
        try:
            result = await self._routing.chat(
                prepared.profile.base_model,
                prepared.body,
                self._hints(prepared),
                target=prepared.admission.target,
            )
        except AronaError as exc:
            outcome.status, outcome.error_code = exc.status_code, exc.code
            await self._meter(prepared, outcome)
            raise
        outcome.backend, outcome.served_model = result.backend, result.served_model
        outcome.usage = result.usage
        # No latency sample: a complete answer's latency includes the whole generation,
        # which the profile's time-to-first-token threshold does not describe.
        content, tool_calls = completion_message(result.content)
        try:
            await self._conversations.append_user_turns(
                prepared.conversation_id, prepared.new_turns
            )
            await self._conversations.append_assistant(
                prepared.conversation_id,
                content=content,
                tool_calls=tool_calls,
                profile_id=prepared.profile.id,
                backend=result.backend,
                usage=result.usage,
            )
        finally:
            await self._meter(prepared, outcome)
        return ChatReply(headers=self._headers(prepared, result.backend), body=result.content)

    async def _open_stream(self, prepared: PreparedChat) -> ChatReply:
        outcome = Outcome()
        try:
            relay = await self._routing.open_chat_stream(
                prepared.profile.base_model,
                prepared.body,
                self._hints(prepared),
                include_usage=True,
                target=prepared.admission.target,
            )
        except AronaError as exc:
            outcome.status, outcome.error_code = exc.status_code, exc.code
            await self._meter(prepared, outcome)
            raise
        try:
            # Stored once an upstream took the call: a refused call leaves no orphan
            # user turn behind for the runtime's retry to duplicate.
            await self._conversations.append_user_turns(
                prepared.conversation_id, prepared.new_turns
            )
        except BaseException:
            await relay.aclose()
            outcome.status, outcome.error_code = 500, "conversation_store_failed"
            await self._meter(prepared, outcome)
            raise
        return ChatReply(
            headers=self._headers(prepared, relay.backend),
            events=self._relay(prepared, relay, outcome),
        )

    async def _relay(
        self, prepared: PreparedChat, relay: RelayedStream, outcome: Outcome
    ) -> AsyncGenerator[bytes, None]:
        transcript = Transcript()
        finished = False
        settled = False
        pin_reason: str | None = None

        async def settle() -> None:
            """Close, pin and meter once: before the last frames go out, so a runtime
            that saw ``[DONE]`` was metered (from ``finally`` when it left)."""
            nonlocal settled
            if settled:
                return
            settled = True
            if not finished:
                outcome.status, outcome.error_code = CLIENT_CLOSED_STATUS, "client_closed"
            try:
                await relay.aclose()
                if not finished:
                    await self._after_drop(prepared, relay, PIN_CLIENT_DISCONNECTED)
            finally:
                outcome.backend, outcome.served_model = relay.backend or None, relay.served_model
                outcome.usage = transcript.upstream_usage or relay.usage
                # Latency failover hears of the first token from the routing service
                # (every surface's calls count), not from here.
                if relay.first_byte_at is not None:
                    outcome.ttft_ms = int((relay.first_byte_at - prepared.started) * 1000)
                await self._meter(prepared, outcome)

        try:
            try:
                async for chunk in relay:
                    out = transcript.feed(chunk)
                    if out:
                        yield out
            except AronaError as exc:
                # Headers are gone already: the failure travels in the stream itself.
                outcome.status, outcome.error_code = exc.status_code, exc.code
                pin_reason = PIN_UPSTREAM_DROPPED
                message = await self._after_drop(prepared, relay, pin_reason)
                finished = True
                body = exc.body()
                if message:
                    body["error"]["message"] = f"{body['error']['message']} ({message})"
                await settle()
                yield error_frame(body) + DONE
                return
            usage = transcript.upstream_usage or relay.usage
            await self._conversations.append_assistant(
                prepared.conversation_id,
                content=transcript.content,
                tool_calls=transcript.tool_calls,
                profile_id=prepared.profile.id,
                backend=relay.backend,
                usage=usage,
            )
            finished = True
            await settle()
            yield transcript.closing_frames(usage, relay.served_model)
        finally:
            await settle()

    async def _after_drop(self, prepared: PreparedChat, relay: RelayedStream, reason: str) -> str:
        """Pin the conversation to the profile's fallback after a dropped stream; a
        priority conversation's drop is only recorded (it is never redirected)."""
        fallback = prepared.profile.fallback_profile_id
        if not fallback or self._profiles.get(fallback) is None:
            return ""
        if prepared.history.priority:
            logger.warning(
                "priority conversation's stream dropped: not pinned to its fallback",
                conversation=str(prepared.conversation_id),
                profile=prepared.profile.id,
                fallback=fallback,
                backend=relay.backend or None,
                reason=reason,
            )
            return "priority conversation: not pinned"
        try:
            await self._conversations.pin_fallback(
                prepared.conversation_id,
                prepared.project_id,
                from_profile_id=prepared.profile.id,
                to_profile_id=fallback,
                reason=reason,
                backend=relay.backend or None,
            )
        except Exception as exc:  # the pin is a policy; losing it must not hide the drop
            logger.error("could not pin a conversation to its fallback", error=repr(exc))
            return ""
        logger.info(
            "conversation pinned to fallback profile",
            conversation=str(prepared.conversation_id),
            from_profile=prepared.profile.id,
            to_profile=fallback,
            reason=reason,
        )
        return f"conversation pinned to profile {fallback}"

    async def _meter_refusal(
        self,
        project_id: UUID,
        request: RuntimeChatRequest,
        refused: _Refused,
        error: AronaError,
        started: float,
    ) -> None:
        try:
            await self._usage.record(
                UsageEntry(
                    project_id=project_id,
                    model_requested=refused.requested,
                    endpoint=ENDPOINT,
                    streamed=request.stream,
                    status=error.status_code,
                    error_code=error.code,
                    latency_ms=int((self._routing.clock() - started) * 1000),
                    conversation_id=str(request.conversation_id),
                    model_profile_id=refused.profile_id,
                    is_custom=refused.is_custom,
                    created_at=utcnow(),
                )
            )
        except Exception as exc:  # metering must never fail the request it meters
            logger.error("could not record usage", error=repr(exc))

    async def _meter(self, prepared: PreparedChat, outcome: Outcome) -> None:
        try:
            await self._usage.record(
                UsageEntry(
                    project_id=prepared.project_id,
                    model_requested=prepared.requested_profile,
                    model_served=outcome.served_model or None,
                    backend=outcome.backend,
                    endpoint=ENDPOINT,
                    streamed=prepared.stream,
                    prompt_tokens=outcome.usage.prompt_tokens,
                    completion_tokens=outcome.usage.completion_tokens,
                    total_tokens=outcome.usage.total_tokens,
                    estimated=outcome.usage.estimated,
                    status=outcome.status,
                    error_code=outcome.error_code,
                    latency_ms=int((self._routing.clock() - prepared.started) * 1000),
                    ttft_ms=outcome.ttft_ms,
                    conversation_id=str(prepared.conversation_id),
                    model_profile_id=prepared.profile.id,
                    is_custom=prepared.admission.is_custom,
                    is_override_key=prepared.admission.is_override_key,
                    created_at=utcnow(),
                )
            )
        except Exception as exc:  # metering must never fail the request it meters
            logger.error("could not record usage", error=repr(exc))
