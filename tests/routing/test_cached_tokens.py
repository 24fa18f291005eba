"""Cached prompt tokens as OpenAI-compatible upstreams report them
(``usage.prompt_tokens_details.cached_tokens``), bounded by the prompt."""

from __future__ import annotations

import msgspec

from app.routing.backends.transport import UsageFields
from app.routing.types import Usage


def usage_of(raw: bytes) -> Usage | None:
    return msgspec.json.decode(raw, type=UsageFields).to_usage()


def test_cached_tokens_are_read_from_the_prompt_details() -> None:
    usage = usage_of(
        b'{"prompt_tokens": 100, "completion_tokens": 5,'
        b' "prompt_tokens_details": {"cached_tokens": 64, "audio_tokens": 0}}'
    )
    assert usage == Usage(100, 5, cached_tokens=64)


def test_no_details_or_a_null_count_is_nothing_cached() -> None:
    assert usage_of(b'{"prompt_tokens": 3, "completion_tokens": 1}') == Usage(3, 1)
    assert usage_of(
        b'{"prompt_tokens": 3, "completion_tokens": 1, "prompt_tokens_details": null}'
    ) == Usage(3, 1)
    nulls = b'{"prompt_tokens": 3, "prompt_tokens_details": {"cached_tokens": null}}'
    assert usage_of(nulls) == Usage(3, 0)


def test_a_confused_upstream_never_caches_more_than_the_prompt() -> None:
    over = b'{"prompt_tokens": 10, "prompt_tokens_details": {"cached_tokens": 50}}'
    assert usage_of(over) == Usage(10, 0, cached_tokens=10)
    negative = b'{"prompt_tokens": 10, "prompt_tokens_details": {"cached_tokens": -4}}'
    assert usage_of(negative) == Usage(10, 0, cached_tokens=0)
