"""Shared adapter plumbing: reasons for failed exchanges, the non-streaming deadline."""

from __future__ import annotations

import errno
import socket

import aiohttp
import pytest

from app.fakes import FakeOpenAI
from app.lib.http import UpstreamHttp, UpstreamLimits
from app.routing.backends.failures import describe_error
from app.routing.backends.transport import JSON_HEADERS, fetch
from app.routing.errors import UpstreamError
from tests.support.upstreams import Served, eventually


def _caused(exc: BaseException, cause: BaseException) -> BaseException:
    exc.__cause__ = cause
    return exc


@pytest.mark.parametrize(
    ("exc", "reason"),
    [
        (aiohttp.ConnectionTimeoutError("Connection timeout to host"), "connect timeout"),
        (aiohttp.SocketTimeoutError("Timeout on reading data from socket"), "read timeout"),
        (TimeoutError(), "read timeout"),
        (aiohttp.ClientOSError(errno.ECONNRESET, "Connection reset by peer"), "connection reset"),
        (
            aiohttp.ClientConnectionResetError("Cannot write to closing transport"),
            "connection reset",
        ),
        (_caused(aiohttp.ClientError("x"), ConnectionRefusedError()), "connection refused"),
        (
            _caused(aiohttp.ClientError("x"), socket.gaierror(-2, "unknown")),
            "name resolution failed",
        ),
        (aiohttp.ServerDisconnectedError(), "the upstream closed the connection"),
        (
            aiohttp.ClientPayloadError("Response payload is not completed: TransferEncodingError"),
            "the upstream closed the connection before its answer ended",
        ),
        (aiohttp.NonHttpUrlClientError("ftp://h/x"), "unsupported URL scheme"),
        (aiohttp.InvalidUrlClientError("http:///x"), "invalid URL"),
        (
            OSError(errno.ENETUNREACH, "Network is unreachable"),
            "network error: network is unreachable",
        ),
        (ValueError("odd"), "the exchange failed"),
        (aiohttp.ClientError(), "the exchange failed"),
    ],
)
def test_describe_error(exc: BaseException, reason: str) -> None:
    assert describe_error(exc) == reason


def test_describe_error_clips_long_reasons() -> None:
    reason = describe_error(OSError(errno.EIO, "x" * 1000))
    assert reason.startswith("network error: xxx")
    assert len(reason) == 201
    assert reason.endswith("…")


async def test_fetch_deadline_covers_the_whole_exchange(
    openai_upstream: Served[FakeOpenAI], http: UpstreamHttp
) -> None:
    fake = openai_upstream.fake
    fake.control.hang = True
    url = f"{openai_upstream.url}/v1/chat/completions"
    short = UpstreamHttp(limits=UpstreamLimits(deadline_seconds=0.2))
    try:
        with pytest.raises(UpstreamError) as caught:
            await fetch(short, url, b"{}", JSON_HEADERS)
    finally:
        await short.aclose()
    assert caught.value.message == "the upstream did not complete its answer within 0.2s"
    assert caught.value.retryable
    await eventually(lambda: fake.stats.disconnects == 1)  # the call was abandoned
