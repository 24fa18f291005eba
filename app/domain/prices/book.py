"""The price book in memory: what a call costs, found without a database query.

Prices belong to an owner: the platform (``PLATFORM``) or a project (its own prices,
for its custom LLMs and override-key calls, whose spend is the project's own). Each
owner's rows are loaded once into a ``PriceTable`` (``ReplicatedCache``, kept current
over the ``EventBus`` by ``PriceSync``; a minute's ``max_age`` is the safety net
under lost events). A table holds future rows too, so a price change takes effect at
its ``effective_from`` on every replica without any event.

Which price applies (``PriceBook.price_for``):

- the owner: the project for custom-LLM and override-key calls (never the platform's
  prices: those calls are not the platform's traffic), the platform otherwise;
- the names, in order: the model as the request named it, the model profile, the
  model the backend served (what an alias or profile resolved to);
- a price for the serving backend beats a model-wide one for any of the names, then
  the first name with a price wins;
- of a (name, backend) pair's rows, the one with the latest ``effective_from`` not
  after the call.

Cost in micro-units, exact: ``(uncached * input + cached * cachedInput + completion *
output) / 10**6`` for chat, ``prompt * embedding / 10**6`` for embeddings (prices per
million tokens in micro-units), rounded half up.
"""

from __future__ import annotations

import asyncio
import datetime
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING
from uuid import UUID

import structlog
from advanced_alchemy.extensions.litestar import SQLAlchemyAsyncConfig
from sqlalchemy import select

from app.db.models import ModelPrice
from app.lib.events.base import EventBus
from app.lib.log_budget import RepeatBudget
from app.lib.replicated_cache import CacheSync, ReplicatedCache
from app.routing.types import Usage

if TYPE_CHECKING:
    from app.domain.calls.metering import CallRecord

logger = structlog.get_logger()

PLATFORM = UUID(int=0)
"""The owner key of the platform's prices (rows without a project)."""
CHANNEL = "prices.config"
PER_MILLION = 1_000_000
DEFAULT_MAX_AGE = 60.0
DEFAULT_MAX_OWNERS = 10_000
RETRY_AFTER_FAILURE = 5.0
WARNING_INTERVAL = 60.0
EMBEDDINGS = "embeddings"


