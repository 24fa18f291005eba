"""The upstream request of a runtime chat: checked against the profile, built as the
raw OpenAI body the routing service relays."""

from __future__ import annotations

from typing import Any

import msgspec

from app.domain.runtime.schemas import RuntimeChatRequest
from app.lib.errors import BadRequestError
from app.routing.profiles import Profile
from app.routing.types import RawBody


def _raw(value: object) -> msgspec.Raw:
    return msgspec.Raw(msgspec.json.encode(value))


def check_capabilities(
    profile: Profile, request: RuntimeChatRequest, new_turns: list[dict[str, Any]]
) -> None:
    if request.tools and not profile.supports_tools:
        raise BadRequestError(
            f"profile {profile.id} does not support tools",
            code="tools_not_supported",
            param="tools",
        )
    if not profile.supports_images and any(_has_image(m) for m in new_turns):
        raise BadRequestError(
            f"profile {profile.id} does not accept images",
            code="images_not_supported",
            param="messages",
        )
    if request.max_tokens is not None and request.max_tokens > profile.max_output_tokens:
        raise BadRequestError(
            f"maxTokens is above the profile's limit of {profile.max_output_tokens}",
            code="max_tokens_too_large",
            param="maxTokens",
        )


def _has_image(message: dict[str, Any]) -> bool:
    content = message.get("content")
    return isinstance(content, list) and any(
        isinstance(part, dict) and part.get("type") == "image_url" for part in content
    )


def upstream_body(
    profile: Profile, request: RuntimeChatRequest, messages: list[dict[str, Any]]
) -> RawBody:
    body: RawBody = {"model": _raw(profile.base_model), "messages": _raw(messages)}
    if request.tools:
        body["tools"] = _raw(request.tools)
        if request.tool_choice is not None:
            body["tool_choice"] = _raw(request.tool_choice)
    if request.temperature is not None:
        body["temperature"] = _raw(request.temperature)
    if request.max_tokens is not None:
        body["max_tokens"] = _raw(request.max_tokens)
    return body


def estimate_body(request: RuntimeChatRequest, messages: list[dict[str, Any]]) -> RawBody:
    """What admission estimates a call by before its profile is known (a custom LLM:
    its limits come with the admission): the messages and the asked output."""
    body: RawBody = {"messages": _raw(messages)}
    if request.max_tokens is not None:
        body["max_tokens"] = _raw(request.max_tokens)
    return body
