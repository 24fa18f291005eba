"""Preparing a runtime chat: from the request to the profile, body and admission.

1. Load the conversation (project-scoped) with its history and any sticky pin.
2. Resolve the profile: the request's, else the conversation's, else the project
   default; it must be enabled for the project.
3. Sticky fallback: a conversation pinned away from that profile goes to the pin's
   target instead.
4. Latency failover: unless the conversation is a priority one, a slow profile is
   swapped for the first healthy link of its preference chain.
5. Admission last (``app.domain.calls``): a refused request must not spend quota.

A call refused on the way is metered too (``ChatPreparer.prepare``).
"""

from __future__ import annotations

from uuid import UUID

import structlog

from app.domain.calls.admission import allow_model
from app.domain.calls.callers import CallKey
from app.domain.calls.estimate import CallShape
from app.domain.calls.metering import CallRecord
from app.domain.conversations.messages import NewMessage, validate_messages
from app.domain.conversations.selection import choose_profile
from app.domain.custom_llms.directory import parse_llm_id
from app.domain.runtime.conversation_store import ChatHistory
from app.domain.runtime.deps import ChatDeps
from app.domain.runtime.prepared import ENDPOINT, Failover, PreparedChat, custom_profile
from app.domain.runtime.schemas import RuntimeChatRequest
from app.domain.runtime.upstream_body import check_capabilities, estimate_body, upstream_body
from app.routing.failover import Availability
from app.routing.profiles import Profile

logger = structlog.get_logger()


class ChatPreparer:
    def __init__(self, deps: ChatDeps) -> None:
        self._deps = deps

    async def prepare(
        self, project_id: UUID, request: RuntimeChatRequest, key: CallKey | None = None
    ) -> PreparedChat:
        started = self._deps.meter.now()
        # Cheap checks first: a malformed turn is a 400 before anything touches the
        # database (not a call yet, so not metered, as on /v1).
        turns = validate_messages(request.messages)
        # What is known of the call when it is refused, for its usage row.
        refused = CallRecord(
            endpoint=ENDPOINT,
            model_requested=request.model_profile_id or request.llm_id or "",
            started=started,
            project_id=project_id,
            api_key_id=None if key is None else key.credential_id,
            streamed=request.stream,
            conversation_id=str(request.conversation_id),
        )
        # A refused call is metered too (a 429 counts against nobody's quota but shows
        # in the project's usage, as on /v1).
        async with self._deps.meter.failures(refused):
            return await self._prepare(project_id, request, turns, started, refused, key)

    async def _prepare(
        self,
        project_id: UUID,
        request: RuntimeChatRequest,
        turns: list[NewMessage],
        started: float,
        refused: CallRecord,
        key: CallKey | None,
    ) -> PreparedChat:
        choice = choose_profile(self._deps.profiles, request, null_clears=False)
        history = await self._deps.conversations.load(project_id, request.conversation_id)
        requested = choice.profile_id or history.model_profile_id
        refused.model_requested = requested or refused.model_requested
        new_turns = [m.to_openai() for m in request.messages]
        conversation = str(history.conversation_id)
        failover: Failover | None = None
        if requested is not None and parse_llm_id(requested) is not None:
            # The project's own endpoint: no profile policies, no shared pool.
            refused.is_custom = True
            admission = await self._deps.admission.admit(
                project_id,
                conversation,
                requested,
                key=key,
                shape=CallShape(estimate_body(request, [*history.messages, *new_turns])),
            )
            profile = custom_profile(requested, admission)
            body = upstream_body(profile, request, [*history.messages, *new_turns])
        else:
            profile = await self._deps.catalog.resolve(project_id, requested)
            refused.model_requested = refused.model_requested or profile.id
            # The key may call what was asked for (the profile or its base model);
            # where pins or failover then send it is the project's own policy.
            asked = (profile.id, profile.base_model)
            if key is not None and key.policy.limits_models:
                allow_model(key, asked)
            # A priority conversation stays where its owner put it: no pin moves it.
            pinned = (
                None
                if history.priority
                else await self._pinned_target(project_id, history, profile)
            )
            if pinned is not None:
                failover = Failover("pin", profile.id)
                profile = pinned
            decision = self._deps.failover.route(
                profile,
                priority=history.priority,
                available=await self._available_links(project_id, profile),
            )
            if decision.redirected_from is not None and failover is None:
                failover = Failover("latency", decision.redirected_from)
            profile = decision.profile
            refused.model_profile_id = profile.id
            check_capabilities(profile, request, new_turns)
            body = upstream_body(profile, request, [*history.messages, *new_turns])
            # Last: a refused request must not spend quota.
            admission = await self._deps.admission.admit(
                project_id,
                conversation,
                profile.base_model,
                also_known_as=(profile.id,),
                key=key,
                requested=asked,
                shape=CallShape(body, output_cap=profile.max_output_tokens),
            )
        return PreparedChat(
            project_id=project_id,
            history=history,
            requested_profile=requested or profile.id,
            profile=profile,
            failover=failover,
            body=body,
            new_turns=turns,
            stream=request.stream,
            started=started,
            admission=admission,
            credential_id=None if key is None else key.credential_id,
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
        target = self._deps.profiles.get(pin.to_profile_id)
        if target is None or not await self._deps.catalog.is_enabled_for(project_id, target.id):
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
            link = self._deps.profiles.get(link_id)
            if link is None or not await self._deps.catalog.is_enabled_for(project_id, link_id):
                continue
            if self._deps.router.can_serve(link.base_model, link.tags):
                usable.add(link_id)

        def available(link: Profile) -> bool:
            return link.id in usable

        return available
