"""What the runtime chat's parts work with, built once by ``RuntimeChatService``.

The service, its preparer and each stream's steps read the same collaborators from
this one object instead of each taking and storing its own copies.
"""

from __future__ import annotations

from dataclasses import dataclass

from app.domain.calls.admission import CallAdmission
from app.domain.calls.metering import Meter
from app.domain.profiles.catalog import ProfileCatalog
from app.domain.runtime.conversation_store import ConversationStore
from app.routing.failover import FailoverPolicy
from app.routing.profiles import ProfileTable
from app.routing.router import Router


@dataclass(frozen=True, slots=True)
class ChatDeps:
    router: Router
    profiles: ProfileTable
    catalog: ProfileCatalog
    failover: FailoverPolicy
    conversations: ConversationStore
    admission: CallAdmission
    meter: Meter
