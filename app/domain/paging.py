"""Pagination, in one place: the list envelope, the bounds of ``limit`` and ``offset``,
the REST query parameters (and the ``Paging`` a list handler is given), the
newest-first and ascending page filters, and the row mappers that fill the envelope.

``limit`` and ``offset`` are bounded alike everywhere (REST query parameters and
JSON-RPC params share the numbers): a value out of range is a 400 naming the parameter,
documented in the OpenAPI schema, and never reaches the database.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Annotated, Any, Generic, TypeVar

import msgspec
from advanced_alchemy.filters import LimitOffset, OrderBy
from litestar.params import QueryParameter

R = TypeVar("R")
T = TypeVar("T")
S = TypeVar("S", bound=msgspec.Struct)

DEFAULT_LIMIT = 50
MAX_LIMIT = 500
MAX_OFFSET = 1_000_000_000
"""Past any list anyone pages through, and within every database's integers (an
offset of 2**63 used to reach PostgreSQL and fail there)."""

Limit = Annotated[int, msgspec.Meta(ge=1, le=MAX_LIMIT)]
"""``limit`` of every paginated list (query parameter or JSON-RPC param)."""
Offset = Annotated[int, msgspec.Meta(ge=0, le=MAX_OFFSET)]
"""``offset`` of every paginated list."""

LimitQuery = Annotated[int, QueryParameter(name="limit", ge=1, le=MAX_LIMIT)]
OffsetQuery = Annotated[int, QueryParameter(name="offset", ge=0, le=MAX_OFFSET)]


class Page(msgspec.Struct, Generic[T]):
    """The list envelope every paginated endpoint returns."""

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


def ascending(field: str, limit: int, offset: int) -> tuple[OrderBy, LimitOffset]:
    """Filters for a page in ``field``'s order, for a unique ``field`` (a name or an id),
    which keeps the order stable."""
    return OrderBy(field_name=field, sort_order="asc"), LimitOffset(limit=limit, offset=offset)


def page_of(
    rows: Iterable[R], total: int, limit: int, offset: int, to_schema: Callable[[R], T]
) -> Page[T]:
    """The ``{"items", "total", "limit", "offset"}`` envelope of one page of rows."""
    return Page(items=[to_schema(row) for row in rows], total=total, limit=limit, offset=offset)


class Paging(msgspec.Struct, frozen=True):
    """The window one list request asks for: its ``limit`` and ``offset`` query
    parameters, bounded and validated where they are provided (``app.domain.rest``)."""

    limit: int
    offset: int

    def page(self, rows: Iterable[R], total: int, to_schema: Callable[[R], T]) -> Page[T]:
        """The envelope of this window's rows."""
        return page_of(rows, total, self.limit, self.offset, to_schema)


def by_attributes(schema: type[T]) -> Callable[[Any], T]:
    """A row mapper for a schema whose fields are all attributes of the row, by name."""

    def to_schema(row: Any) -> T:
        return msgspec.convert(row, schema, from_attributes=True)

    return to_schema


def from_row(schema: type[S], **computed: Callable[[Any], Any]) -> Callable[..., S]:
    """A row mapper for a response schema: each field is the row's attribute of the same
    name, unless ``computed`` derives it from the row or the call gives it by keyword
    (``project_out(project, role="owner")``). The struct is built directly, as a
    hand-written mapper would build it: nothing is converted or validated."""
    names = [field.name for field in msgspec.structs.fields(schema)]

    def to_schema(row: Any, **given: Any) -> S:
        values = dict(given)
        for name in names:
            if name not in values:
                derive = computed.get(name)
                values[name] = getattr(row, name) if derive is None else derive(row)
        return schema(**values)

    return to_schema
