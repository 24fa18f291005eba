"""The list envelope every paginated endpoint returns."""

from __future__ import annotations

from typing import Generic, TypeVar

import msgspec
from advanced_alchemy.filters import LimitOffset, OrderBy

T = TypeVar("T")

DEFAULT_LIMIT = 50
MAX_LIMIT = 500


class Page(msgspec.Struct, Generic[T]):
    items: list[T]
    total: int
    limit: int
    offset: int


def newest_first(limit: int, offset: int) -> tuple[OrderBy, OrderBy, LimitOffset]:
    """Filters for a stable newest-first page (the id breaks ties between equal times)."""
    return (
        OrderBy(field_name="created_at", sort_order="desc"),
        OrderBy(field_name="id", sort_order="desc"),
        LimitOffset(limit=limit, offset=offset),
    )
