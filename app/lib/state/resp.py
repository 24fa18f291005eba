"""RESP2, the Redis wire format: packing a command and reading one reply from a buffer.

Only what ``ScriptPipe`` needs, written for speed on small messages: a command is one
array of bulk strings; a reply is a simple string, an error (returned as a
``ResponseError``, not raised, so that a pipeline reads past it), an integer, a bulk
string (``None`` when null) or an array of those (``None`` when null).
"""

from __future__ import annotations

from collections.abc import Iterable

from redis.exceptions import NoScriptError, ResponseError

RespReply = bytes | int | None | ResponseError | list["RespReply"]


class Incomplete(Exception):
    """The buffer ends before the reply does: wait for more bytes."""


_INCOMPLETE = Incomplete()


def pack_command(args: Iterable[bytes | str | int]) -> bytes:
    """``args`` as one RESP array of bulk strings (``str`` UTF-8, ``int`` in decimal)."""
    parts: list[bytes] = []
    count = 0
    for arg in args:
        if isinstance(arg, str):
            data = arg.encode()
        elif isinstance(arg, bytes):
            data = arg
        elif isinstance(arg, int):
            data = b"%d" % arg
        else:
            raise TypeError(f"a Redis argument must be bytes, str or int, not {type(arg).__name__}")
        parts.append(b"$%d\r\n%b\r\n" % (len(data), data))
        count += 1
    return b"*%d\r\n%b" % (count, b"".join(parts))


def _error(message: bytes) -> ResponseError:
    text = message.decode(errors="replace")
    if text.startswith("NOSCRIPT"):
        return NoScriptError(text)
    return ResponseError(text)


def parse_reply(buffer: bytes, position: int) -> tuple[RespReply, int]:
    """The reply that starts at ``position`` and where the next one starts; raises
    ``Incomplete`` when ``buffer`` holds only part of it, ``ValueError`` when it is
    not RESP2."""
    end = buffer.find(b"\r\n", position)
    if end < 0:
        raise _INCOMPLETE
    kind = buffer[position]
    line = buffer[position + 1 : end]
    if kind == 0x3A:  # ':'
        return int(line), end + 2
    if kind == 0x24:  # '$'
        length = int(line)
        if length < 0:
            return None, end + 2
        start = end + 2
        stop = start + length
        if stop + 2 > len(buffer):
            raise _INCOMPLETE
        return buffer[start:stop], stop + 2
    if kind == 0x2A:  # '*'
        count = int(line)
        if count < 0:
            return None, end + 2
        items: list[RespReply] = []
        position = end + 2
        for _ in range(count):
            item, position = parse_reply(buffer, position)
            items.append(item)
        return items, position
    if kind == 0x2B:  # '+'
        return line, end + 2
    if kind == 0x2D:  # '-'
        return _error(line), end + 2
    raise ValueError(f"not a RESP2 reply type: {chr(kind)!r}")
