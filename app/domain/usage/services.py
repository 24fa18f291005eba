"""Reading a project's usage records: filtered pages and aggregates.

Filters (query parameters, all optional, combined with AND):

- ``from`` / ``to``: ISO 8601 times (a time without offset is UTC; a bare date is its
  midnight); ``from`` inclusive, ``to`` exclusive;
- ``model`` (the model the client asked for), ``profile`` (model profile id),
  ``apiKeyId`` (UUID: an API key's, or a runtime token's for runtime chats),
  ``conversationId``;
- ``isOverrideKey``, ``isCustom``: ``true`` / ``false`` (also ``1`` / ``0``);
- ``status``: an HTTP status (``429``), or ``success`` (< 400) / ``error`` (>= 400).

A malformed value, or a parameter that is not a filter, is a 400 naming it in
``param``. Day buckets are UTC calendar days, computed in the database
(``to_char``/``timezone`` on PostgreSQL, ``strftime`` on SQLite).
"""

from __future__ import annotations

import datetime
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal
from uuid import UUID

from advanced_alchemy.repository import SQLAlchemyAsyncRepository
from advanced_alchemy.service import SQLAlchemyAsyncRepositoryService
from sqlalchemy import ColumnElement, String, case, func, select
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.functions import FunctionElement

from app.db.models import UsageRecord
from app.domain.queries import count_and_page
from app.domain.usage.key_spend import KeySpend, key_spend
from app.domain.usage.schemas import UsageGroupOut
from app.lib.errors import BadRequestError

GroupBy = Literal["day", "model", "profile", "backend", "apiKey", "conversation"]
GROUP_BY: tuple[GroupBy, ...] = ("day", "model", "profile", "backend", "apiKey", "conversation")
FILTER_PARAMS = frozenset(
    {
        "from",
        "to",
        "model",
        "profile",
        "apiKeyId",
        "conversationId",
        "isOverrideKey",
        "isCustom",
        "status",
    }
)
_TRUE = frozenset({"true", "1"})
_FALSE = frozenset({"false", "0"})
MAX_TEXT = 200


def _bad(param: str, message: str, code: str = "invalid_filter") -> BadRequestError:
    return BadRequestError(message, code=code, param=param)


def _time(param: str, raw: str) -> datetime.datetime:
    try:
        value = datetime.datetime.fromisoformat(raw.strip())
    except ValueError:
        raise _bad(
            param, f"`{param}` must be an ISO 8601 time such as 2026-01-31T12:00:00Z"
        ) from None
    if value.tzinfo is None:
        return value.replace(tzinfo=datetime.UTC)
    return value.astimezone(datetime.UTC)


def _bool(param: str, raw: str) -> bool:
    lowered = raw.strip().lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise _bad(param, f"`{param}` must be true or false")


def _text(param: str, raw: str) -> str:
    if not raw or len(raw) > MAX_TEXT:
        raise _bad(param, f"`{param}` must be 1 to {MAX_TEXT} characters")
    return raw


