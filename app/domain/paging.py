"""The query parameters and the envelope of every paginated REST list, in one place.

``limit`` and ``offset`` are bounded alike everywhere (``app.lib.pagination`` holds the
numbers, which JSON-RPC uses too): a value out of range is a 400 naming the parameter,
documented in the OpenAPI schema, and never reaches the database.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Annotated, Any, TypeVar

import msgspec
from litestar.params import QueryParameter

from app.lib.pagination import MAX_LIMIT, MAX_OFFSET, Page

R = TypeVar("R")
T = TypeVar("T")

LimitQuery = Annotated[int, QueryParameter(name="limit", ge=1, le=MAX_LIMIT)]
OffsetQuery = Annotated[int, QueryParameter(name="offset", ge=0, le=MAX_OFFSET)]


def page_of(
    rows: Iterable[R], total: int, limit: int, offset: int, to_schema: Callable[[R], T]
) -> Page[T]:
    """The ``{"items", "total", "limit", "offset"}`` envelope of one page of rows."""
    return Page(items=[to_schema(row) for row in rows], total=total, limit=limit, offset=offset)


def by_attributes(schema: type[T]) -> Callable[[Any], T]:
    """A row mapper for a schema whose fields are all attributes of the row, by name."""

    def to_schema(row: Any) -> T:
        return msgspec.convert(row, schema, from_attributes=True)

    return to_schema
