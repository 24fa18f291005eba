"""Checks on a video generation request, shared by REST and JSON-RPC.

Every refusal is a 400 ``invalid_request`` naming the offending field in ``param``
(``images[0].data_base64``, ``duration_seconds``, ...), like the rest of the API.
"""

from __future__ import annotations

import base64
import binascii
import math
import re
from dataclasses import dataclass, field
from typing import Any

import msgspec

from app.domain.video.schemas import ImageIn, VideoJobRequest
from app.lib.errors import BadRequestError

MAX_MODEL_CHARS = 200
MAX_PROMPT_CHARS = 4000
MAX_PROVIDER_CHARS = 100
MAX_IMAGES = 1
MAX_IMAGE_BYTES = 10 * 1024 * 1024
MAX_EXTRA_BYTES = 64 * 1024
DEFAULT_DURATION_SECONDS = 6.0
MIN_DURATION_SECONDS, MAX_DURATION_SECONDS = 1.0, 60.0
MIN_SIDE, MAX_SIDE = 64, 4096
# data:<type>[;param=value]*;base64,<data>
_DATA_URL = re.compile(r"data:([^;,]*)((?:;[^;,]*)*?);base64,(.*)", re.DOTALL)
_MIME = re.compile(r"image/[A-Za-z0-9][A-Za-z0-9.+-]{0,126}")


@dataclass(frozen=True, slots=True)
class ValidRequest:
    model: str
    prompt: str
    duration_seconds: float
    width: int | None
    height: int | None
    negative_prompt: str | None = None
    first_frame_image: str | None = None
    """Normalized to ``data:<mime>;base64,<data>``."""
    provider: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def _bad(message: str, param: str) -> BadRequestError:
    return BadRequestError(message, param=param)


def _text(value: str, param: str, limit: int) -> str:
    if not value.strip():
        raise _bad(f"`{param}` must not be empty", param)
    if len(value) > limit:
        raise _bad(f"`{param}` is longer than {limit} characters", param)
    return value


def _image(image: ImageIn | str, param: str) -> str:
    if isinstance(image, str):
        matched = _DATA_URL.fullmatch(image.strip())
        if matched is None:
            raise _bad(
                "an image must be a base64 data URL (data:image/png;base64,...) "
                "or an object with data_base64 and mime_type",
                param,
            )
        mime, data, mime_param, data_param = matched.group(1), matched.group(3), param, param
    else:
        mime, data = image.mime_type, image.data_base64
        mime_param, data_param = f"{param}.mime_type", f"{param}.data_base64"
    mime = mime.strip().lower()
    if not _MIME.fullmatch(mime):
        raise _bad(f"the image type must be image/*, got {mime[:100]!r}", mime_param)
    data = data.strip()
    # Refused before decoding: a huge body must not cost a huge decode.
    if len(data) > (MAX_IMAGE_BYTES + 2) // 3 * 4:
        raise _bad(f"the image is larger than {MAX_IMAGE_BYTES // (1024 * 1024)} MiB", data_param)
    try:
        decoded = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise _bad("the image data is not valid base64", data_param) from None
    if not decoded:
        raise _bad("the image data is empty", data_param)
    if len(decoded) > MAX_IMAGE_BYTES:
        raise _bad(f"the image is larger than {MAX_IMAGE_BYTES // (1024 * 1024)} MiB", data_param)
    return f"data:{mime};base64,{data}"


def _side(value: int | None, param: str) -> int | None:
    if value is not None and not MIN_SIDE <= value <= MAX_SIDE:
        raise _bad(f"`{param}` must be between {MIN_SIDE} and {MAX_SIDE}", param)
    return value


def _duration(value: float | None) -> float:
    if value is None:
        return DEFAULT_DURATION_SECONDS
    if not math.isfinite(value) or not MIN_DURATION_SECONDS <= value <= MAX_DURATION_SECONDS:
        raise _bad(
            f"`duration_seconds` must be between {MIN_DURATION_SECONDS:g} and "
            f"{MAX_DURATION_SECONDS:g}",
            "duration_seconds",
        )
    return float(value)


def validate(request: VideoJobRequest) -> ValidRequest:
    model = _text(request.model, "model", MAX_MODEL_CHARS).strip()
    prompt = _text(request.prompt, "prompt", MAX_PROMPT_CHARS)
    negative = request.negative_prompt
    if negative is not None:
        if len(negative) > MAX_PROMPT_CHARS:
            raise _bad(
                f"`negative_prompt` is longer than {MAX_PROMPT_CHARS} characters",
                "negative_prompt",
            )
        negative = negative if negative.strip() else None
    # One image is the first frame; refusing more beats silently dropping them.
    if len(request.images) > MAX_IMAGES:
        raise _bad(f"at most {MAX_IMAGES} image (the first frame) is supported", "images")
    first_frame = _image(request.images[0], "images[0]") if request.images else None
    provider = request.provider
    if provider is not None:
        provider = _text(provider, "provider", MAX_PROVIDER_CHARS).strip()
    if len(msgspec.json.encode(request.extra)) > MAX_EXTRA_BYTES:
        raise _bad(f"`extra` is larger than {MAX_EXTRA_BYTES // 1024} KiB", "extra")
    return ValidRequest(
        model=model,
        prompt=prompt,
        duration_seconds=_duration(request.duration_seconds),
        width=_side(request.width, "width"),
        height=_side(request.height, "height"),
        negative_prompt=negative,
        first_frame_image=first_frame,
        provider=provider,
        extra=dict(request.extra),
    )
