"""The CEP wire as the fake engines speak it: JSON-RPC 2.0 frames, the failure a call
answers with, and message content and usage in each protocol version's shape."""

from __future__ import annotations

from typing import Any, Literal

import msgspec
from websockets.asyncio.server import ServerConnection

UsageNames = Literal["openai", "io", "none"]


class RpcFailure(Exception):
    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.error = {"code": code, "message": message}


def decode_frame(message: str | bytes) -> dict[str, Any] | None:
    """A JSON object frame, or None for anything else (not JSON, not an object)."""
    try:
        frame = msgspec.json.decode(message)
    except msgspec.DecodeError:
        return None
    return frame if isinstance(frame, dict) else None


def rpc(**fields: Any) -> dict[str, Any]:
    """A JSON-RPC 2.0 message: ``id``+``result``/``error``, or ``method``+``params``."""
    return {"jsonrpc": "2.0", **fields}


async def send_json(ws: ServerConnection, payload: Any) -> None:
    await ws.send(msgspec.json.encode(payload), text=True)


def message_text(content: Any, protocol_version: int) -> str:
    """A message's text: a string in v1, the text parts of a part list in v2; -32602
    for the other shape."""
    if protocol_version < 2:
        if not isinstance(content, str):
            raise RpcFailure(-32602, "protocol v1 expects message content as a string")
        return content
    if not isinstance(content, list) or not all(isinstance(p, dict) for p in content):
        raise RpcFailure(-32602, "protocol v2 expects message content as a list of parts")
    return "".join(str(p.get("data", "")) for p in content if p.get("mime") == "text/plain")


def content_of(text: str, protocol_version: int) -> Any:
    """``text`` as reply content: a string in v1, one text part in v2."""
    if protocol_version < 2:
        return text
    return [{"mime": "text/plain", "encoding": "utf-8", "data": text}]


def usage_field(names: UsageNames, prompt: int, completion: int) -> dict[str, Any]:
    """The ``usage`` field under the names ``names`` says (none: no field)."""
    if names == "none":
        return {}
    if names == "io":
        return {"usage": {"input_tokens": prompt, "output_tokens": completion}}
    return {"usage": {"prompt_tokens": prompt, "completion_tokens": completion}}
