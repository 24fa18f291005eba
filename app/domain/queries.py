"""The statements many services issue the same way: one page of a table's rows with
the exact number of rows matching (``project_page``: of one project's rows, the
tenancy filter written once), and the delete of one row that says whether there was
one (``delete_in_project``: of one project's).

The count is its own query (not a window function over the page), so ``total`` stays
right on a page past the end, where the page itself has no row to carry it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, TypeVar, cast
from uuid import UUID

from sqlalchemy import ColumnElement, delete, func, select

from app.domain.races import Session

M = TypeVar("M")


async def count_and_page(
    session: Session,
    model: type[M],
    where: Iterable[ColumnElement[bool]],
    order_by: Iterable[Any],
    limit: int,
    offset: int,
) -> tuple[Sequence[M], int]:
    """The rows of ``model`` matching every clause of ``where``, in ``order_by`` order
    (stable: end it with a unique column), one page of them, and how many match."""
    clauses = list(where)
    total = await session.scalar(select(func.count()).select_from(model).where(*clauses))
    rows = await session.scalars(
        select(model).where(*clauses).order_by(*order_by).limit(limit).offset(offset)
    )
    return rows.all(), int(total or 0)


async def project_page(
    session: Session,
    model: type[M],
    project_id: UUID,
    order_by: Iterable[Any],
    limit: int,
    offset: int,
    *where: ColumnElement[bool],
) -> tuple[Sequence[M], int]:
    """``count_and_page`` of the rows of ``model`` (a table with a ``project_id``) that
    belong to ``project_id`` and match ``where``: another project's rows are never in
    the page or the count."""
    owned = cast(Any, model).project_id == project_id
    return await count_and_page(session, model, [owned, *where], order_by, limit, offset)


async def delete_one(session: Session, model: Any, *where: ColumnElement[bool]) -> bool:
    """Delete the row of ``model`` matching ``where``; whether there was one. Committed
    when there was; otherwise rolled back, for the caller to raise its 404 on a clean
    session. A key that refuses the delete raises from the commit, as it would inline."""
    deleted = await session.scalar(delete(model).where(*where).returning(model.id))
    if deleted is None:
        await session.rollback()
        return False
    await session.commit()
    return True


async def delete_in_project(session: Session, model: Any, project_id: UUID, row_id: UUID) -> bool:
    """``delete_one`` of the row ``row_id`` of ``model`` (a table with a ``project_id``)
    if it belongs to ``project_id``: another project's row is left, like a missing one."""
    return await delete_one(session, model, model.id == row_id, model.project_id == project_id)
