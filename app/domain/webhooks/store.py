"""The delivery rows as the dispatcher reads and writes them, outside any request.

The table is the queue. A row is claimed with one conditional ``UPDATE ...
RETURNING`` that counts the attempt, names this replica in ``lease_owner`` and moves
``next_attempt_at`` to the end of the lease; on PostgreSQL the rows are picked by a
``SELECT ... FOR UPDATE SKIP LOCKED`` inside it, so replicas claiming at once take
different rows instead of queueing behind each other's locks. A claimed row is no
longer due, so nobody else takes it until the lease runs out (a replica that died
mid-attempt). The outcome is written only while this replica still holds that
attempt (owner and attempt count unchanged), so a late writer never overwrites a
newer attempt. SQLite (one process) ignores the lock clause; the same statements work.
"""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from uuid import UUID

from sqlalchemy import Row, delete, func, insert, select, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.ext.asyncio import AsyncEngine

from app.db.models import ProjectWebhook, WebhookDelivery
from app.domain.quotas.alerts import BudgetAlert
from app.lib.ids import uuid7

PENDING = "pending"
DELIVERED = "delivered"
FAILED = "failed"
EVENT_BUDGET = "budget.threshold"
EVENT_TEST = "webhook.test"
MAX_LOG_ENTRIES = 20
"""Attempts kept in a row's ``attempt_log`` (the latest; manual retries add more)."""

D = WebhookDelivery
W = ProjectWebhook
_CLAIMED = (D.id, D.webhook_id, D.event, D.payload, D.attempts, D.attempt_log)


def iso(at: datetime.datetime) -> str:
    return at.astimezone(datetime.UTC).isoformat().replace("+00:00", "Z")


def envelope(
    delivery_id: UUID, event: str, data: dict[str, object], now: datetime.datetime
) -> dict[str, Any]:
    """The JSON body of a delivery (every attempt sends the same one)."""
    return {"type": event, "id": str(delivery_id), "createdAt": iso(now), "data": data}


@dataclass(frozen=True, slots=True)
class Claimed:
    """A delivery this replica holds for one attempt."""

    id: UUID
    webhook_id: UUID
    event: str
    payload: dict[str, Any]
    attempts: int
    """Attempts so far, this one included."""
    attempt_log: list[dict[str, Any]]

    @classmethod
    def of(cls, row: Row[Any]) -> Claimed:
        return cls(
            id=row.id,
            webhook_id=row.webhook_id,
            event=row.event,
            payload=dict(row.payload),
            attempts=row.attempts,
            attempt_log=list(row.attempt_log or []),
        )


@dataclass(frozen=True, slots=True)
class Target:
    """The webhook as an attempt needs it (read at each attempt: an edited URL or a
    rotated secret applies to the next one)."""

    project_id: UUID
    url: str
    enabled: bool
    secret_encrypted: str
    previous_secret_encrypted: str | None
    previous_secret_expires_at: datetime.datetime | None


@dataclass(frozen=True, slots=True)
class Outcome:
    """What an attempt turned the row into."""

    status: str
    status_code: int | None
    error: str | None
    response: str | None
    next_attempt_at: datetime.datetime | None
    log_entry: dict[str, Any]


