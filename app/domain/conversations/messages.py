"""Message rules shared by the conversations API and the runtime chat.

A message is stored as OpenAI has it (role, content, name, tool calls) and replayed
upstream in OpenAI's shape (snake_case ``tool_calls`` / ``tool_call_id``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from app.db.models import ConversationMessage
from app.domain.conversations.schemas import MessageIn
from app.lib.errors import BadRequestError

ROLES = ("system", "user", "assistant", "tool")
MAX_NAME = 200
MAX_TOOL_CALL_ID = 200

# Field names as each surface spells them, for the ``param`` of an error.
CAMEL = {"tool_calls": "toolCalls", "tool_call_id": "toolCallId"}


@dataclass(frozen=True, slots=True)
class NewMessage:
    """A validated message ready to store (build it with ``validate_messages`` or
    ``messages_from_openai``; the conversation service trusts it)."""

    role: str
    content: str | list[Any] | None
    name: str | None = None
    tool_calls: list[Any] | None = None
    tool_call_id: str | None = None


def validate_messages(items: Sequence[MessageIn], param: str = "messages") -> list[NewMessage]:
    """Check API messages (camelCase); a 400 names the first offending field."""
    return [
        _checked(
            f"{param}[{i}]",
            CAMEL,
            role=m.role,
            content=m.content,
            name=m.name,
            tool_calls=m.tool_calls,
            tool_call_id=m.tool_call_id,
        )
        for i, m in enumerate(items)
    ]


def messages_from_openai(
    items: Sequence[Mapping[str, Any]], param: str = "messages"
) -> list[NewMessage]:
    """Check OpenAI-shaped message dicts (snake_case keys); unknown keys are refused."""
    checked: list[NewMessage] = []
    known = {"role", "content", "name", "tool_calls", "tool_call_id"}
    for i, item in enumerate(items):
        where = f"{param}[{i}]"
        if not isinstance(item, Mapping):
            raise _bad(f"{where} must be an object", "invalid_message", where)
        unknown = sorted(set(item) - known)
        if unknown:
            raise _bad(f"{where} has an unknown field {unknown[0]!r}", "invalid_message", where)
        role = item.get("role")
        if not isinstance(role, str):
            raise _bad(f"{where}.role is required", "invalid_role", f"{where}.role")
        name = item.get("name")
        tool_call_id = item.get("tool_call_id")
        for key, value, limit in (
            ("name", name, MAX_NAME),
            ("tool_call_id", tool_call_id, MAX_TOOL_CALL_ID),
        ):
            if value is not None and not (isinstance(value, str) and 0 < len(value) <= limit):
                raise _bad(
                    f"{where}.{key} must be a string of 1 to {limit} characters",
                    "invalid_message",
                    f"{where}.{key}",
                )
        content = item.get("content")
        if content is not None and not isinstance(content, str | list):
            raise _bad(
                f"{where}.content must be a string, a list of content parts or null",
                "invalid_content",
                f"{where}.content",
            )
        tool_calls = item.get("tool_calls")
        if tool_calls is not None and not isinstance(tool_calls, list):
            raise _bad(
                f"{where}.tool_calls must be a list", "invalid_tool_calls", f"{where}.tool_calls"
            )
        checked.append(
            _checked(
                where,
                {},
                role=role,
                content=content,
                name=name,
                tool_calls=tool_calls,
                tool_call_id=tool_call_id,
            )
        )
    return checked


def _checked(
    where: str,
    names: Mapping[str, str],
    *,
    role: str,
    content: str | list[Any] | None,
    name: str | None,
    tool_calls: list[Any] | None,
    tool_call_id: str | None,
) -> NewMessage:
    def field(key: str) -> str:
        return f"{where}.{names.get(key, key)}"

    if role not in ROLES:
        raise _bad(
            f"{field('role')} must be one of {', '.join(ROLES)} (got {role!r})",
            "invalid_role",
            field("role"),
        )
    if tool_calls is not None:
        if role != "assistant":
            raise _bad(
                f"{field('tool_calls')} is only allowed on assistant messages",
                "invalid_tool_calls",
                field("tool_calls"),
            )
        _check_tool_calls(tool_calls, field("tool_calls"))
    if tool_call_id is not None and role != "tool":
        raise _bad(
            f"{field('tool_call_id')} is only allowed on tool messages",
            "invalid_tool_call_id",
            field("tool_call_id"),
        )
    if role == "tool" and tool_call_id is None:
        raise _bad(
            f"{field('tool_call_id')} is required on tool messages (the call it answers)",
            "missing_tool_call_id",
            field("tool_call_id"),
        )
    if content is None:
        if not (role == "assistant" and tool_calls):
            raise _bad(
                f"{field('content')} is required (only an assistant message with tool calls "
                "may omit it)",
                "missing_content",
                field("content"),
            )
    elif isinstance(content, list):
        _check_parts(content, field("content"))
    return NewMessage(
        role=role,
        content=content,
        name=name,
        tool_calls=tool_calls or None,
        tool_call_id=tool_call_id,
    )


def _check_parts(parts: list[Any], where: str) -> None:
    if not parts:
        raise _bad(f"{where} must not be an empty list", "invalid_content", where)
    for i, part in enumerate(parts):
        at = f"{where}[{i}]"
        if not isinstance(part, dict) or not isinstance(part.get("type"), str):
            raise _bad(f"{at} must be an object with a string `type`", "invalid_content", at)
        kind = part["type"]
        if kind == "text" and not isinstance(part.get("text"), str):
            raise _bad(f"{at}.text must be a string", "invalid_content", f"{at}.text")
        if kind == "image_url":
            image = part.get("image_url")
            url = image.get("url") if isinstance(image, dict) else None
            if not isinstance(url, str) or not url:
                raise _bad(
                    f"{at}.image_url.url must be a non-empty string",
                    "invalid_content",
                    f"{at}.image_url",
                )


def _check_tool_calls(calls: list[Any], where: str) -> None:
    if not calls:
        raise _bad(f"{where} must not be an empty list", "invalid_tool_calls", where)
    for i, call in enumerate(calls):
        at = f"{where}[{i}]"
        function = call.get("function") if isinstance(call, dict) else None
        valid = (
            isinstance(call, dict)
            and isinstance(call.get("id"), str)
            and bool(call["id"])
            and call.get("type", "function") == "function"
            and isinstance(function, dict)
            and isinstance(function.get("name"), str)
            and bool(function["name"])
            and isinstance(function.get("arguments"), str)
        )
        if not valid:
            raise _bad(
                f"{at} must be {{'id': str, 'type': 'function', "
                "'function': {'name': str, 'arguments': str}}",
                "invalid_tool_calls",
                at,
            )


def _bad(message: str, code: str, param: str) -> BadRequestError:
    return BadRequestError(message, code=code, param=param)


def stored_message(
    conversation_id: Any, seq: int, message: NewMessage | ConversationMessage, **extra: Any
) -> ConversationMessage:
    """``message`` as row ``seq`` of the conversation (a new turn, or a stored one
    copied into a fork)."""
    return ConversationMessage(
        conversation_id=conversation_id,
        seq=seq,
        role=message.role,
        content=message.content,
        name=message.name,
        tool_calls=message.tool_calls,
        tool_call_id=message.tool_call_id,
        **extra,
    )
