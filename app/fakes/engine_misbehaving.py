"""A CEP engine that misbehaves on demand, for the failure-path tests.

``MisbehavingEngine`` is an ``EchoEngine`` with a ``mode`` switch that tests flip at
run time (it applies to what arrives after the switch):

- ``BAD_HANDSHAKE``: handshakes are answered ``ok: false`` with ``handshake_error``.
- ``DROP_MID_STREAM``: a stream sends ``drop_after`` chunks, then the socket is cut.
- ``NOT_JSON`` / ``NOT_JSONRPC``: a request is answered with a text frame that is not
  JSON, or JSON that is not JSON-RPC.
- ``STRAY_CHUNKS``: every real chunk is preceded by chunks for stream ids nobody
  opened (one of them claiming to be complete).
- ``SILENT``: requests (the handshake included) are received and never answered.
- ``UNKNOWN_RESPONSE_ID``: a request is answered under an id that was never sent.
- ``RPC_ERROR``: requests are answered with the JSON-RPC error ``rpc_error``.
- ``REFUSE_STREAM``: ``Engine.ChatStart`` is answered ``ok: false`` with ``stream_error``.
"""

from __future__ import annotations

import uuid
from enum import StrEnum
from typing import Any

from websockets.asyncio.server import ServerConnection

from app.fakes.engine_echo import EchoEngine
from app.fakes.engine_wire import rpc, send_json

NOT_JSON_FRAME = "this is {not JSON"
NOT_JSONRPC_FRAME = '{"hello": "world"}'
UNKNOWN_ID = 987_654


class Misbehaviour(StrEnum):
    NONE = "none"
    BAD_HANDSHAKE = "bad-handshake"
    DROP_MID_STREAM = "drop-mid-stream"
    NOT_JSON = "not-json"
    NOT_JSONRPC = "not-jsonrpc"
    STRAY_CHUNKS = "stray-chunks"
    SILENT = "silent"
    UNKNOWN_RESPONSE_ID = "unknown-response-id"
    RPC_ERROR = "rpc-error"
    REFUSE_STREAM = "refuse-stream"


class MisbehavingEngine(EchoEngine):
    def __init__(self, name: str = "misbehaving-engine", **options: Any) -> None:
        super().__init__(name, **options)
        self.mode = Misbehaviour.NONE
        self.handshake_error = "engine under maintenance"
        self.drop_after = 2
        self.rpc_error: tuple[int, str] = (-32603, "engine exploded")
        self.stream_error = "too busy to stream"
        self.stray_ids: list[str] = []
        """Stream ids of the stray chunks sent, so tests can tell them from real ones."""
        self.dropped = 0

    def handshake_refusal(self, params: Any) -> str | None:
        if self.mode is Misbehaviour.BAD_HANDSHAKE:
            return self.handshake_error
        return super().handshake_refusal(params)

    async def intercept(self, ws: ServerConnection, frame: dict[str, Any]) -> bool:
        request_id = frame.get("id")
        if request_id is None:
            return False  # notifications (cancels) are honoured whatever the mode
        mode = self.mode
        if mode is Misbehaviour.SILENT:
            return True
        if mode is Misbehaviour.NOT_JSON:
            await ws.send(NOT_JSON_FRAME)
        elif mode is Misbehaviour.NOT_JSONRPC:
            await ws.send(NOT_JSONRPC_FRAME)
        elif mode is Misbehaviour.UNKNOWN_RESPONSE_ID and frame.get("method") != "Engine.Handshake":
            await send_json(ws, rpc(id=UNKNOWN_ID, result={}))
        elif mode is Misbehaviour.RPC_ERROR and frame.get("method") != "Engine.Handshake":
            code, message = self.rpc_error
            error = {"code": code, "message": message}
            await send_json(ws, rpc(id=request_id, error=error))
        elif mode is Misbehaviour.REFUSE_STREAM and frame.get("method") == "Engine.ChatStart":
            refusal = {"ok": False, "error": self.stream_error}
            await send_json(ws, rpc(id=request_id, result=refusal))
        else:
            return False
        return True

    async def before_chunk(self, ws: ServerConnection, stream_id: str, index: int) -> bool:
        if self.mode is Misbehaviour.DROP_MID_STREAM and index >= self.drop_after:
            if not ws.transport.is_closing():  # another stream of it may have cut it already
                self.dropped += 1
                ws.transport.abort()
            return False
        if self.mode is Misbehaviour.STRAY_CHUNKS:
            for complete in (False, True):
                stray = str(uuid.uuid4())
                self.stray_ids.append(stray)
                chunk = {"stream_id": stray, "token": "STRAY", "is_complete": complete}
                await send_json(ws, rpc(method="Engine.ChatChunk", params=chunk))
        return True
