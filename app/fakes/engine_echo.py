"""The reference CEP engine: a real JSON-RPC 2.0 server over WebSocket that echoes.

It speaks protocol v1 (content as strings) or v2 (content as parts) and refuses the
other shape with -32602, checks the handshake token, lists its models, answers
``Engine.Chat`` with the last user message (or a canned reply), streams it as
``Engine.ChatChunk`` notifications after ``Engine.ChatStart`` (the ``is_complete``
chunk carries the last piece and the usage), honours ``Engine.ChatCancel`` and serves
``Engine.Embeddings`` with deterministic vectors.

Tests run it in-process (``async with EchoEngine(...) as engine: engine.url``) and
steer it through its attributes; ``stats`` counts connections, handshakes and calls,
``received`` keeps the calls. ``app.fakes.engine_misbehaving`` adds failure modes.
Standalone: ``python -m app.fakes.engine_echo --port N`` (or ``arona engine-echo``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import socket
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any, NamedTuple, Self

from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.exceptions import ConnectionClosed
from websockets.http11 import Request, Response

from app.fakes.content import count_tokens, embedding_inputs, fake_vector, split_pieces
from app.fakes.engine_wire import (
    RpcFailure,
    UsageNames,
    content_of,
    decode_frame,
    message_text,
    rpc,
    send_json,
    usage_field,
)
from app.fakes.serve import run_in_foreground, wait_for_stop_signal

MAX_RECEIVED = 256
MAX_FRAME_BYTES = 64 * 1024 * 1024
CONTEXT_LENGTH = 8192


@dataclass(slots=True)
class EngineStats:
    connections: int = 0
    open_connections: int = 0
    handshakes: int = 0  # answered ok: true
    refused_handshakes: int = 0
    chats: int = 0
    streams: int = 0
    completed_streams: int = 0
    cancelled_streams: int = 0
    embeddings: int = 0
    listings: int = 0


class UpgradeRefusal(NamedTuple):
    status: int
    retry_after: str | None = None


class ReceivedCall(NamedTuple):
    connection: int  # which connection (1 for the first) carried the call
    method: str
    params: Any


class EchoEngine:
    def __init__(
        self,
        name: str = "echo-engine",
        *,
        models: Iterable[str] = ("echo-1",),
        embedding_models: Iterable[str] = ("echo-embed",),
        protocol_version: int = 2,
        token: str | None = None,
        chunks: int = 4,
        reply: str | None = None,
        streaming: bool = True,
        usage_names: UsageNames = "openai",
    ) -> None:
        self.name = name
        self.models = list(models)
        self.embedding_models = list(embedding_models)
        self.protocol_version = protocol_version
        self.token = token
        self.chunks = chunks
        self.reply = reply
        """None echoes the last user message."""
        self.streaming = streaming
        self.usage_names: UsageNames = usage_names
        self.modalities = ["text"]
        self.chunk_delay = 0.0
        self.chat_delay = 0.0
        """Seconds before ``Engine.Chat`` answers (a slow engine)."""
        self.upgrade_refusal: UpgradeRefusal | None = None
        """When set, WebSocket upgrades are answered with this HTTP status (a throttled
        engine's 429 and its ``Retry-After``) instead of 101."""
        self.stats = EngineStats()
        self.received: deque[ReceivedCall] = deque(maxlen=MAX_RECEIVED)
        self.handshakes: deque[Any] = deque(maxlen=MAX_RECEIVED)
        """The params of every handshake received (the newest ones)."""
        self.cancelled: set[str] = set()
        self.responses: deque[Any] = deque(maxlen=MAX_RECEIVED)
        """Responses received from the client (to calls made with ``broadcast``)."""
        self._connections: set[ServerConnection] = set()
        self._server: Server | None = None
        self.url = ""

    # -- running ---------------------------------------------------------------------

    async def start(
        self, host: str = "127.0.0.1", port: int = 0, sock: socket.socket | None = None
    ) -> str:
        """Listen on ``host``/``port``, or on ``sock`` when given (already bound)."""
        where = (None, None) if sock is not None else (host, port)
        self._server = await serve(
            self._handle,
            *where,
            sock=sock,
            max_size=MAX_FRAME_BYTES,
            compression=None,
            process_request=self._refuse_upgrade,
        )
        bound = self._server.sockets[0].getsockname()
        shown = f"[{bound[0]}]" if ":" in bound[0] else bound[0]
        self.url = f"ws://{shown}:{bound[1]}"
        return self.url

    async def stop(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.close()
            await server.wait_closed()

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()

    async def broadcast(self, text: str) -> None:
        """Send ``text`` as-is on every open connection (malformed frames, say)."""
        for ws in list(self._connections):
            with contextlib.suppress(ConnectionClosed):
                await ws.send(text)

    async def drop_connections(self) -> None:
        """Close every open connection (a restarting engine): clients must dial again."""
        for ws in list(self._connections):
            await ws.close(1012, "restarting")

    def calls(self, method: str) -> list[ReceivedCall]:
        return [call for call in self.received if call.method == method]

    # -- hooks for the misbehaving variant ---------------------------------------------

    def handshake_refusal(self, params: Any) -> str | None:
        """Why the handshake is refused, or None to accept it."""
        token = params.get("token") if isinstance(params, dict) else None
        if self.token is not None and token != self.token:
            return "invalid token"
        return None

    async def intercept(self, ws: ServerConnection, frame: dict[str, Any]) -> bool:
        """True when the frame was dealt with (answered otherwise, or swallowed)."""
        return False

    async def before_chunk(self, ws: ServerConnection, stream_id: str, index: int) -> bool:
        """Called before chunk ``index`` of a stream; False stops the stream."""
        return True

    # -- the connection ----------------------------------------------------------------

    def _refuse_upgrade(self, connection: ServerConnection, request: Request) -> Response | None:
        refusal = self.upgrade_refusal
        if refusal is None:
            return None
        response = connection.respond(HTTPStatus(refusal.status), "upgrade refused\n")
        if refusal.retry_after is not None:
            response.headers["Retry-After"] = refusal.retry_after
        return response

    async def _handle(self, ws: ServerConnection) -> None:
        self.stats.connections += 1
        self.stats.open_connections += 1
        number = self.stats.connections
        self._connections.add(ws)
        tasks: set[asyncio.Task[None]] = set()
        try:
            if not await self._handshake(ws):
                return
            async for message in ws:
                frame = decode_frame(message)
                if frame is None:
                    await send_json(
                        ws, rpc(id=None, error={"code": -32700, "message": "parse error"})
                    )
                    continue
                method = frame.get("method")
                if not isinstance(method, str):
                    self.responses.append(frame)
                    continue
                self.received.append(ReceivedCall(number, method, frame.get("params")))
                if await self.intercept(ws, frame):
                    continue
                task = asyncio.create_task(self._answer(ws, frame))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
        except ConnectionClosed:
            pass
        finally:
            self._connections.discard(ws)
            for task in tasks:
                task.cancel()
            self.stats.open_connections -= 1

    async def _handshake(self, ws: ServerConnection) -> bool:
        frame = decode_frame(await ws.recv())
        if frame is None or frame.get("method") != "Engine.Handshake":
            await ws.close(1002, "expected Engine.Handshake first")
            return False
        params = frame.get("params")
        self.handshakes.append(params)
        if await self.intercept(ws, frame):
            return True  # answered (or not) by the misbehaving variant
        refusal = self.handshake_refusal(params)
        if refusal is not None:
            self.stats.refused_handshakes += 1
            await send_json(ws, rpc(id=frame.get("id"), result={"ok": False, "error": refusal}))
            await ws.close(1008, refusal)
            return False
        self.stats.handshakes += 1
        capabilities = {
            "streaming": self.streaming,
            "embeddings": bool(self.embedding_models),
            "max_context_length": CONTEXT_LENGTH,
            "methods": ["Engine.Chat", "Engine.Embeddings", "Engine.Models"]
            + (["Engine.ChatStart", "Engine.ChatCancel"] if self.streaming else []),
            "modalities": list(self.modalities),
        }
        result = {"ok": True, "protocol_version": self.protocol_version}
        await send_json(
            ws, rpc(id=frame.get("id"), result={**result, "capabilities": capabilities})
        )
        return True

    async def _answer(self, ws: ServerConnection, frame: dict[str, Any]) -> None:
        method, request_id, params = frame.get("method"), frame.get("id"), frame.get("params")
        try:
            if method == "Engine.ChatCancel":
                if isinstance(params, dict) and isinstance(params.get("stream_id"), str):
                    if len(self.cancelled) >= MAX_RECEIVED:  # a long demo run stays bounded
                        self.cancelled.clear()
                    self.cancelled.add(params["stream_id"])
                return
            if method == "Engine.Models":
                self.stats.listings += 1
                result: Any = {"models": self._listing()}
            elif method == "Engine.Chat":
                self.stats.chats += 1
                if self.chat_delay > 0:
                    await asyncio.sleep(self.chat_delay)
                result = self._chat(params)
            elif method == "Engine.ChatStart" and self.streaming:
                with contextlib.suppress(ConnectionClosed):
                    await self._stream(ws, request_id, params)
                return
            elif method == "Engine.Embeddings":
                self.stats.embeddings += 1
                result = self._embed(params)
            else:
                raise RpcFailure(-32601, f"method not found: {method}")
            reply = rpc(id=request_id, result=result)
        except RpcFailure as failure:
            reply = rpc(id=request_id, error=failure.error)
        if request_id is not None:
            with contextlib.suppress(ConnectionClosed):  # the client left: nobody to answer
                await send_json(ws, reply)

    def _listing(self) -> list[dict[str, Any]]:
        chat = [
            {"id": m, "context_length": CONTEXT_LENGTH, "embedding": False} for m in self.models
        ]
        return chat + [{"id": m, "embedding": True} for m in self.embedding_models]

    def _chat(self, params: Any) -> dict[str, Any]:
        model, prompt, reply = self._check_chat(params)
        usage = usage_field(self.usage_names, count_tokens(prompt), count_tokens(reply))
        return {"model": model, "content": content_of(reply, self.protocol_version), **usage}

    async def _stream(self, ws: ServerConnection, request_id: Any, params: Any) -> None:
        _, prompt, reply = self._check_chat(params)
        stream_id = params.get("stream_id")
        if not isinstance(stream_id, str) or not stream_id:
            raise RpcFailure(-32602, "stream_id is required")
        self.stats.streams += 1
        await send_json(ws, rpc(id=request_id, result={"ok": True, "stream_id": stream_id}))
        # Never more pieces than characters: an echo must not repeat the text.
        pieces = split_pieces(reply, min(self.chunks, len(reply))) or [reply]
        for index, piece in enumerate(pieces):
            if stream_id in self.cancelled:
                self.stats.cancelled_streams += 1
                return
            if not await self.before_chunk(ws, stream_id, index):
                return
            last = index == len(pieces) - 1
            chunk: dict[str, Any] = {"stream_id": stream_id, "token": piece, "is_complete": last}
            if last:
                chunk.update(
                    usage_field(self.usage_names, count_tokens(prompt), count_tokens(reply))
                )
            await send_json(ws, rpc(method="Engine.ChatChunk", params=chunk))
            if self.chunk_delay > 0 and not last:
                await asyncio.sleep(self.chunk_delay)
        self.stats.completed_streams += 1

    def _check_chat(self, params: Any) -> tuple[str, str, str]:
        """The model, the prompt's text and the reply, or -32602 for bad params."""
        if not isinstance(params, dict):
            raise RpcFailure(-32602, "params must be an object")
        model = params.get("model")
        if model not in self.models:
            raise RpcFailure(-32602, f"unknown model: {model}")
        messages = params.get("messages")
        if not isinstance(messages, list) or not messages:
            raise RpcFailure(-32602, "messages must be a non-empty array")
        texts = [
            (str(m.get("role")), message_text(m.get("content"), self.protocol_version))
            for m in messages
            if isinstance(m, dict)
        ]
        users = [text for role, text in texts if role == "user"]
        reply = self.reply if self.reply is not None else (users[-1] if users else "")
        return str(model), "\n".join(text for _, text in texts), reply

    def _embed(self, params: Any) -> dict[str, Any]:
        model = params.get("model") if isinstance(params, dict) else None
        if model not in self.embedding_models:
            raise RpcFailure(-32602, f"unknown embedding model: {model}")
        inputs = embedding_inputs(params.get("input"))
        usage = usage_field(self.usage_names, sum(count_tokens(t) for t in inputs), 0)
        return {"model": model, "embeddings": [fake_vector(t) for t in inputs], **usage}


# -- standalone ------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="engine-echo", description=__doc__.split("\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port")
    parser.add_argument("--models", type=_names, default=["echo-1"], help="comma-separated")
    parser.add_argument("--embedding-models", type=_names, default=["echo-embed"])
    parser.add_argument("--token", default=None, help="require this handshake token")
    parser.add_argument("--protocol-version", type=int, choices=(1, 2), default=2)
    parser.add_argument("--reply", default=None, help="a canned reply (default: echo)")
    parser.add_argument("--chunks", type=int, default=4, help="chunks per stream")
    return parser.parse_args(argv)


def _names(value: str) -> list[str]:
    return [name.strip() for name in value.split(",") if name.strip()]


async def run(args: argparse.Namespace) -> None:
    engine = EchoEngine(
        models=args.models,
        embedding_models=args.embedding_models,
        protocol_version=args.protocol_version,
        token=args.token,
        chunks=args.chunks,
        reply=args.reply,
    )
    url = await engine.start(args.host, args.port)
    try:
        print(f"engine-echo listening on {url}", flush=True)
        await wait_for_stop_signal()
    finally:
        await engine.stop()


def main(argv: list[str] | None = None) -> None:
    run_in_foreground(run(parse_args(argv)))


if __name__ == "__main__":
    main()
