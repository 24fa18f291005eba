"""Routing failures, mapped to the API's error shape by the shared handlers."""

from __future__ import annotations

from email.utils import parsedate_to_datetime

from app.lib.errors import AronaError, BadRequestError, NotFoundError

MAX_UPSTREAM_DETAIL_BYTES = 4096
MAX_RETRY_AFTER_CHARS = 64
"""A forwarded ``Retry-After`` value longer than this is dropped (an HTTP date is 29)."""
SDK_RETRYABLE_4XX = frozenset({408, 409, 429})
"""The client errors the official SDKs retry; any other upstream 4xx tells them not to
(``x-should-retry: false``): the same request would fail the same way."""


class ModelNotFoundError(NotFoundError):
    default_code = "model_not_found"

    def __init__(self, model: str, detail: str = "") -> None:
        suffix = f" ({detail})" if detail else ""
        super().__init__(f"model '{model}' not found{suffix}", param="model")
        self.model = model


class NotAVideoModelError(ModelNotFoundError, BadRequestError):
    """The model is advertised, but only by backends that do not generate video.

    A 400 ``not_a_video_model`` (the request names the wrong kind of model; nothing is
    missing). It is also a ``ModelNotFoundError`` so code that treats "no video backend
    for this model" as one case still catches it; its status and code are its own.
    """

    status_code = 400
    default_code = "not_a_video_model"

    def __init__(self, model: str) -> None:
        BadRequestError.__init__(
            self,
            f"Model {model} is not a video model: its backends serve chat or embeddings",
            param="model",
        )
        self.model = model


class NoHealthyBackendError(AronaError):
    """The model is known but every backend serving it is unhealthy or tripped."""

    status_code = 500
    default_code = "backend_unavailable"

    def __init__(self, model: str, reasons: str = "") -> None:
        detail = f" ({reasons})" if reasons else ""
        super().__init__(f"all backends for model '{model}' are unhealthy{detail}")


class UnsupportedBackendTypeError(BadRequestError):
    pass


class UpstreamError(AronaError):
    """A reachable upstream answered non-2xx, or the transport failed.

    A 502 ``bad_gateway`` that keeps what a client needs: the upstream's HTTP status as
    ``upstream_status`` in the error body (absent when there was none: refused,
    timed out), ``x-should-retry: false`` for an upstream 4xx the SDKs would otherwise
    retry in vain, and an upstream 429's ``Retry-After``. The message names the
    situation in plain words; an exception's own text goes to the log, never here.
    """

    status_code = 502
    default_code = "bad_gateway"

    def __init__(
        self,
        message: str,
        *,
        status: int | None,
        retryable: bool,
        provider_code: int | None = None,
        retry_after: str | None = None,
    ) -> None:
        super().__init__(
            message,
            headers=_client_headers(status, retry_after),
            extra=None if status is None else {"upstream_status": status},
        )
        self.upstream_status = status
        self.retryable = retryable
        self.provider_code = provider_code
        """The provider's own error code where its protocol has one beside the HTTP
        status (MiniMax's ``base_resp.status_code``); None otherwise."""

    @classmethod
    def from_status(
        cls, status: int, detail: bytes | str, *, retry_after: str | None = None
    ) -> UpstreamError:
        """A non-2xx answer; ``retry_after`` is its ``Retry-After`` header, if any (only
        a 429's is forwarded)."""
        text = detail if isinstance(detail, str) else bounded_text(detail)
        # 4xx other than timeouts and throttling is the request's fault: another
        # backend would answer the same, so it is not retried and does not trip breakers.
        retryable = status >= 500 or status in (408, 429)
        return cls(
            f"upstream {status}: {text}",
            status=status,
            retryable=retryable,
            retry_after=retry_after,
        )

    @classmethod
    def transport(cls, reason: str) -> UpstreamError:
        return cls(f"upstream unreachable: {reason}", status=None, retryable=True)


class StreamInterruptedError(UpstreamError):
    """The upstream failed after the stream started (nothing can be retried).

    ``status`` is the HTTP status the upstream began its stream with (a 2xx), where
    the protocol has one, so the client's error still says the upstream answered.
    """

    def __init__(self, reason: str, *, status: int | None = None) -> None:
        super().__init__(f"upstream stream interrupted: {reason}", status=status, retryable=False)


def _client_headers(status: int | None, retry_after: str | None) -> dict[str, str]:
    """What Arona's 502 tells the client's SDK about retrying, from the upstream's status."""
    if status is None or not 400 <= status < 500:
        return {}
    if status not in SDK_RETRYABLE_4XX:
        return {"x-should-retry": "false"}
    forwarded = valid_retry_after(retry_after) if status == 429 else None
    return {"Retry-After": forwarded} if forwarded else {}


def valid_retry_after(value: str | None) -> str | None:
    """``value`` if it is a well-formed ``Retry-After`` (delay seconds or an HTTP date),
    else None: an upstream's header is forwarded only when it means something."""
    if value is None:
        return None
    value = value.strip()
    if not value or len(value) > MAX_RETRY_AFTER_CHARS or not value.isascii():
        return None
    if value.isdigit():
        return value
    try:
        parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    return value if value.isprintable() else None


def bounded_text(raw: bytes, limit: int = MAX_UPSTREAM_DETAIL_BYTES) -> str:
    """Decode at most ``limit`` bytes of an upstream error body for a message."""
    text = raw[:limit].decode("utf-8", errors="replace").strip()
    return text + ("…" if len(raw) > limit else "")
