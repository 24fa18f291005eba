"""The errors the quota gate raises (re-exported by ``app.domain.quotas.gate``)."""

from __future__ import annotations

from typing import Literal

from app.lib.errors import RateLimitedError, ServiceUnavailableError

WindowName = Literal["minute", "day", "month"]
Metric = Literal["requests", "tokens", "cost"]


class QuotaExceededError(RateLimitedError):
    """429 with ``Retry-After``: a window of the project's (or its key's) limits is full.

    ``code`` says which kind: ``budget_exceeded`` for a money budget,
    ``token_limit_exceeded`` for a token limit, and for requests
    ``rate_limit_exceeded`` (the minute window) or ``quota_exceeded`` (day, month);
    ``window``, ``limit`` and ``metric`` say which window refused.
    """

    default_code = "quota_exceeded"

    def __init__(
        self,
        message: str,
        *,
        window: WindowName,
        limit: int,
        retry_after: float,
        metric: Metric = "requests",
    ) -> None:
        if metric == "cost":
            code = "budget_exceeded"
        elif metric == "tokens":
            code = "token_limit_exceeded"
        else:
            code = "rate_limit_exceeded" if window == "minute" else "quota_exceeded"
        super().__init__(message, retry_after=retry_after, code=code)
        self.window: WindowName = window
        self.limit = limit
        self.metric: Metric = metric


class QuotaUnavailableError(ServiceUnavailableError):
    """503 ``quota_unavailable`` with ``Retry-After``: the quota cannot be checked."""

    default_code = "quota_unavailable"
