"""What a runtime chat carries between preparing it and answering it."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncGenerator
from dataclasses import dataclass
from uuid import UUID

from app.domain.calls.admission import Admission
from app.domain.calls.metering import CallRecord
from app.domain.conversations.messages import NewMessage
from app.domain.runtime.conversation_store import ChatHistory
from app.routing.profiles import Profile
from app.routing.types import RawBody

ENDPOINT = "runtime_chat"
"""The usage records' ``endpoint`` of runtime chats."""


@dataclass(frozen=True, slots=True)
class Failover:
    """Why the profile that serves differs from the one asked for."""

    kind: str
    """``latency`` (non-sticky redirect) or ``pin`` (sticky fallback)."""
    from_profile: str

    @property
    def header(self) -> str:
        return f"{self.kind}; from={self.from_profile}"


@dataclass(slots=True)
class PreparedChat:
    project_id: UUID
    history: ChatHistory
    requested_profile: str
    profile: Profile
    failover: Failover | None
    body: RawBody
    new_turns: list[NewMessage]
    stream: bool
    started: float
    admission: Admission
    credential_id: UUID | None = None
    """The runtime token that made the call: its usage rows carry it in
    ``api_key_id`` (a credential id, not a foreign key), so each token's spend shows."""

    @property
    def conversation_id(self) -> UUID:
        return self.history.conversation_id

    def call_record(self) -> CallRecord:
        """The call's usage record, filled as it runs."""
        record = CallRecord(
            endpoint=ENDPOINT,
            model_requested=self.requested_profile,
            started=self.started,
            project_id=self.project_id,
            api_key_id=self.credential_id,
            streamed=self.stream,
            conversation_id=str(self.conversation_id),
            model_profile_id=self.profile.id,
        )
        record.admitted(self.admission)
        return record


@dataclass(slots=True)
class ChatReply:
    """Headers to answer with, and either a complete JSON body or an SSE stream."""

    headers: list[tuple[bytes, bytes]]
    body: bytes = b""
    events: AsyncGenerator[bytes, None] | None = None


def custom_profile(llm_id: str, admission: Admission) -> Profile:
    """A custom LLM seen as a profile: its own model and limits, no tags, no
    fallback, no failover (it is one endpoint, not a pool)."""
    profile = Profile(
        id=llm_id,
        name=llm_id,
        base_model=admission.model,
        supports_tools=True,  # whatever the endpoint does with tools is its own answer
        supports_images=True,
    )
    if admission.max_output_tokens is not None:
        profile = dataclasses.replace(profile, max_output_tokens=admission.max_output_tokens)
    return profile
