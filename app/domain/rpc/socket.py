"""``GET /api/rpc/ws``: JSON-RPC over a WebSocket, with pushed job notifications.

Handshake: ``Authorization: Bearer`` as on ``/v1`` (API key or user access token;
SDK-style clients can set headers, so there is no ``?token=`` variant to leak into
logs). A refusal happens before ``accept``: an HTTP 401/403 with a JSON-RPC error
body where the server supports WebSocket denial responses (uvicorn does), else a
close with 1008.

After ``accept``, each text (or binary, UTF-8) frame is one message or a batch,
answered in order on the same socket; messages from one socket are handled one at a
time. The server pushes ``video.progress`` / ``video.done`` / ``video.failed`` for
every job created on the socket and every stream subscribed with
``video.subscribe`` (see ``live`` for the ordering and replay rules); the watched
streams are re-read every ``RESYNC_SECONDS`` so a change whose event was lost still
arrives.

One writer task sends everything from the subscriber's bounded queue
(``QUEUE_SIZE``). A client that does not read fills it: the socket is closed with
1008 ("too slow"), and the client may reconnect and subscribe again (the replay
sends the current state). A lost live feed closes with 1011. Leaving releases every
subscription at once.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass
from typing import Any

import structlog
from litestar import WebSocket, websocket
from litestar.exceptions import WebSocketDisconnect
from litestar.handlers import WebsocketRouteHandler

from app.domain.asgi_io import refuse_websocket
from app.domain.calls.callers import CallerResolver
from app.domain.rpc.dispatch import Dispatcher
from app.domain.rpc.live import (
    LOST,
    OVERFLOW,
    FeedUnavailableError,
    LiveHub,
    Subscriber,
    SubscriberEndedError,
)
from app.domain.rpc.methods import RpcContext, socket_dispatcher
from app.domain.rpc.protocol import encode, encode_error, invalid_request, notification
from app.domain.rpc.transport import failure, owner_of, request_id
from app.domain.video.events import notification_of
from app.domain.video.facade import VideoJobs, VideoOwner
from app.lib.errors import AronaError, ServiceUnavailableError

QUEUE_SIZE = 256
RESYNC_SECONDS = 30.0
CLOSE_SECONDS = 10.0
CLOSE_POLICY = 1008
CLOSE_ERROR = 1011
logger = structlog.get_logger()

Socket = WebSocket[Any, Any, Any]


def ws_notification(method: str, params: dict[str, Any]) -> bytes:
    return encode(notification(method, params))


async def _deny(socket: Socket, exc: AronaError) -> None:
    """Refuse the handshake with the JSON-RPC error (or a 1008 close)."""
    status, body, headers = failure(exc)
    await refuse_websocket(socket, status, body, reason=exc.message, headers=headers)


@dataclass(slots=True, eq=False)
class _Session:
    socket: Socket
    sub: Subscriber
    owner: VideoOwner
    jobs: VideoJobs
    dispatcher: Dispatcher[RpcContext]
    max_message_bytes: int

    async def read(self) -> None:
        """Handle frames until the client leaves."""
        while True:
            message = await self.socket.receive()
            if message["type"] == "websocket.disconnect":
                return
            text, raw = message.get("text"), message.get("bytes")
            data = text if isinstance(text, str) else raw if isinstance(raw, bytes) else None
            if data is None:
                continue
            ctx = RpcContext(owner=self.owner, jobs=self.jobs, live=self.sub)
            if len(data) > self.max_message_bytes:
                error = invalid_request(
                    f"a message holds at most {self.max_message_bytes} bytes",
                    code="request_too_large",
                    status=413,
                )
                answer: bytes | None = encode_error(error)
            else:
                answer = await self.dispatcher.handle(data, ctx)
            if answer is not None:
                # Waits while the queue is full: a client that does not read stops
                # being read (and is dropped once notifications overflow).
                await self.sub.queue.put((answer, False))
            for action in ctx.after:
                await action()

    async def write(self) -> None:
        while True:
            item = await self.sub.next_message()
            if item is not None:
                await self.socket.send_text(item[0].decode())

    async def resync(self, every: float) -> None:
        while True:
            await asyncio.sleep(every)
            for stream_id in self.sub.live_streams():
                try:
                    current = await self.jobs.find_stream(self.owner, stream_id)
                except Exception as exc:
                    logger.warning("could not re-read a video job", error=repr(exc))
                    break
                if current is None:
                    self.sub.unwatch(stream_id)
                else:
                    self.sub.offer(stream_id, notification_of(current))

    async def run(self) -> None:
        tasks = {
            asyncio.create_task(self.read(), name="rpc-socket-read"): "read",
            asyncio.create_task(self.write(), name="rpc-socket-write"): "write",
            asyncio.create_task(self.resync(RESYNC_SECONDS), name="rpc-socket-resync"): "resync",
        }
        try:
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        for task in done:
            if task.cancelled():
                continue
            exc = task.exception()
            if isinstance(exc, SubscriberEndedError):
                await self._close_ended(str(exc))
            elif exc is not None and not _is_disconnect(exc):
                logger.warning("rpc socket failed", error=repr(exc))
                await self._close(CLOSE_ERROR, "server error; reconnect")

    async def _close_ended(self, reason: str) -> None:
        if reason == OVERFLOW:
            await self._close(CLOSE_POLICY, "too slow: notification backlog overflowed")
        elif reason == LOST:
            await self._close(CLOSE_ERROR, "live notifications lost; reconnect")

    async def _close(self, code: int, reason: str) -> None:
        # Bounded: the close frame queues behind what a slow client has not read yet,
        # and a client that never reads must not hold this handler forever.
        with contextlib.suppress(Exception):
            async with asyncio.timeout(CLOSE_SECONDS):
                await self.socket.close(code=code, reason=reason)


def _is_disconnect(exc: BaseException) -> bool:
    # Sending to a client that has gone (uvicorn's ClientDisconnected is an OSError).
    return isinstance(exc, WebSocketDisconnect | OSError)


def rpc_socket_handler(
    callers: CallerResolver, jobs: VideoJobs, hub: LiveHub, *, max_message_bytes: int
) -> WebsocketRouteHandler:
    dispatcher = socket_dispatcher(request_id)

    async def rpc_socket(socket: Socket) -> None:
        try:
            owner = await owner_of(callers, socket.scope)
        except AronaError as exc:
            await _deny(socket, exc)
            return
        try:
            async with hub.subscriber(capacity=QUEUE_SIZE, encode=ws_notification) as sub:
                await socket.accept()
                session = _Session(socket, sub, owner, jobs, dispatcher, max_message_bytes)
                await session.run()
        except FeedUnavailableError:
            unavailable = ServiceUnavailableError(
                "live notifications are unavailable right now; use POST /api/rpc",
                code="events_unavailable",
            )
            await _deny(socket, unavailable)

    return websocket("/api/rpc/ws", name="rpc_socket")(rpc_socket)
