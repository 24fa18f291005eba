"""Amounts as exact integers: decimal text or JSON numbers to micro-units and back."""

from __future__ import annotations

from decimal import Decimal, InvalidOperation

from app.lib.errors import BadRequestError

MICROS = 1_000_000
MAX_MICROS = 10**15
"""A billion units per million tokens: past any real price, within a BIGINT."""


def micros(param: str, raw: str | int | float) -> int:
    """``raw`` (e.g. ``"0.15"``, ``2``, ``0.000001``) in micro-units; a negative,
    non-finite, too precise or absurd amount is a 400 naming ``param``."""
    if isinstance(raw, bool):
        raise _bad(param)
    try:
        # str() of a float is its shortest repr: 0.15 stays 0.15, not 0.1499999...
        value = Decimal(raw.strip() if isinstance(raw, str) else str(raw))
    except InvalidOperation:
        raise _bad(param) from None
    if not value.is_finite() or value < 0:
        raise _bad(param)
    scaled = value * MICROS
    if scaled != scaled.to_integral_value():
        raise BadRequestError(
            f"`{param}` has more than 6 decimals", code="invalid_amount", param=param
        )
    amount = int(scaled)
    if amount > MAX_MICROS:
        raise BadRequestError(f"`{param}` is too large", code="invalid_amount", param=param)
    return amount


def text(amount: int) -> str:
    """Micro-units as the shortest exact decimal text (``150000`` -> ``"0.15"``)."""
    whole, fraction = divmod(amount, MICROS)
    if not fraction:
        return str(whole)
    return f"{whole}.{fraction:06d}".rstrip("0")


def _bad(param: str) -> BadRequestError:
    return BadRequestError(
        f'`{param}` must be a non-negative decimal amount such as "0.15"',
        code="invalid_amount",
        param=param,
    )


def label(amount: int, currency: str | None, *, estimated: bool = False) -> str:
    """A summed cost for a page: ``"0.35 USD"``, ``"0.35 (mixed currencies)"``, with
    ``(estimated in part)`` when any of it was priced from estimated usage."""
    unit = currency or ("(mixed currencies)" if amount else "")
    out = f"{text(amount)} {unit}".rstrip()
    return f"{out} (estimated in part)" if estimated else out
