"""Conversations API on two route sets, and the admin API of fallback pins.

``/api/runtime/conversations`` (runtime JWT: the token's project) and
``/api/projects/{projectId}/conversations`` (members read; owners, platform admins
and the project's API keys write) are the same handlers: ``ConversationRoutes``
is subclassed once per route set, each giving its own ``conversation_scope``.
Another project's conversation is a 404 ``conversation_not_found`` everywhere; a
malformed id does not match the route (404), as elsewhere in the API.
"""

from __future__ import annotations

from uuid import UUID

from litestar import Controller, delete, get, patch, post
from litestar.status_codes import HTTP_201_CREATED, HTTP_204_NO_CONTENT

from app.db.models import Conversation, FallbackPin
from app.domain.accounts.principals import Principal
from app.domain.conversations.deps import ConversationScope, project_scope, runtime_scope
from app.domain.conversations.messages import validate_messages
from app.domain.conversations.pins import FallbackPinService, pin_not_found
from app.domain.conversations.schemas import (
    ConversationCreate,
    ConversationFork,
    ConversationOut,
    ConversationUpdate,
    MessageOut,
    PinOut,
    PinSummary,
)
from app.domain.conversations.selection import choose_profile
from app.domain.conversations.services import ConversationService
from app.domain.paging import Page, Paging, by_attributes, from_row
from app.domain.projects.deps import projects_principal
from app.domain.rest import AdminController, scope_paging
from app.lib.errors import ERRORS_OPT
from app.routing.profiles import ProfileTable


def conversation_out(conversation: Conversation, pin: FallbackPin | None) -> ConversationOut:
    return _conversation_fields(
        conversation, fallback_pin=None if pin is None else pin_summary(pin)
    )


# Every field of these is the row's attribute of the same name.
message_out = by_attributes(MessageOut)
pin_out = by_attributes(PinOut)
pin_summary = by_attributes(PinSummary)
_conversation_fields = from_row(ConversationOut)


class ConversationRoutes(Controller):
    """The handlers of both route sets; not registered itself."""

    tags = ["conversations"]

    @post("/", status_code=HTTP_201_CREATED, opt={ERRORS_OPT: (404,)})
    async def create_conversation(
        self,
        data: ConversationCreate,
        conversation_scope: ConversationScope,
        conversations_service: ConversationService,
        profile_table: ProfileTable,
    ) -> ConversationOut:
        conversation_scope.require_write("create conversations")
        profile = choose_profile(profile_table, data, null_clears=False)
        messages = validate_messages(data.messages)
        conversation = await conversations_service.create_conversation(
            conversation_scope.project_id,
            title=data.title,
            profile_id=profile.profile_id,
            priority=data.priority,
            messages=messages,
        )
        return conversation_out(conversation, None)

    @get("/")
    async def list_conversations(
        self,
        conversation_scope: ConversationScope,
        conversations_service: ConversationService,
        paging: Paging,
        priority: bool | None = None,
    ) -> Page[ConversationOut]:
        rows, total = await conversations_service.page(
            conversation_scope.project_id, paging.limit, paging.offset, priority=priority
        )
        return paging.page(rows, total, lambda row: conversation_out(*row))

    @get("/{conversation_id:uuid}")
    async def get_conversation(
        self,
        conversation_id: UUID,
        conversation_scope: ConversationScope,
        conversations_service: ConversationService,
    ) -> ConversationOut:
        row = await conversations_service.require(conversation_scope.project_id, conversation_id)
        return conversation_out(*row)

    @get("/{conversation_id:uuid}/messages")
    async def list_messages(
        self,
        conversation_id: UUID,
        conversation_scope: ConversationScope,
        conversations_service: ConversationService,
        paging: Paging,
    ) -> Page[MessageOut]:
        rows, total = await conversations_service.message_page(
            conversation_scope.project_id, conversation_id, paging.limit, paging.offset
        )
        return paging.page(rows, total, message_out)

    @patch("/{conversation_id:uuid}")
    async def update_conversation(
        self,
        conversation_id: UUID,
        data: ConversationUpdate,
        conversation_scope: ConversationScope,
        conversations_service: ConversationService,
        profile_table: ProfileTable,
    ) -> ConversationOut:
        conversation_scope.require_write("change conversations")
        profile = choose_profile(profile_table, data, null_clears=True)
        row = await conversations_service.update_conversation(
            conversation_scope.project_id,
            conversation_id,
            title=data.title,
            profile=profile,
            priority=data.priority,
        )
        return conversation_out(*row)

    @post("/{conversation_id:uuid}/fork", status_code=HTTP_201_CREATED)
    async def fork_conversation(
        self,
        conversation_id: UUID,
        conversation_scope: ConversationScope,
        conversations_service: ConversationService,
        profile_table: ProfileTable,
        data: ConversationFork | None = None,
    ) -> ConversationOut:
        conversation_scope.require_write("fork conversations")
        body = data or ConversationFork()
        profile = choose_profile(profile_table, body, null_clears=False)
        fork = await conversations_service.fork(
            conversation_scope.project_id,
            conversation_id,
            up_to_message_id=body.up_to_message_id,
            title=body.title,
            profile=profile,
            priority=body.priority,
        )
        return conversation_out(fork, None)

    @delete("/{conversation_id:uuid}", status_code=HTTP_204_NO_CONTENT)
    async def delete_conversation(
        self,
        conversation_id: UUID,
        conversation_scope: ConversationScope,
        conversations_service: ConversationService,
    ) -> None:
        conversation_scope.require_write("delete conversations")
        await conversations_service.delete_conversation(
            conversation_scope.project_id, conversation_id
        )


class RuntimeConversationController(ConversationRoutes):
    path = "/api/runtime/conversations"
    tags = ["runtime"]
    dependencies = {"conversation_scope": runtime_scope, "paging": scope_paging()}


class ProjectConversationController(ConversationRoutes):
    path = "/api/projects/{project_id:uuid}/conversations"
    tags = ["projects"]
    dependencies = {
        "principal": projects_principal,
        "conversation_scope": project_scope,
        "paging": scope_paging(),
    }


class PinAdminController(AdminController):
    path = "/api/admin/pins"
    tags = ["admin: pins"]

    @get("/")
    async def list_pins(
        self,
        platform_admin: Principal,
        pins_service: FallbackPinService,
        paging: Paging,
    ) -> Page[PinOut]:
        rows, total = await pins_service.page(paging.limit, paging.offset)
        return paging.page(rows, total, pin_out)

    @delete("/{conversation_id:uuid}", status_code=HTTP_204_NO_CONTENT)
    async def clear_pin(
        self,
        conversation_id: UUID,
        platform_admin: Principal,
        pins_service: FallbackPinService,
    ) -> None:
        if not await pins_service.clear_pin(conversation_id):
            raise pin_not_found()
