"""Per-model video prices: the admin API's storage (the arithmetic is ``pricing.py``)."""

from __future__ import annotations

import re

from sqlalchemy import delete, func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncEngine, async_sessionmaker

from app.db.models import VideoPrice
from app.domain.video.pricing import ANY_RESOLUTION, DEFAULT_MODE
from app.domain.video.schemas import VideoPriceIn, VideoPriceOut
from app.lib.clock import utcnow
from app.lib.errors import BadRequestError, NotFoundError

MAX_MODEL_CHARS = 200
MAX_COEFFS = 50
_SIDE = re.compile(r"([1-9][0-9]{0,4})p?")


def price_not_found(model: str) -> NotFoundError:
    return NotFoundError(
        f"no video price for model {model[:200]}", code="video_price_not_found", param="model"
    )


def _coeff_key(key: str) -> str:
    """``"720"``, ``"720p"`` or ``"720P"`` -> ``"720"``; ``"*"`` stays."""
    key = key.strip().lower()
    if key == ANY_RESOLUTION:
        return key
    matched = _SIDE.fullmatch(key)
    if matched is None:
        raise BadRequestError(
            f'resolution coefficient keys are a short side in pixels ("720") or "*", '
            f"not {key[:50]!r}",
            param="resolutionCoeffs",
        )
    return matched.group(1)


def _coeffs(data: VideoPriceIn) -> dict[str, float]:
    if len(data.resolution_coeffs) > MAX_COEFFS:
        raise BadRequestError(
            f"at most {MAX_COEFFS} resolution coefficients", param="resolutionCoeffs"
        )
    return {_coeff_key(k): float(v) for k, v in data.resolution_coeffs.items()}


def price_out(row: VideoPrice) -> VideoPriceOut:
    return VideoPriceOut(
        model=row.model,
        mode=row.mode,
        base=float(row.base),
        price_per_second=float(row.price_per_second),
        resolution_coeffs=dict(row.resolution_coeffs or {}),
        price_per_frame=float(row.price_per_frame),
        fps=float(row.fps),
        currency=row.currency,
        created_at=row.created_at,
        updated_at=row.updated_at,
    )


class VideoPrices:
    def __init__(self, engine: AsyncEngine) -> None:
        self._sessions = async_sessionmaker(engine, expire_on_commit=False)

    async def put(self, model: str, data: VideoPriceIn) -> VideoPriceOut:
        """Create or replace the price of ``model`` (as the backend advertises it, or as
        clients request it: the served name is looked up first)."""
        model = model.strip()
        if not model or len(model) > MAX_MODEL_CHARS:
            raise BadRequestError(
                f"the model name must be 1-{MAX_MODEL_CHARS} characters", param="model"
            )
        coeffs = _coeffs(data)
        try:
            return await self._put(model, data, coeffs)
        except IntegrityError:
            # Created by a concurrent PUT between our read and our insert: now it is an
            # update.
            return await self._put(model, data, coeffs)

    async def _put(self, model: str, data: VideoPriceIn, coeffs: dict[str, float]) -> VideoPriceOut:
        now = utcnow()
        async with self._sessions() as session:
            row = (
                await session.execute(select(VideoPrice).where(VideoPrice.model == model))
            ).scalar_one_or_none()
            if row is None:
                row = VideoPrice(model=model, created_at=now)
                session.add(row)
            row.mode = data.mode or DEFAULT_MODE
            row.base = data.base
            row.price_per_second = data.price_per_second
            row.resolution_coeffs = coeffs
            row.price_per_frame = data.price_per_frame
            row.fps = data.fps
            row.currency = data.currency
            row.updated_at = now
            await session.commit()
        return price_out(row)

    async def get(self, model: str) -> VideoPriceOut:
        async with self._sessions() as session:
            row = (
                await session.execute(select(VideoPrice).where(VideoPrice.model == model))
            ).scalar_one_or_none()
        if row is None:
            raise price_not_found(model)
        return price_out(row)

    async def page(self, limit: int, offset: int) -> tuple[list[VideoPriceOut], int]:
        async with self._sessions() as session:
            rows = (
                await session.execute(
                    select(VideoPrice).order_by(VideoPrice.model).limit(limit).offset(offset)
                )
            ).scalars()
            out = [price_out(r) for r in rows]
            total = (
                await session.execute(select(func.count()).select_from(VideoPrice))
            ).scalar_one()
        return out, int(total)

    async def delete(self, model: str) -> None:
        async with self._sessions() as session:
            result = await session.execute(delete(VideoPrice).where(VideoPrice.model == model))
            await session.commit()
        if not getattr(result, "rowcount", 0):
            raise price_not_found(model)
