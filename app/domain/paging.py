"""The query parameters of every paginated REST list, in one place.

``limit`` and ``offset`` are bounded alike everywhere (``app.lib.pagination`` holds the
numbers, which JSON-RPC uses too): a value out of range is a 400 naming the parameter,
documented in the OpenAPI schema, and never reaches the database.
"""

from __future__ import annotations

from typing import Annotated

from litestar.params import QueryParameter

from app.lib.pagination import MAX_LIMIT, MAX_OFFSET

LimitQuery = Annotated[int, QueryParameter(name="limit", ge=1, le=MAX_LIMIT)]
OffsetQuery = Annotated[int, QueryParameter(name="offset", ge=0, le=MAX_OFFSET)]
