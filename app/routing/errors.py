"""Routing failures, mapped to the API's error shape by the shared handlers."""

from __future__ import annotations

from app.lib.errors import AronaError, BadRequestError, NotFoundError

MAX_UPSTREAM_DETAIL_BYTES = 4096


class ModelNotFoundError(NotFoundError):
    default_code = "model_not_found"

    def __init__(self, model: str, detail: str = "") -> None:
        suffix = f" ({detail})" if detail else ""
        super().__init__(f"No backend available for model: {model}{suffix}", param="model")
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
        super().__init__(f"All backends for model {model} are unavailable{detail}")


class UnsupportedBackendTypeError(BadRequestError):
    pass


class UpstreamError(AronaError):
    """A reachable upstream answered non-2xx, or the transport failed."""

    status_code = 502
    default_code = "bad_gateway"

    def __init__(
        self,
        message: str,
        *,
        status: int | None,
        retryable: bool,
        provider_code: int | None = None,
    ) -> None:
        super().__init__(message)
        self.upstream_status = status
        self.retryable = retryable
        self.provider_code = provider_code
        """The provider's own error code where its protocol has one beside the HTTP
        status (MiniMax's ``base_resp.status_code``); None otherwise."""

    @classmethod
    def from_status(cls, status: int, detail: bytes | str) -> UpstreamError:
        text = detail if isinstance(detail, str) else bounded_text(detail)
        # 4xx other than timeouts and throttling is the request's fault: another
        # backend would answer the same, so it is not retried and does not trip breakers.
        retryable = status >= 500 or status in (408, 429)
        return cls(f"upstream {status}: {text}", status=status, retryable=retryable)

    @classmethod
    def transport(cls, reason: str) -> UpstreamError:
        return cls(f"upstream unreachable: {reason}", status=None, retryable=True)


class StreamInterruptedError(UpstreamError):
    """The upstream failed after the stream started (nothing can be retried)."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"upstream stream interrupted: {reason}", status=None, retryable=False)


def bounded_text(raw: bytes, limit: int = MAX_UPSTREAM_DETAIL_BYTES) -> str:
    """Decode at most ``limit`` bytes of an upstream error body for a message."""
    text = raw[:limit].decode("utf-8", errors="replace").strip()
    return text + ("…" if len(raw) > limit else "")