@dataclass(frozen=True, slots=True)
class Price:
    """One row of the book, as the hot path reads it."""

    id: UUID
    model: str
    backend: str | None
    input_micros: int
    cached_input_micros: int | None
    output_micros: int
    embedding_micros: int | None
    currency: str
    effective_from: datetime.datetime

    @classmethod
    def of(cls, row: ModelPrice) -> Price:
        return cls(
            id=row.id,
            model=row.model,
            backend=row.backend,
            input_micros=row.input_micros,
            cached_input_micros=row.cached_input_micros,
            output_micros=row.output_micros,
            embedding_micros=row.embedding_micros,
            currency=row.currency,
            effective_from=row.effective_from,
        )

    def cost_micros(self, usage: Usage, *, embedding: bool) -> int:
        """What ``usage`` costs at this price, in micro-units of ``currency``."""
        if embedding:
            rate = self.input_micros if self.embedding_micros is None else self.embedding_micros
            numerator = usage.prompt_tokens * rate
        else:
            cached = min(usage.cached_tokens, usage.prompt_tokens)
            cached_rate = (
                self.input_micros if self.cached_input_micros is None else self.cached_input_micros
            )
            numerator = (
                (usage.prompt_tokens - cached) * self.input_micros
                + cached * cached_rate
                + usage.completion_tokens * self.output_micros
            )
        # Half up in integers: no float ever touches an amount.
        return (numerator + PER_MILLION // 2) // PER_MILLION


_MAX_MEMOIZED_NAMES = 1024


class PriceTable:
    """One owner's prices by (model, backend), each list newest first."""

    __slots__ = ("_backends", "_in_force", "_in_force_since", "_in_force_until", "_rows", "size")

    def __init__(self, prices: Iterable[Price]) -> None:
        rows: dict[tuple[str, str | None], list[Price]] = {}
        for price in prices:
            rows.setdefault((price.model, price.backend), []).append(price)
        for history in rows.values():
            history.sort(key=lambda p: p.effective_from, reverse=True)
        self._rows = rows
        self._backends: dict[str, list[str | None]] = {}
        for model, backend in rows:
            self._backends.setdefault(model, []).append(backend)
        self.size = sum(len(history) for history in rows.values())
        # The prices in force for a tuple of names (admission asks the same few names
        # on every call), valid until the next price takes effect.
        self._in_force: dict[tuple[str, ...], tuple[Price, ...]] = {}
        self._in_force_until: datetime.datetime | None = None
        self._in_force_since = datetime.datetime.min.replace(tzinfo=datetime.UTC)

    def dearest(
        self, names: Sequence[str], usage: Usage, at: datetime.datetime, *, embedding: bool
    ) -> int:
        """What ``usage`` costs at the dearest price in force for any of ``names`` on
        any backend (0 when none has one): before routing the backend, and so the
        price ``cost_of`` will pick, is unknown, and a reservation must not be short."""
        return max(
            (price.cost_micros(usage, embedding=embedding) for price in self._prices_of(names, at)),
            default=0,
        )

    def _prices_of(self, names: Sequence[str], at: datetime.datetime) -> tuple[Price, ...]:
        """The prices in force at ``at`` for ``names`` on every backend (memoized while
        no later price takes effect; ``at`` moving back, as in tests, recomputes)."""
        until = self._in_force_until
        if until is None or at >= until or at < self._in_force_since:
            self._in_force.clear()
            later = [
                p.effective_from
                for history in self._rows.values()
                for p in history
                if p.effective_from > at
            ]
            never = datetime.datetime.max.replace(tzinfo=at.tzinfo)
            self._in_force_until = min(later, default=never)
            self._in_force_since = at
        key = tuple(names)
        prices = self._in_force.get(key)
        if prices is None:
            if len(self._in_force) >= _MAX_MEMOIZED_NAMES:
                self._in_force.clear()
            prices = self._in_force[key] = tuple(
                price
                for name in names
                for backend in self._backends.get(name, ())
                if (price := self.in_force(name, backend, at)) is not None
            )
        return prices

    def in_force(self, model: str, backend: str | None, at: datetime.datetime) -> Price | None:
        """The price of exactly (model, backend) in force at ``at``."""
        for price in self._rows.get((model, backend), ()):
            if price.effective_from <= at:
                return price
        return None

    def match(
        self, names: Sequence[str], backend: str | None, at: datetime.datetime
    ) -> Price | None:
        """The most specific price for ``names`` (see the module doc)."""
        if backend is not None:
            for name in names:
                if (price := self.in_force(name, backend, at)) is not None:
                    return price
        for name in names:
            if (price := self.in_force(name, None, at)) is not None:
                return price
        return None


PricesLoader = Callable[[UUID], Awaitable[PriceTable]]


def db_prices_loader(db_config: SQLAlchemyAsyncConfig) -> PricesLoader:
    """Reads one owner's rows (one query)."""

    async def load(owner: UUID) -> PriceTable:
        owned = (
            ModelPrice.project_id.is_(None)
            if owner == PLATFORM
            else (ModelPrice.project_id == owner)
        )
        async with db_config.get_session() as session:
            rows = (await session.execute(select(ModelPrice).where(owned))).scalars()
            return PriceTable(Price.of(row) for row in rows)

    return load


class PriceBook:
    """Prices from memory (see the module doc); the meter's ``CallPricer``."""

    def __init__(
        self,
        loader: PricesLoader,
        *,
        max_age: float = DEFAULT_MAX_AGE,
        max_owners: int = DEFAULT_MAX_OWNERS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._loader = loader
        # Invalidated tables are kept, stale: served only while the re-read fails.
        self._tables: ReplicatedCache[UUID, PriceTable] = ReplicatedCache(
            self._load,
            "prices",
            max_entries=max_owners,
            max_age=max_age,
            keep_on_invalidate=True,
            clock=clock,
            retry_seconds=RETRY_AFTER_FAILURE,
        )
        self.loads = 0
        """Database reads made (tests check the hot path makes none)."""
        self._warnings = RepeatBudget(interval=WARNING_INTERVAL, clock=clock)

    async def _load(self, owner: UUID) -> PriceTable:
        self.loads += 1
        return await self._loader(owner)

    async def table(self, owner: UUID) -> PriceTable:
        return await self._tables.get(owner)

    async def price_for(
        self,
        model_requested: str,
        resolved_model: str | None,
        profile: str | None,
        backend: str | None,
        project_id: UUID | None,
        is_custom_or_override: bool,
        at: datetime.datetime,
    ) -> Price | None:
        """The price in force at ``at`` for a call (see the module doc)."""
        if is_custom_or_override:
            if project_id is None:
                return None
            owner = project_id
        else:
            owner = PLATFORM
        names = [n for n in dict.fromkeys((model_requested, profile, resolved_model)) if n]
        return (await self.table(owner)).match(names, backend, at)

    async def estimate_micros(
        self,
        names: Sequence[str],
        usage: Usage,
        project_id: UUID | None,
        is_custom_or_override: bool,
        *,
        embedding: bool,
    ) -> int:
        """The most a call of ``usage`` may cost now, for admission's reservation
        (see ``PriceTable.dearest``); 0 when unpriced or when the book cannot be read
        (the call is then held at no cost and settles to its actual one)."""
        if is_custom_or_override and project_id is None:
            return 0
        owner = project_id if is_custom_or_override and project_id is not None else PLATFORM
        try:
            table = await self.table(owner)
        except asyncio.CancelledError:
            raise
        except Exception:
            return 0
        wanted = [n for n in dict.fromkeys(names) if n]
        return table.dearest(
            wanted, usage, datetime.datetime.now(datetime.UTC), embedding=embedding
        )

    async def cost_of(
        self, call: CallRecord, at: datetime.datetime
    ) -> tuple[int | None, str | None]:
        """The call's cost at ``at`` and its currency, ``(None, None)`` unpriced; a
        book that cannot be read leaves the call unpriced (logged), never fails it."""
        if call.usage is None:
            return None, None
        try:
            price = await self.price_for(
                call.model_requested,
                call.model_served,
                call.model_profile_id,
                call.backend,
                call.project_id,
                call.is_custom or call.is_override_key,
                at,
            )
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            # One line per interval, not one per call, while the database is away.
            held = self._warnings.admit("unreadable")
            if held is not None:
                logger.warning(
                    "could not read the price book; calls stay unpriced",
                    error=repr(exc),
                    failures_not_logged=held,
                )
            return None, None
        if price is None:
            return None, None
        return price.cost_micros(call.usage, embedding=call.endpoint == EMBEDDINGS), price.currency

    def invalidate(self, owner: UUID) -> None:
        self._tables.invalidate(owner)

    def invalidate_all(self) -> None:
        self._tables.invalidate_all()


class PriceSync(CacheSync):
    """Invalidates an owner's table here and, over the bus, on the other replicas;
    ``changed(owner)`` is called by ``ModelPriceService`` after it wrote."""

    def __init__(self, book: PriceBook, bus: EventBus) -> None:
        super().__init__(bus, CHANNEL, "owner", "prices")
        self.book = book

    async def forget(self, key: UUID) -> None:
        self.book.invalidate(key)

    async def reload(self) -> None:
        self.book.invalidate_all()
