"""What an upstream failure tells the client: its status, whether to retry, when."""

from __future__ import annotations

import pytest

from app.routing.errors import (
    NoHealthyBackendError,
    StreamInterruptedError,
    UpstreamError,
    valid_retry_after,
)


@pytest.mark.parametrize(
    ("status", "should_retry"),
    [
        (400, "false"),
        (401, "false"),
        (403, "false"),
        (404, "false"),
        (413, "false"),
        (422, "false"),
        (408, None),
        (409, None),
        (429, None),
        (500, None),
        (503, None),
        (307, None),
    ],
)
def test_a_failed_answer_is_a_502_carrying_the_upstream_status(
    status: int, should_retry: str | None
) -> None:
    error = UpstreamError.from_status(status, "detail")
    body = error.body()["error"]
    assert error.status_code == 502
    assert (body["code"], body["type"], body["param"]) == ("bad_gateway", "api_error", None)
    assert body["upstream_status"] == status
    # Only a client error the SDKs would retry in vain says not to; nothing says "do".
    assert error.headers.get("x-should-retry") == should_retry
    assert "Retry-After" not in error.headers


def test_a_stream_cut_after_it_began_carries_the_status_it_began_with() -> None:
    error = StreamInterruptedError("the upstream closed the stream before it ended", status=200)
    assert error.body()["error"]["upstream_status"] == 200
    assert error.headers == {}
    assert not error.retryable
    # Without an answer there is no status to carry, and no header.
    for unanswered in (UpstreamError.transport("connection refused"), StreamInterruptedError("x")):
        assert "upstream_status" not in unanswered.body()["error"]
        assert unanswered.headers == {}


@pytest.mark.parametrize(
    ("value", "forwarded"),
    [
        ("7", "7"),
        (" 30 ", "30"),
        ("Wed, 21 Oct 2015 07:28:00 GMT", "Wed, 21 Oct 2015 07:28:00 GMT"),
        ("soon", None),
        ("-1", None),
        ("1.5", None),
        ("9" * 100, None),
        ("", None),
        (None, None),
        ("\u0663", None),  # a digit, but not an ASCII one
    ],
)
def test_a_429s_retry_after_is_forwarded_when_well_formed(
    value: str | None, forwarded: str | None
) -> None:
    assert valid_retry_after(value) == forwarded
    error = UpstreamError.from_status(429, "slow down", retry_after=value)
    assert error.headers.get("Retry-After") == forwarded
    assert error.body()["error"]["upstream_status"] == 429
    assert "x-should-retry" not in error.headers


@pytest.mark.parametrize("status", [400, 408, 500, 503])
def test_only_a_429s_retry_after_is_forwarded(status: int) -> None:
    error = UpstreamError.from_status(status, "busy", retry_after="5")
    assert "Retry-After" not in error.headers


def test_all_backends_down_says_they_are_unhealthy() -> None:
    error = NoHealthyBackendError("m", "a: connection refused")
    assert error.message == "all backends for model 'm' are unhealthy (a: connection refused)"
    assert error.status_code == 500
