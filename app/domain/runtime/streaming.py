"""The runtime chat's part in a relayed stream (``app.domain.calls.streaming``).

When the stream completes, the assistant turn is stored and the stream ends with a
usage chunk and ``[DONE]``. When it drops (upstream cut or runtime gone) and the
profile has a fallback, the conversation is pinned to it (a priority conversation's
drop is logged, never pinned, and an existing pin does not move it).
"""

from __future__ import annotations

from typing import Any

import structlog

from app.domain.calls.streaming import StreamSteps
from app.domain.runtime.deps import ChatDeps
from app.domain.runtime.prepared import PreparedChat
from app.domain.runtime.transcript import Transcript
from app.lib.errors import AronaError
from app.routing.relay import RelayedStream
from app.routing.types import Usage

logger = structlog.get_logger()
PIN_UPSTREAM_DROPPED = "upstream_dropped"
PIN_CLIENT_DISCONNECTED = "client_disconnected"


class RuntimeStreamSteps(StreamSteps):
    def __init__(
        self,
        prepared: PreparedChat,
        relay: RelayedStream,
        deps: ChatDeps,
    ) -> None:
        self._prepared = prepared
        self._relay = relay
        self._deps = deps
        self._transcript = Transcript()

    def feed(self, chunk: bytes) -> bytes:
        return self._transcript.feed(chunk)

    def usage(self, relay: RelayedStream) -> Usage:
        return self._transcript.upstream_usage or relay.usage

    async def failed(self, error: AronaError) -> dict[str, Any]:
        message = await self._after_drop(PIN_UPSTREAM_DROPPED)
        body = error.body()
        if message:
            body["error"]["message"] = f"{body['error']['message']} ({message})"
        return body

    async def completed(self) -> bytes:
        transcript, relay = self._transcript, self._relay
        usage = self.usage(relay)
        await self._deps.conversations.append_assistant(
            self._prepared.conversation_id,
            content=transcript.content,
            tool_calls=transcript.tool_calls,
            profile_id=self._prepared.profile.id,
            backend=relay.backend,
            usage=usage,
        )
        return transcript.closing_frames(usage, relay.served_model)

    async def client_gone(self) -> None:
        await self._after_drop(PIN_CLIENT_DISCONNECTED)

    async def _after_drop(self, reason: str) -> str:
        """Pin the conversation to the profile's fallback after a dropped stream; a
        priority conversation's drop is only recorded (it is never redirected)."""
        prepared, relay = self._prepared, self._relay
        fallback = prepared.profile.fallback_profile_id
        if not fallback or self._deps.profiles.get(fallback) is None:
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
            await self._deps.conversations.pin_fallback(
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