class DeliveryStore:
    """Every statement the dispatcher issues, each in a short transaction of its own."""

    __slots__ = ("_engine", "owner")

    def __init__(self, engine: AsyncEngine, owner: str) -> None:
        self._engine = engine
        self.owner = owner
        """This replica's name in ``lease_owner``."""

    async def enqueue_alert(
        self, alert: BudgetAlert, origin: str, now: datetime.datetime
    ) -> list[UUID]:
        """A pending row, due now, for each enabled webhook of the alert's project that
        takes threshold events; an alert already written for a webhook is skipped."""
        async with self._engine.begin() as conn:
            hooks = await conn.execute(
                select(W.id, W.events).where(W.project_id == alert.project_id, W.enabled)
            )
            targets = [hook_id for hook_id, events in hooks if EVENT_BUDGET in (events or [])]
            if not targets:
                return []
            data = alert.event(origin)
            rows = []
            for hook_id in targets:
                delivery_id = uuid7()
                rows.append(
                    _row(delivery_id, hook_id, EVENT_BUDGET, data, now, alert_id=alert.alert_id)
                )
            # Idempotent per (webhook, alert): the unique key decides, not a prior read.
            insert_new = pg_insert if conn.dialect.name == "postgresql" else sqlite_insert
            await conn.execute(
                insert_new(D)
                .values(rows)
                .on_conflict_do_nothing(index_elements=["webhook_id", "alert_id"])
            )
        return [row["id"] for row in rows]

    async def insert_claimed(
        self,
        webhook_id: UUID,
        event: str,
        data: dict[str, object],
        now: datetime.datetime,
        lease_until: datetime.datetime,
    ) -> Claimed:
        """A row created already held by this replica for its first attempt (a test
        event, attempted at once by the request that asked for it)."""
        delivery_id = uuid7()
        row = _row(delivery_id, webhook_id, event, data, now)
        row.update(attempts=1, lease_owner=self.owner, next_attempt_at=lease_until)
        async with self._engine.begin() as conn:
            await conn.execute(insert(D).values(row))
        return Claimed(delivery_id, webhook_id, event, row["payload"], 1, [])

    async def claim_due(
        self, now: datetime.datetime, lease_until: datetime.datetime, limit: int
    ) -> list[Claimed]:
        """Up to ``limit`` due rows, earliest first, held by this replica until
        ``lease_until``."""
        due = (
            select(D.id)
            .where(D.status == PENDING, D.next_attempt_at <= now)
            .order_by(D.next_attempt_at)
            .limit(limit)
            .with_for_update(skip_locked=True)
        )
        stmt = (
            update(D)
            .where(D.id.in_(due), D.status == PENDING, D.next_attempt_at <= now)
            .values(**self._lease(now, lease_until))
            .returning(*_CLAIMED)
        )
        async with self._engine.begin() as conn:
            rows = (await conn.execute(stmt)).all()
        return [Claimed.of(row) for row in rows]

    async def claim_failed(
        self, delivery_id: UUID, now: datetime.datetime, lease_until: datetime.datetime
    ) -> Claimed | None:
        """A failed row taken back for one more attempt (a retry asked for by hand);
        None when it is not failed (delivered, or already being retried)."""
        stmt = (
            update(D)
            .where(D.id == delivery_id, D.status == FAILED)
            .values(status=PENDING, **self._lease(now, lease_until))
            .returning(*_CLAIMED)
        )
        async with self._engine.begin() as conn:
            row = (await conn.execute(stmt)).first()
        return None if row is None else Claimed.of(row)

    def _lease(self, now: datetime.datetime, lease_until: datetime.datetime) -> dict[str, Any]:
        return {
            "attempts": D.attempts + 1,
            "lease_owner": self.owner,
            "next_attempt_at": lease_until,
            "updated_at": now,
        }

    async def target(self, webhook_id: UUID) -> Target | None:
        async with self._engine.connect() as conn:
            row = (
                await conn.execute(
                    select(
                        W.project_id,
                        W.url,
                        W.enabled,
                        W.secret_encrypted,
                        W.previous_secret_encrypted,
                        W.previous_secret_expires_at,
                    ).where(W.id == webhook_id)
                )
            ).first()
        return None if row is None else Target(*row)

    async def record(self, claimed: Claimed, outcome: Outcome, now: datetime.datetime) -> bool:
        """Write an attempt's outcome; False when this replica no longer held the row
        (its lease ran out and another replica took it, or it was deleted)."""
        log = [*claimed.attempt_log, outcome.log_entry][-MAX_LOG_ENTRIES:]
        stmt = (
            update(D)
            .where(
                D.id == claimed.id,
                D.lease_owner == self.owner,
                D.attempts == claimed.attempts,
            )
            .values(
                status=outcome.status,
                last_status_code=outcome.status_code,
                last_error=outcome.error,
                last_response=outcome.response,
                attempt_log=log,
                next_attempt_at=outcome.next_attempt_at,
                delivered_at=now if outcome.status == DELIVERED else None,
                lease_owner=None,
                updated_at=now,
            )
        )
        async with self._engine.begin() as conn:
            result = await conn.execute(stmt)
        return bool(result.rowcount == 1)

    async def next_due(self) -> datetime.datetime | None:
        """When the earliest pending row is due (leased rows: when their lease ends)."""
        async with self._engine.connect() as conn:
            due: datetime.datetime | None = await conn.scalar(
                select(func.min(D.next_attempt_at)).where(D.status == PENDING)
            )
        return due

    async def release(self, ids: Sequence[UUID], now: datetime.datetime) -> int:
        """Give back rows this replica holds (shutdown): due again at once."""
        if not ids:
            return 0
        stmt = (
            update(D)
            .where(D.id.in_(list(ids)), D.lease_owner == self.owner, D.status == PENDING)
            .values(lease_owner=None, next_attempt_at=now, updated_at=now)
        )
        async with self._engine.begin() as conn:
            result = await conn.execute(stmt)
        return int(result.rowcount or 0)

    async def prune(self, before: datetime.datetime) -> int:
        """Delete finished rows created before ``before`` (the log is kept bounded)."""
        stmt = delete(D).where(D.status != PENDING, D.created_at < before)
        async with self._engine.begin() as conn:
            result = await conn.execute(stmt)
        return int(result.rowcount or 0)


def _row(
    delivery_id: UUID,
    webhook_id: UUID,
    event: str,
    data: dict[str, object],
    now: datetime.datetime,
    *,
    alert_id: str | None = None,
) -> dict[str, Any]:
    return {
        "id": delivery_id,
        "webhook_id": webhook_id,
        "event": event,
        "alert_id": alert_id,
        "payload": envelope(delivery_id, event, data, now),
        "status": PENDING,
        "attempts": 0,
        "attempt_log": [],
        "next_attempt_at": now,
        "created_at": now,
        "updated_at": now,
    }
