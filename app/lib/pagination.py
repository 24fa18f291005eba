"""The list envelope every paginated endpoint returns."""

from __future__ import annotations

from typing import Generic, TypeVar

import msgspec

T = TypeVar("T")

DEFAULT_LIMIT = 50
MAX_LIMIT = 500


class Page(msgspec.Struct, Generic[T]):
    items: list[T]
    total: int
    limit: int
    offset: int
