"""The price rows: platform prices (admin) and each project's own (its owner).

History is never rewritten: a row whose ``effectiveFrom`` has passed was in force for
the calls since, so it cannot be changed or deleted (409 ``price_in_force``); a
change of price is a new row with a later ``effectiveFrom``. A new row or a changed
future one may not start in the past. Two rows for the same model, backend, owner
and moment are refused (409 ``price_exists``): which one applied would be arbitrary.

Every write tells ``changes`` (``PriceSync``) the owner whose table changed, so every
replica's ``PriceBook`` re-reads it.
"""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from typing import Any
from uuid import UUID

import msgspec
from advanced_alchemy.repository import SQLAlchemyAsyncRepository
from advanced_alchemy.service import SQLAlchemyAsyncRepositoryService
from sqlalchemy import ColumnElement

from app.db.models import ModelPrice
from app.domain.prices import amounts
from app.domain.prices.book import PLATFORM
from app.domain.prices.schemas import PriceIn, PriceOut, PriceUpdate
from app.domain.queries import count_and_page
from app.lib.clock import utcnow
from app.lib.errors import BadRequestError, ConflictError, NotFoundError
from app.lib.replicated_cache import UNPUBLISHED, Changes

PRICE_NOT_FOUND = "price not found"
# (wire name, column) of the amounts.
AMOUNTS = (
    ("input", "input_micros"),
    ("cachedInput", "cached_input_micros"),
    ("output", "output_micros"),
    ("embedding", "embedding_micros"),
)


def price_out(row: ModelPrice, now: datetime.datetime | None = None) -> PriceOut:
    def optional(value: int | None) -> str | None:
        return None if value is None else amounts.text(value)

    return PriceOut(
        id=row.id,
        model=row.model,
        backend=row.backend,
        project_id=row.project_id,
        input=amounts.text(row.input_micros),
        cached_input=optional(row.cached_input_micros),
        output=amounts.text(row.output_micros),
        embedding=optional(row.embedding_micros),
        currency=row.currency,
        effective_from=row.effective_from,
        in_force=row.effective_from <= (now or utcnow()),
        created_at=row.created_at,
    )


def _owned(project_id: UUID | None) -> ColumnElement[bool]:
    if project_id is None:
        return ModelPrice.project_id.is_(None)
    return ModelPrice.project_id == project_id


def _not_past(when: datetime.datetime, now: datetime.datetime) -> datetime.datetime:
    when = when.replace(tzinfo=datetime.UTC) if when.tzinfo is None else when
    if when < now:
        raise BadRequestError(
            "`effectiveFrom` is in the past: prices already in force are history; "
            "give a time from now on (or leave it out for now)",
            code="effective_from_in_past",
            param="effectiveFrom",
        )
    return when.astimezone(datetime.UTC)


class ModelPriceService(SQLAlchemyAsyncRepositoryService[ModelPrice]):
    class Repo(SQLAlchemyAsyncRepository[ModelPrice]):
        model_type = ModelPrice

    repository_type = Repo
    changes: Changes = UNPUBLISHED
    """``PriceSync`` (set by the request's provider): told after every write."""

    async def page_of(
        self, project_id: UUID | None, limit: int, offset: int, model: str | None = None
    ) -> tuple[Sequence[ModelPrice], int]:
        """An owner's prices (``None``: the platform's) by model, then backend, then
        newest first."""
        where = [_owned(project_id)]
        if model is not None:
            where.append(ModelPrice.model == model)
        order = [
            ModelPrice.model,
            ModelPrice.backend.nulls_first(),
            ModelPrice.effective_from.desc(),
            ModelPrice.id,
        ]
        return await count_and_page(
            self.repository.session, ModelPrice, where, order, limit, offset
        )

    async def one(self, project_id: UUID | None, price_id: UUID) -> ModelPrice:
        """The owner's row, or 404 (another owner's row is not found)."""
        row = await self.get_one_or_none(ModelPrice.id == price_id, _owned(project_id))
        if row is None:
            raise NotFoundError(PRICE_NOT_FOUND, code="price_not_found")
        return row

    async def add(self, project_id: UUID | None, data: PriceIn) -> ModelPrice:
        now = utcnow()
        values: dict[str, Any] = {
            "model": data.model.strip() or _blank_model(),
            "backend": data.backend,
            "project_id": project_id,
            "currency": data.currency,
            "effective_from": now
            if data.effective_from is None
            else _not_past(data.effective_from, now),
        }
        for wire, column in AMOUNTS:
            raw = getattr(data, _attribute(wire))
            values[column] = None if raw is None else amounts.micros(wire, raw)
        await self._refuse_duplicate(values, None)
        row = await self.create(ModelPrice(**values), auto_commit=True)
        await self.changes.changed(project_id or PLATFORM)
        return row

    async def change(
        self, project_id: UUID | None, price_id: UUID, data: PriceUpdate
    ) -> ModelPrice:
        row = await self.one(project_id, price_id)
        now = utcnow()
        _refuse_history(row, now)
        given = {k: v for k, v in msgspec.structs.asdict(data).items() if v is not msgspec.UNSET}
        values: dict[str, Any] = {}
        if "model" in given:
            values["model"] = given["model"].strip() or _blank_model()
        for name in ("backend", "currency"):
            if name in given:
                values[name] = given[name]
        if "effective_from" in given:
            values["effective_from"] = _not_past(given["effective_from"], now)
        for wire, column in AMOUNTS:
            attribute = _attribute(wire)
            if attribute not in given:
                continue
            raw = given[attribute]
            if raw is None and column in ("input_micros", "output_micros"):
                raise BadRequestError(f"`{wire}` cannot be null", code="invalid_amount", param=wire)
            values[column] = None if raw is None else amounts.micros(wire, raw)
        if not values:
            return row
        merged = {
            "model": row.model,
            "backend": row.backend,
            "project_id": row.project_id,
            "effective_from": row.effective_from,
            **values,
        }
        await self._refuse_duplicate(merged, row.id)
        for name, value in values.items():
            setattr(row, name, value)
        row = await self.update(row, auto_commit=True)
        await self.changes.changed(project_id or PLATFORM)
        return row

    async def remove(self, project_id: UUID | None, price_id: UUID) -> None:
        row = await self.one(project_id, price_id)
        _refuse_history(row, utcnow())
        await self.delete(row.id, auto_commit=True)
        await self.changes.changed(project_id or PLATFORM)

    async def _refuse_duplicate(self, values: dict[str, Any], own_id: UUID | None) -> None:
        backend = values["backend"]
        same = [
            ModelPrice.model == values["model"],
            ModelPrice.backend.is_(None) if backend is None else ModelPrice.backend == backend,
            _owned(values["project_id"]),
            ModelPrice.effective_from == values["effective_from"],
        ]
        if own_id is not None:
            same.append(ModelPrice.id != own_id)
        if await self.exists(*same):
            raise ConflictError(
                "a price for this model, backend and effectiveFrom exists already; "
                "change that one or pick another time",
                code="price_exists",
            )


def _refuse_history(row: ModelPrice, now: datetime.datetime) -> None:
    if row.effective_from <= now:
        raise ConflictError(
            f"this price has been in force since {row.effective_from.isoformat()}: history "
            "is never rewritten; add a new price with a later effectiveFrom instead",
            code="price_in_force",
        )


def _attribute(wire: str) -> str:
    return "cached_input" if wire == "cachedInput" else wire


def _blank_model() -> str:
    raise BadRequestError("`model` must not be blank", code="invalid_model", param="model")
