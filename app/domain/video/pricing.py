"""What a video generation costs: pure functions over a model's price.

Modes (``video_prices.mode``):

- ``per_call``: ``base``.
- ``per_second_resolution`` (the default when a price names no mode):
  ``base + duration x price_per_second x coeff``, where ``coeff`` is
  ``resolution_coeffs[str(short side)]`` (``"720"`` for 1280x720), else
  ``resolution_coeffs["*"]``, else 1 (a price without coefficients charges every
  resolution alike). The short side is the smaller of ``width``/``height``, the one
  given when only one is, and unknown (so ``*``, else 1) when neither is.
- ``per_frame``: ``base + frames x price_per_frame`` with ``frames = ceil(duration x
  fps)`` (a started frame is a frame); ``fps`` defaults to 24.

``duration`` is the duration the client asked for (default 6 s), not what a provider
may have snapped it to. A model without a price costs ``None`` (unpriced, not free).
Costs are rounded to 6 decimals, the precision they are stored with.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

PriceMode = Literal["per_call", "per_second_resolution", "per_frame"]
MODES: tuple[PriceMode, ...] = ("per_call", "per_second_resolution", "per_frame")
DEFAULT_MODE: PriceMode = "per_second_resolution"
DEFAULT_FPS = 24.0
ANY_RESOLUTION = "*"
DECIMALS = 6


@dataclass(frozen=True, slots=True)
class Price:
    mode: PriceMode = DEFAULT_MODE
    base: float = 0.0
    price_per_second: float = 0.0
    resolution_coeffs: Mapping[str, float] = field(default_factory=dict)
    price_per_frame: float = 0.0
    fps: float = DEFAULT_FPS


def short_side(width: int | None, height: int | None) -> int | None:
    sides = [side for side in (width, height) if side is not None]
    return min(sides) if sides else None


def resolution_coeff(coeffs: Mapping[str, float], width: int | None, height: int | None) -> float:
    side = short_side(width, height)
    if side is not None and str(side) in coeffs:
        return float(coeffs[str(side)])
    return float(coeffs.get(ANY_RESOLUTION, 1.0))


def frames(duration_seconds: float, fps: float) -> int:
    # The epsilon keeps 6 s x 24 fps at 144 frames despite float noise.
    return math.ceil(duration_seconds * fps - 1e-9)


def cost_of(
    price: Price | None, duration_seconds: float, width: int | None, height: int | None
) -> float | None:
    if price is None:
        return None
    if price.mode == "per_call":
        total = price.base
    elif price.mode == "per_frame":
        total = price.base + frames(duration_seconds, price.fps) * price.price_per_frame
    else:
        coeff = resolution_coeff(price.resolution_coeffs, width, height)
        total = price.base + duration_seconds * price.price_per_second * coeff
    return round(total, DECIMALS)
