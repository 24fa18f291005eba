"""Checks on input from outside, made before a parser recurses or a database sees it.

- **JSON nesting** is bounded (``MAX_JSON_DEPTH``): deeper documents get a 400
  ``json_too_deep``, never a ``RecursionError``. msgspec's decoder guards its own
  recursion (a few hundred levels, raising cleanly), and the decoded document is then
  measured level by level, without recursion, over its containers only (scalars are
  skipped at C speed). A scan of the raw bytes was measured first: finding the
  brackets outside strings cost 4-10x the whole decode, so the decoder, which reads
  every byte anyway, is the cheapest place to learn the structure.
- **Unstorable text**: PostgreSQL cannot store U+0000 in text, and no UTF-8 store can
  hold a lone surrogate (U+D800-U+DFFF). Such characters are refused with a 400 that
  names the field (``messages[1].content``, ``name``, the query parameter), never
  passed on to fail inside a database write.
- **Valid JSON** means a document a standard parser represents: valid UTF-8, numbers
  within range (no 5,000-digit integers, no ``1e400``), nesting within the bound.

Framework-free: the server and the raw ASGI surfaces call these; the errors are the
API's own (``BadRequestError``), so every surface answers in the error shape.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from itertools import compress
from typing import Any

import msgspec

from app.lib.errors import BadRequestError

MAX_JSON_DEPTH = 64
"""Deepest nesting of arrays and objects accepted in a JSON body. A chat request's own
structure is about 5 deep; a tool's JSON Schema rarely passes 15."""

_CONTAINERS = frozenset({list, dict})
_is_container = _CONTAINERS.__contains__
_SURROGATE = re.compile("[\ud800-\udfff]")


def _unstorable(text: str) -> bool:
    # NUL by memchr; a surrogate only in a string that is not ASCII (a flag check).
    return "\x00" in text or (not text.isascii() and _SURROGATE.search(text) is not None)


def nesting_depth(value: Any, limit: int = MAX_JSON_DEPTH) -> int:
    """How deep ``value`` (decoded JSON) nests lists and dicts, counted up to
    ``limit + 1`` (enough to tell "too deep").

    Iterative, and scalars are skipped at C speed (``map``/``compress``), so a large
    array of numbers costs a pass over its items and nothing per item in Python.
    """
    if not _is_container(type(value)):
        return 0
    level: list[Any] = [value]
    depth = 0
    while level and depth <= limit:
        depth += 1
        below: list[Any] = []
        for container in level:
            items = container.values() if type(container) is dict else container
            below.extend(compress(items, map(_is_container, map(type, items))))
        level = below
    return depth


def nested_too_deep(limit: int = MAX_JSON_DEPTH) -> BadRequestError:
    return BadRequestError(f"JSON body nested deeper than {limit} levels", code="json_too_deep")


def decode_json(raw: bytes) -> Any:
    """``raw`` decoded as a checked JSON document (depth, validity, storable text);
    raises ``BadRequestError`` (``json_too_deep``, ``invalid_json``,
    ``unsupported_character``)."""
    value = decode_json_document(raw)
    # U+0000 only arrives escaped in valid JSON (the decoder refuses raw control
    # characters and lone surrogates), so most bodies need no walk over their text.
    if b"\\u0000" in raw:
        check_storable(value)
    return value


def decode_json_document(raw: bytes) -> Any:
    """``raw`` decoded, refused if no standard parser would take it (invalid UTF-8,
    numbers out of range, nesting past the bound). Its text is not checked for
    storability: for a body relayed as bytes, or checked field by field later."""
    try:
        value = msgspec.json.decode(raw)
    except RecursionError:
        # The decoder's own guard (hundreds of levels down): far past ours.
        raise nested_too_deep() from None
    except msgspec.DecodeError as exc:
        message = f"request body is not valid JSON: {exc}"
        raise BadRequestError(message, code="invalid_json") from None
    if nesting_depth(value) > MAX_JSON_DEPTH:
        raise nested_too_deep()
    return value


def unstorable_path(value: Any, path: str = "") -> str | None:
    """The path (``messages[1].content``) of the first string in ``value`` (keys
    included) holding U+0000 or a lone surrogate; None when there is none."""
    stack: list[tuple[str, Any]] = [(path, value)]
    while stack:
        where, item = stack.pop()
        if isinstance(item, str):
            if _unstorable(item):
                return where or "body"
        elif isinstance(item, Mapping):
            for key, child in reversed(list(item.items())):
                name = f"{where}.{key}" if where else str(key)
                if isinstance(key, str) and _unstorable(key):
                    return where or "body"
                stack.append((name, child))
        elif isinstance(item, list | tuple):
            stack.extend((f"{where}[{i}]", child) for i, child in reversed(list(enumerate(item))))
    return None


def check_storable(value: Any, path: str = "") -> None:
    """Raise a 400 naming the field when ``value`` holds text no database can store."""
    where = unstorable_path(value, path)
    if where is not None:
        raise unstorable(where)


def check_text_fields(fields: Iterable[tuple[str, str]]) -> None:
    """The same for named strings (query or form parameters, path segments)."""
    for name, text in fields:
        if _unstorable(text):
            raise unstorable(name)


def unstorable(field: str) -> BadRequestError:
    return BadRequestError(
        f"`{field}` contains a NUL character or a lone surrogate, which cannot be stored",
        code="unsupported_character",
        param=field,
    )
