"""Bodies of the video generation API (``/v1``: snake_case, OpenAI-style objects).

The request structs carry types only; ranges and image data are checked by
``app.domain.video.validation`` so the REST API and JSON-RPC answer the same 400s.
"""

from __future__ import annotations

import datetime
from typing import Annotated, Any

import msgspec

from app.domain.bodies import Camel, Strict

OBJECT = "video.generation"


class ImageIn(msgspec.Struct, forbid_unknown_fields=True):
    data_base64: str
    mime_type: str


class VideoJobRequest(msgspec.Struct, forbid_unknown_fields=True):
    model: str
    """1-200 characters."""
    prompt: str
    """1-4000 characters, not only blanks."""
    negative_prompt: str | None = None
    images: list[ImageIn | str] = []
    """``str`` is a data URL. One image at most (the first frame): decodable base64,
    an ``image/*`` type, at most 10 MiB decoded."""
    duration_seconds: float | None = None
    """Default 6; 1..60."""
    width: int | None = None
    """64..4096."""
    height: int | None = None
    provider: str | None = None
    """A backend name or kind hint, as on ``/v1/chat/completions``."""
    extra: dict[str, Any] = {}
    """Passed through to the provider (``prompt_optimizer``, ``callback_url``, ...)."""


class VideoResult(msgspec.Struct):
    url: str


class VideoError(msgspec.Struct):
    message: str
    code: str | None = None


class VideoJobOut(msgspec.Struct):
    id: str
    """``vid_`` + the job's UUID in hex."""
    object: str
    """Always ``video.generation``."""
    model: str
    status: str
    """queued | running | done | failed | cancelled"""
    progress: int
    stream_id: str
    """The notification stream of this job (``/api/rpc/events?session=``)."""
    created_at: int
    """Unix seconds, like OpenAI objects."""
    updated_at: int
    result: VideoResult | None = None
    error: VideoError | None = None
    cost: float | None = None


class VideoJobList(msgspec.Struct):
    """OpenAI's list object plus the pagination the rest of the API returns."""

    data: list[VideoJobOut]
    total: int
    limit: int
    offset: int
    has_more: bool
    object: str = "list"


# ------------------------------------------------------------------ prices (admin API)

PriceModeName = Annotated[
    str, msgspec.Meta(pattern=r"^(per_call|per_second_resolution|per_frame)$")
]
Amount = Annotated[float, msgspec.Meta(ge=0, le=1_000_000_000)]
Coefficient = Annotated[float, msgspec.Meta(ge=0, le=1_000_000)]
Fps = Annotated[float, msgspec.Meta(gt=0, le=1000)]
Currency = Annotated[str, msgspec.Meta(min_length=1, max_length=16)]


class VideoPriceIn(Strict):
    """``PUT /api/admin/video-prices/{model}``: the whole price (absent fields take
    their defaults; ``mode`` defaults to ``per_second_resolution``)."""

    mode: PriceModeName | None = None
    base: Amount = 0.0
    price_per_second: Amount = 0.0
    resolution_coeffs: dict[str, Coefficient] = {}
    """Short side in pixels (``"720"``; ``"720p"`` is read as ``"720"``) or ``"*"``."""
    price_per_frame: Amount = 0.0
    fps: Fps = 24.0
    currency: Currency | None = None


class VideoPriceOut(Camel):
    model: str
    mode: str
    base: float
    price_per_second: float
    resolution_coeffs: dict[str, float]
    price_per_frame: float
    fps: float
    currency: str | None
    created_at: datetime.datetime
    updated_at: datetime.datetime
