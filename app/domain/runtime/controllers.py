"""Runtime API (runtime JWT): identity check and ``POST /api/runtime/chat``."""

from __future__ import annotations

from uuid import UUID

import msgspec
from litestar import Controller, get, post
from litestar.types import Receive, Scope, Send

from app.domain.accounts.principals import Principal, RuntimePrincipal
from app.domain.asgi_stream import send_event_stream
from app.domain.calls.callers import CallKey
from app.domain.runtime.chat import RuntimeChatService
from app.domain.runtime.prepared import ChatReply
from app.domain.runtime.schemas import RuntimeChatRequest
from app.lib.errors import ERRORS_OPT, PermissionDeniedError


class RuntimeIdentity(msgspec.Struct, rename="camel"):
    project_id: UUID
    token_id: UUID


def require_runtime(principal: Principal) -> RuntimePrincipal:
    if not isinstance(principal, RuntimePrincipal):
        raise PermissionDeniedError(
            "this endpoint needs a runtime token", code="runtime_token_required"
        )
    return principal


class ChatResponse:
    """Answers with the prepared reply; a stream relays through the shared SSE sender,
    which cancels the relay the moment the runtime disconnects."""

    def __init__(self, reply: ChatReply) -> None:
        self._reply = reply

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        reply = self._reply
        if reply.events is not None:
            await send_event_stream(send, receive, reply.events, extra_headers=reply.headers)
            return
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(reply.body)).encode()),
                    *reply.headers,
                ],
            }
        )
        await send({"type": "http.response.body", "body": reply.body, "more_body": False})


class RuntimeController(Controller):
    path = "/api/runtime"
    tags = ["runtime"]

    @get("/me")
    async def whoami(self, principal: Principal) -> RuntimeIdentity:
        """Lets a runtime check that its token is valid and which project it serves."""
        runtime = require_runtime(principal)
        return RuntimeIdentity(project_id=runtime.project_id, token_id=runtime.token_id)

    @post("/chat", status_code=200, opt={ERRORS_OPT: (404, 429, 500, 502)})
    async def chat(
        self, data: RuntimeChatRequest, principal: Principal, runtime_chat: RuntimeChatService
    ) -> ChatResponse:
        """One turn of a conversation. Streams OpenAI chunks over SSE (``stream``
        defaults to true) ending with a usage chunk and ``data: [DONE]``; headers
        ``X-Arona-Profile``, ``X-Arona-Backend`` and ``X-Arona-Failover`` say who served."""
        runtime = require_runtime(principal)
        prepared = await runtime_chat.prepare(runtime.project_id, data, CallKey.of(runtime))
        return ChatResponse(await runtime_chat.reply(prepared))
