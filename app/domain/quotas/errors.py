"""The errors the quota gate raises (re-exported by ``app.domain.quotas.gate``)."""

from __future__ import annotations

from typing import Literal

from app.lib.errors import RateLimitedError, ServiceUnavailableError

WindowName = Literal["minute", "day", "month"]


class QuotaExceededError(RateLimitedError):
    """429 with ``Retry-After``: a window of the project's quota is full.

    ``code`` is ``rate_limit_exceeded`` for the minute window, ``quota_exceeded`` for
    the day and month windows; ``window`` and ``limit`` say which one refused.
    """

    default_code = "quota_exceeded"

    def __init__(self, message: str, *, window: WindowName, limit: int, retry_after: float) -> None:
        code = "rate_limit_exceeded" if window == "minute" else "quota_exceeded"
        super().__init__(message, retry_after=retry_after, code=code)
        self.window: WindowName = window
        self.limit = limit


class QuotaUnavailableError(ServiceUnavailableError):
    """503 ``quota_unavailable`` with ``Retry-After``: the quota cannot be checked."""

    default_code = "quota_unavailable"