@dataclass(frozen=True, slots=True)
class UsageFilters:
    since: datetime.datetime | None = None
    until: datetime.datetime | None = None
    model: str | None = None
    profile: str | None = None
    api_key_id: UUID | None = None
    conversation_id: str | None = None
    is_override_key: bool | None = None
    is_custom: bool | None = None
    status: int | Literal["success", "error"] | None = None

    @classmethod
    def parse(cls, query: Mapping[str, str], *, allowed: frozenset[str]) -> UsageFilters:
        """Filters from the query string; ``allowed`` are the other known parameters."""
        for name in query:
            if name not in FILTER_PARAMS and name not in allowed:
                raise _bad(name, f"unknown query parameter `{name}`", "unknown_parameter")
        values: dict[str, Any] = {}
        if (raw := query.get("from")) is not None:
            values["since"] = _time("from", raw)
        if (raw := query.get("to")) is not None:
            values["until"] = _time("to", raw)
        if values.get("since") and values.get("until") and values["since"] > values["until"]:
            raise _bad("to", "`to` must not be earlier than `from`", "invalid_range")
        for param, field in (
            ("model", "model"),
            ("profile", "profile"),
            ("conversationId", "conversation_id"),
        ):
            if (raw := query.get(param)) is not None:
                values[field] = _text(param, raw)
        if (raw := query.get("apiKeyId")) is not None:
            try:
                values["api_key_id"] = UUID(raw.strip())
            except ValueError:
                raise _bad("apiKeyId", "`apiKeyId` must be a UUID") from None
        if (raw := query.get("isOverrideKey")) is not None:
            values["is_override_key"] = _bool("isOverrideKey", raw)
        if (raw := query.get("isCustom")) is not None:
            values["is_custom"] = _bool("isCustom", raw)
        if (raw := query.get("status")) is not None:
            values["status"] = _status(raw)
        return cls(**values)

    def clauses(self, project_id: UUID) -> list[ColumnElement[bool]]:
        """The filters within one project: what a project's readers may see."""
        return [UsageRecord.project_id == project_id, *self.conditions()]

    def conditions(self) -> list[ColumnElement[bool]]:
        """The filters alone, over every project (the platform admin's dashboard)."""
        r = UsageRecord
        where: list[ColumnElement[bool]] = []
        if self.since is not None:
            where.append(r.created_at >= self.since)
        if self.until is not None:
            where.append(r.created_at < self.until)
        if self.model is not None:
            where.append(r.model_requested == self.model)
        if self.profile is not None:
            where.append(r.model_profile_id == self.profile)
        if self.api_key_id is not None:
            where.append(r.api_key_id == self.api_key_id)
        if self.conversation_id is not None:
            where.append(r.conversation_id == self.conversation_id)
        if self.is_override_key is not None:
            where.append(r.is_override_key.is_(self.is_override_key))
        if self.is_custom is not None:
            where.append(r.is_custom.is_(self.is_custom))
        if self.status == "success":
            where.append(r.status < 400)
        elif self.status == "error":
            where.append(r.status >= 400)
        elif self.status is not None:
            where.append(r.status == self.status)
        return where


def _status(raw: str) -> int | Literal["success", "error"]:
    lowered = raw.strip().lower()
    if lowered == "success":
        return "success"
    if lowered == "error":
        return "error"
    if lowered.isdigit() and 100 <= int(lowered) <= 599:
        return int(lowered)
    raise _bad("status", "`status` must be an HTTP status (100-599), `success` or `error`")


def parse_group_by(raw: str | None) -> GroupBy:
    if raw is None:
        return "day"
    for group_by in GROUP_BY:
        if raw == group_by:
            return group_by
    raise _bad("groupBy", f"`groupBy` must be one of {', '.join(GROUP_BY)}")


def group_key(group_by: GroupBy) -> ColumnElement[Any]:
    """The column a summary groups by."""
    r = UsageRecord
    if group_by == "day":
        return utc_day(r.created_at)
    column = {
        "model": r.model_requested,
        "profile": r.model_profile_id,
        "backend": r.backend,
        "apiKey": r.api_key_id,
        "conversation": r.conversation_id,
    }[group_by]
    return column.expression


class utc_day(FunctionElement[str]):
    """The UTC calendar day of a timestamp column as ``YYYY-MM-DD``."""

    type = String()
    name = "utc_day"
    inherit_cache = True


@compiles(utc_day, "postgresql")
def _utc_day_pg(element: utc_day, compiler: SQLCompiler, **kw: Any) -> str:
    column = compiler.process(element.clauses, **kw)
    return f"to_char(timezone('UTC', {column}), 'YYYY-MM-DD')"


@compiles(utc_day, "sqlite")
def _utc_day_sqlite(element: utc_day, compiler: SQLCompiler, **kw: Any) -> str:
    # Stored as 'YYYY-MM-DD HH:MM:SS[.ffffff]' in UTC (advanced-alchemy DateTimeUTC).
    column = compiler.process(element.clauses, **kw)
    return f"strftime('%Y-%m-%d', {column})"


@compiles(utc_day)
def _utc_day_default(element: utc_day, compiler: SQLCompiler, **kw: Any) -> str:
    column = compiler.process(element.clauses, **kw)
    return f"CAST({column} AS DATE)"


