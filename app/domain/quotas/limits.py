"""Each project's quota limits, served from memory and kept current over the EventBus.

``QuotaLimitsCache`` answers ``get(project_id)`` from a dict: a project's row is read
from the database on its first request and then at most once per ``max_age`` seconds
(a safety net under lost events), never per request. A project without a
``project_quotas`` row is cached too, as unlimited.

``QuotaSync`` keeps every replica's cache equal to the database: a replica that
writes a quota drops its own entry at once and publishes on ``quotas.config``; the
others drop theirs when the event arrives (and everything after a resubscription,
when events may have been lost). Event shape (the bus adds ``channel``)::

    {"kind": "project", "projectId": "<project uuid>", "origin": "<replica id>"}
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from uuid import UUID

from advanced_alchemy.extensions.litestar import SQLAlchemyAsyncConfig
from sqlalchemy import select

from app.db.models import ProjectQuota
from app.domain.quotas.errors import QuotaUnavailableError
from app.lib.events.base import EventBus
from app.lib.replicated_cache import CacheSync, ReplicatedCache

CHANNEL = "quotas.config"
DEFAULT_MAX_AGE = 60.0
DEFAULT_MAX_PROJECTS = 10_000
# After a failed read, a stale entry is served this long before the next attempt.
RETRY_AFTER_FAILURE = 5.0


def lower(a: int | None, b: int | None) -> int | None:
    """The stricter of two limits; ``None`` is no limit."""
    if a is None:
        return b
    if b is None:
        return a
    return min(a, b)


@dataclass(frozen=True, slots=True)
class QuotaLimits:
    """The limits that apply to a project: per window the lower of the admin
    ceiling and the owner's own limit (``None``: no limit for that window)."""

    per_minute: int | None = None
    per_day: int | None = None
    per_month: int | None = None
    fail_closed: bool = False
    """When the state store is unreachable: refuse (503) instead of admitting."""
    tokens_per_minute: int | None = None
    tokens_per_day: int | None = None
    tokens_per_month: int | None = None
    budget_per_day: int | None = None
    """Micro-units of the price book's currency."""
    budget_per_month: int | None = None

    @property
    def limits_requests(self) -> bool:
        return (
            self.per_minute is not None or self.per_day is not None or (self.per_month is not None)
        )

    @property
    def limits_tokens(self) -> bool:
        return (
            self.tokens_per_minute is not None
            or self.tokens_per_day is not None
            or self.tokens_per_month is not None
        )

    @property
    def limits_cost(self) -> bool:
        return self.budget_per_day is not None or self.budget_per_month is not None

    @property
    def unlimited(self) -> bool:
        return not (self.limits_requests or self.limits_tokens or self.limits_cost)

    @classmethod
    def of(cls, row: ProjectQuota | None) -> QuotaLimits:
        if row is None:
            return UNLIMITED
        return cls(
            per_minute=lower(row.per_minute, row.owner_per_minute),
            per_day=lower(row.per_day, row.owner_per_day),
            per_month=lower(row.per_month, row.owner_per_month),
            fail_closed=row.fail_closed,
            tokens_per_minute=lower(row.tokens_per_minute, row.owner_tokens_per_minute),
            tokens_per_day=lower(row.tokens_per_day, row.owner_tokens_per_day),
            tokens_per_month=lower(row.tokens_per_month, row.owner_tokens_per_month),
            budget_per_day=lower(row.budget_per_day_micros, row.owner_budget_per_day_micros),
            budget_per_month=lower(row.budget_per_month_micros, row.owner_budget_per_month_micros),
        )


UNLIMITED = QuotaLimits()

LimitsLoader = Callable[[UUID], Awaitable[QuotaLimits]]


def db_limits_loader(db_config: SQLAlchemyAsyncConfig) -> LimitsLoader:
    """Reads one project's ``project_quotas`` row (one query)."""

    async def load(project_id: UUID) -> QuotaLimits:
        async with db_config.get_session() as session:
            row = await session.scalar(
                select(ProjectQuota).where(ProjectQuota.project_id == project_id)
            )
            return QuotaLimits.of(row)

    return load


class QuotaLimitsCache:
    def __init__(
        self,
        loader: LimitsLoader,
        *,
        max_age: float = DEFAULT_MAX_AGE,
        max_projects: int = DEFAULT_MAX_PROJECTS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._loader = loader
        # Invalidated entries are kept, stale: served only if the re-read fails.
        self._entries: ReplicatedCache[UUID, QuotaLimits] = ReplicatedCache(
            self._load,
            "quota limits",
            max_entries=max_projects,
            max_age=max_age,
            keep_on_invalidate=True,
            clock=clock,
            retry_seconds=RETRY_AFTER_FAILURE,
        )
        self.loads = 0
        """Database reads made (tests check the hot path makes none)."""

    def __len__(self) -> int:
        return len(self._entries)

    async def get(self, project_id: UUID) -> QuotaLimits:
        """The project's limits; no database query while its entry is fresh.

        When the database cannot be read, a stale entry is served (and the read
        retried after a few seconds); with no entry at all the error is
        ``QuotaUnavailableError`` (503 ``quota_unavailable``).
        """
        try:
            return await self._entries.get(project_id)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            raise QuotaUnavailableError(
                "the quota of this project cannot be checked right now; try again shortly",
                headers={"Retry-After": "1"},
            ) from exc

    async def _load(self, project_id: UUID) -> QuotaLimits:
        self.loads += 1
        return await self._loader(project_id)

    def invalidate(self, project_id: UUID) -> None:
        """Re-read this project on its next request (its quota row changed)."""
        self._entries.invalidate(project_id)

    def invalidate_all(self) -> None:
        self._entries.invalidate_all()


class QuotaSync(CacheSync):
    """Invalidates the limits cache on this replica and, over the bus, on the others;
    ``project_changed`` is called by ``ProjectQuotaService`` after it wrote."""

    def __init__(self, cache: QuotaLimitsCache, bus: EventBus) -> None:
        super().__init__(bus, CHANNEL, "project", "quota limits")
        self.cache = cache

    async def project_changed(self, project_id: UUID) -> None:
        """Called after this replica wrote the quota of ``project_id``."""
        await self.changed(project_id)

    async def forget(self, key: UUID) -> None:
        self.cache.invalidate(key)

    async def reload(self) -> None:
        self.cache.invalidate_all()