def usage_sums() -> list[Any]:
    """The aggregate columns every usage summary shows (labelled as ``UsageGroupOut``'s
    fields): one definition, so the API and the dashboard cannot drift apart."""
    r = UsageRecord
    return [
        func.count().label("requests"),
        func.coalesce(func.sum(r.prompt_tokens), 0).label("prompt_tokens"),
        func.coalesce(func.sum(r.completion_tokens), 0).label("completion_tokens"),
        func.coalesce(func.sum(r.total_tokens), 0).label("total_tokens"),
        func.coalesce(func.sum(case((r.status >= 400, 1), else_=0)), 0).label("errors"),
        func.coalesce(func.sum(r.cost), 0).label("cost"),
        func.coalesce(func.sum(r.cost_micros), 0).label("cost_micros"),
        func.coalesce(func.sum(case((r.cost_estimated.is_(True), 1), else_=0)), 0).label(
            "estimated_costs"
        ),
        # One currency when the lowest and the highest agree (NULLs are not counted).
        func.min(r.currency).label("currency_low"),
        func.max(r.currency).label("currency_high"),
    ]


def aggregate(key: str | None, row: Any) -> UsageGroupOut:
    """A ``UsageGroupOut`` from a row that selected ``usage_sums()``."""
    return UsageGroupOut(
        key=key,
        cost_micros=int(row.cost_micros),
        currency=row.currency_low if row.currency_low == row.currency_high else None,
        cost_estimated=int(row.estimated_costs) > 0,
        requests=int(row.requests),
        prompt_tokens=int(row.prompt_tokens),
        completion_tokens=int(row.completion_tokens),
        total_tokens=int(row.total_tokens),
        errors=int(row.errors),
        # Rounded like the stored costs: float sums must not show binary noise.
        cost=round(float(row.cost), 6),
    )


async def sum_usage(session: AsyncSession, where: Sequence[ColumnElement[bool]]) -> UsageGroupOut:
    """The totals of the records matching ``where``: the one totals query, behind a
    project's usage summary and the admin dashboard's platform totals alike."""
    return aggregate("", (await session.execute(select(*usage_sums()).where(*where))).one())


class UsageRecordService(SQLAlchemyAsyncRepositoryService[UsageRecord]):
    class Repo(SQLAlchemyAsyncRepository[UsageRecord]):
        model_type = UsageRecord

    repository_type = Repo

    async def page(
        self, project_id: UUID, filters: UsageFilters, limit: int, offset: int
    ) -> tuple[Sequence[UsageRecord], int]:
        """Newest first (the id, a UUIDv7, breaks ties between equal times)."""
        return await count_and_page(
            self.repository.session,
            UsageRecord,
            filters.clauses(project_id),
            [UsageRecord.created_at.desc(), UsageRecord.id.desc()],
            limit,
            offset,
        )

    async def key_spend(
        self, project_id: UUID, credential_ids: Collection[UUID], *, now: datetime.datetime
    ) -> dict[UUID, KeySpend]:
        """This month's and today's spend of each API key or runtime token of a page
        (``key_spend``: one statement for all of them)."""
        return await key_spend(self.repository.session, project_id, credential_ids, now=now)

    async def export(
        self, project_id: UUID, filters: UsageFilters, max_rows: int
    ) -> Sequence[UsageRecord]:
        """Every matching record, newest first; more than ``max_rows`` is a 400."""
        session = self.repository.session
        where = filters.clauses(project_id)
        total = int(
            await session.scalar(select(func.count()).select_from(UsageRecord).where(*where)) or 0
        )
        if total > max_rows:
            raise BadRequestError(
                f"{total} records match; an export holds at most {max_rows}: "
                "narrow it with `from` and `to`",
                code="export_too_large",
            )
        statement = (
            select(UsageRecord)
            .where(*where)
            .order_by(UsageRecord.created_at.desc(), UsageRecord.id.desc())
        )
        rows: Sequence[UsageRecord] = (await session.scalars(statement)).all()
        return rows

    async def summary(
        self, project_id: UUID, filters: UsageFilters, group_by: GroupBy
    ) -> tuple[list[UsageGroupOut], UsageGroupOut]:
        """Per day (oldest first) or per model, profile, backend, API key or
        conversation (busiest first; calls without one are the group ``None``), and
        the totals."""
        session = self.repository.session
        where = filters.clauses(project_id)
        key = group_key(group_by)
        statement = select(key.label("key"), *usage_sums()).where(*where).group_by(key)
        if group_by == "day":
            statement = statement.order_by(key)
        else:
            statement = statement.order_by(func.count().desc(), key.asc().nulls_last())
        groups = [
            aggregate(None if row.key is None else str(row.key), row)
            for row in await session.execute(statement)
        ]
        return groups, await sum_usage(session, where)
