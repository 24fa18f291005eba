"""Batched usage records: metering must not cost a database round trip per request.

``UsageWriter.record`` only appends to an in-memory buffer; rows reach the database
in batches (every ``flush_interval`` seconds, as soon as ``max_batch`` are waiting,
and once more at shutdown). A failed batch stays buffered and is retried by the next
flush; the buffer is bounded, and what falls off it is counted (``dropped``, the
``arona_usage_dropped_total`` metric) and logged as a warning at most once per
``log_interval`` seconds with the number dropped since the last line.

With Redis configured the request path records through the write-ahead stream of
``wal`` instead, and this buffer only takes what Redis could not (see
``recorder``). The request path sees either through ``UsageSink``.

Each entry carries its row id from the moment it is recorded, and the INSERT skips
ids that already exist: a batch whose commit was cut off (connection lost after the
server committed) can be retried without writing anything twice. A batch refused for
a row's content (a constraint, a value out of range) is written row by row and only
the refused rows are dropped (``rejected``, reason ``refused``, logged): one bad row
must not hold up every row behind it.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

import asyncpg
import msgspec
import structlog
from sqlalchemy import Insert, Table, insert, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import DataError, DBAPIError, IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, AsyncSession, async_sessionmaker

from app.db.models import Project, UsageRecord
from app.db.outage import is_database_outage
from app.domain.usage.entry import UsageEntry

logger = structlog.get_logger()

DEFAULT_MAX_BATCH = 500
DEFAULT_FLUSH_SECONDS = 1.0
DEFAULT_MAX_BUFFERED = 100_000
DEFAULT_DROP_LOG_SECONDS = 60.0
_INT32_MIN, _INT32_MAX = -(2**31), 2**31 - 1
_INT32_FIELDS = (
    "status",
    "prompt_tokens",
    "completion_tokens",
    "total_tokens",
    "latency_ms",
    "ttft_ms",
)
"""The INTEGER columns of ``usage_records``."""
# Bound parameters per statement stay below what PostgreSQL (32767) and SQLite
# (32766 since 3.32) accept, whatever max_batch is configured.
_MAX_PARAMETERS = 30_000


def _string_limits(table: Table) -> dict[str, int]:
    limits: dict[str, int] = {}
    for column in table.columns:
        length = getattr(column.type, "length", None)
        if isinstance(length, int):
            limits[column.name] = length
    return limits


class UsageWriter:
    def __init__(
        self,
        target: AsyncEngine | async_sessionmaker[AsyncSession],
        *,
        max_batch: int = DEFAULT_MAX_BATCH,
        flush_interval: float = DEFAULT_FLUSH_SECONDS,
        max_buffered: int = DEFAULT_MAX_BUFFERED,
        log_interval: float = DEFAULT_DROP_LOG_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if max_batch < 1:
            raise ValueError(f"max_batch must be at least 1, got {max_batch}")
        if flush_interval <= 0:
            raise ValueError(f"flush_interval must be positive, got {flush_interval}")
        if max_buffered < max_batch:
            raise ValueError("max_buffered must be at least max_batch")
        self._target = target
        self.max_batch = max_batch
        self.flush_interval = flush_interval
        self.max_buffered = max_buffered
        self._buffer: deque[UsageEntry] = deque()
        self._lock = asyncio.Lock()
        self._size_flush: asyncio.Task[None] | None = None
        self._closed = False
        self._failing = False
        self.dropped = 0
        """Entries discarded because the buffer was full (the database kept failing)."""
        self.written = 0
        self.rejected = 0
        """Entries the database refused for their content (written one by one)."""
        """Rows this process inserted (duplicates skipped by the database included)."""
        self._log_interval = log_interval
        self._clock = clock
        self._next_drop_log = -math.inf
        self._drops_not_logged = 0
        table = UsageRecord.__table__
        assert isinstance(table, Table)
        self._table = table
        self._limits = _string_limits(table)
        self._chunk = max(1, min(max_batch, _MAX_PARAMETERS // len(table.columns)))
        self._columns = tuple(UsageEntry.__struct_fields__)
        placeholders = ", ".join(f"${i}" for i in range(1, len(self._columns) + 1))
        self._pg_insert_sql = (
            f"INSERT INTO {table.name} ({', '.join(self._columns)}) "  # noqa: S608 - our own names
            f"VALUES ({placeholders}) ON CONFLICT (id) DO NOTHING"
        )

    @property
    def pending(self) -> int:
        return len(self._buffer)

    def record(self, entry: UsageEntry) -> None:
        """Buffer one entry; never blocks and never touches the database."""
        if len(self._buffer) >= self.max_buffered:
            # Keep the newest: the oldest rows are the ones the database already
            # refused for longest.
            self._buffer.popleft()
            self._count_drops(1)
        self._buffer.append(entry)
        # While the database refuses, retries wait for the interval instead of
        # following the traffic (a failed flush per request would hammer it).
        if len(self._buffer) >= self.max_batch and not (self._closed or self._failing):
            self._trigger_flush()

    def _trigger_flush(self) -> None:
        if self._size_flush is not None and not self._size_flush.done():
            return  # one in flight already drains everything buffered, new rows included
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # recorded outside a loop (a script): the periodic flush picks it up
        self._size_flush = loop.create_task(self._flush_quietly())

    async def _flush_quietly(self) -> None:
        try:
            await self.flush()
        except Exception as exc:
            # Once per outage, not once per interval.
            if not self._failing:
                logger.warning(
                    "usage flush failed; rows kept for retry",
                    pending=self.pending,
                    error=repr(exc),
                )
            self._failing = True

    async def flush(self) -> int:
        """Write everything buffered; returns the rows written.

        On failure the unwritten rows go back to the front of the buffer (in order)
        and the error propagates.
        """
        async with self._lock:
            self._report_drops()
            total = 0
            while self._buffer:
                count = min(self._chunk, len(self._buffer))
                batch = [self._buffer.popleft() for _ in range(count)]
                try:
                    written = await self._write_salvaging(batch)
                except BaseException:
                    # Cancellation included: shutdown cancels a periodic flush
                    # mid-write, then flushes once more. (Rows already written are
                    # skipped on the retry: the INSERT ignores known ids.)
                    self._requeue(batch)
                    raise
                total += written
                self.written += written
            if self._failing:
                logger.info("usage flush recovered", written_total=self.written)
                self._failing = False
            return total

    async def write(self, batch: Sequence[UsageEntry]) -> None:
        """Insert ``batch`` now, bypassing the buffer (the write-ahead stream's drain).
        Rows the database refuses for their content are dropped and counted
        (``rejected``); any other failure raises, the rest of the batch unwritten."""
        for start in range(0, len(batch), self._chunk):
            chunk = batch[start : start + self._chunk]
            self.written += await self._write_salvaging(chunk)

    async def _write_salvaging(self, batch: Sequence[UsageEntry]) -> int:
        """``_write``, but a batch the database refuses for its content (not for being
        unreachable) is written row by row and the rows it refuses alone are dropped
        (counted and logged): one bad row must not block every row behind it, which
        through the shared write-ahead stream would stall every replica's metering.
        Returns the rows written; an outage propagates with nothing dropped."""
        try:
            await self._write(batch)
        except Exception as exc:
            if is_database_outage(exc) or not _refused(exc):
                raise
        else:
            return len(batch)
        written = 0
        for entry in batch:
            try:
                await self._write([entry])
            except Exception as exc:
                if is_database_outage(exc) or not _refused(exc):
                    raise
                self.rejected += 1
                logger.warning(
                    "usage record refused by the database and dropped",
                    record_id=str(entry.id),
                    project_id=str(entry.project_id),
                    error=repr(exc)[:500],
                )
            else:
                written += 1
        return written

    def _requeue(self, batch: Sequence[UsageEntry]) -> None:
        self._buffer.extendleft(reversed(batch))
        overflow = len(self._buffer) - self.max_buffered
        for _ in range(max(0, overflow)):
            self._buffer.popleft()
        self._count_drops(max(0, overflow))

    def _count_drops(self, count: int) -> None:
        if count <= 0:
            return
        self.dropped += count
        self._drops_not_logged += count
        self._report_drops()

    def _report_drops(self, *, force: bool = False) -> None:
        """One warning per ``log_interval`` at most, with the drops since the last one:
        a database down for an hour must not log a line per request."""
        if not self._drops_not_logged:
            return
        now = self._clock()
        if now < self._next_drop_log and not force:
            return
        self._next_drop_log = now + self._log_interval
        logger.warning(
            "usage records dropped: the buffer is full while the database refuses",
            dropped=self._drops_not_logged,
            dropped_total=self.dropped,
            max_buffered=self.max_buffered,
        )
        self._drops_not_logged = 0

    async def _write(self, batch: Sequence[UsageEntry]) -> None:
        rows = [self._row(entry) for entry in batch]
        try:
            await self._execute(rows)
        except IntegrityError:
            # The likely cause: a project deleted between the call and this flush.
            # Its usage is kept, detached, as ON DELETE SET NULL would have left it.
            if not await self._detach_deleted_projects(rows):
                raise
            await self._execute(rows)

    async def _execute(self, rows: list[dict[str, Any]]) -> None:
        if isinstance(self._target, AsyncEngine):
            async with self._target.begin() as connection:
                await self._insert(connection, rows)
            return
        async with self._target() as session:
            await self._insert(await session.connection(), rows)
            await session.commit()

    async def _insert(self, connection: AsyncConnection, rows: list[dict[str, Any]]) -> None:
        if connection.dialect.name == "postgresql" and connection.dialect.driver == "asyncpg":
            # SQLAlchemy's executemany renders and binds every row in Python: ~50 ms of
            # event-loop time per 500 rows, a stall every busy request waits through.
            # asyncpg's executemany encodes in C and pipelines the rows.
            raw = await connection.get_raw_connection()
            driver = raw.driver_connection
            assert driver is not None
            columns = self._columns
            records = [tuple(row[name] for name in columns) for row in rows]
            try:
                await driver.executemany(self._pg_insert_sql, records)
            except asyncpg.IntegrityConstraintViolationError as exc:
                raise IntegrityError(self._pg_insert_sql, None, exc) from exc
            except (asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
                # One error vocabulary for callers, whichever path wrote the rows.
                raise DBAPIError(self._pg_insert_sql, None, exc) from exc
            return
        await connection.execute(self._statement(connection), rows)

    def _statement(self, connection: AsyncConnection) -> Insert:
        dialect = connection.dialect.name
        if dialect == "postgresql":
            return postgresql.insert(self._table).on_conflict_do_nothing(index_elements=["id"])
        if dialect == "sqlite":
            return sqlite.insert(self._table).on_conflict_do_nothing(index_elements=["id"])
        return insert(self._table)

    async def _detach_deleted_projects(self, rows: list[dict[str, Any]]) -> bool:
        wanted = {row["project_id"] for row in rows if row["project_id"] is not None}
        if not wanted:
            return False
        query = select(Project.id).where(Project.id.in_(wanted))
        if isinstance(self._target, AsyncEngine):
            async with self._target.connect() as connection:
                existing = set((await connection.execute(query)).scalars())
        else:
            async with self._target() as session:
                existing = set((await session.execute(query)).scalars())
        gone = wanted - existing
        for row in rows:
            if row["project_id"] in gone:
                row["project_id"] = None
        return bool(gone)

    def _row(self, entry: UsageEntry) -> dict[str, Any]:
        row = msgspec.structs.asdict(entry)
        # A value no column accepts would make its whole batch fail on every retry
        # (and, through the write-ahead stream, stall every replica's writes): an
        # over-long or NUL-carrying name from a client, a token count past INTEGER
        # from an upstream. Each is made to fit instead.
        for name, limit in self._limits.items():
            value = row.get(name)
            if isinstance(value, str):
                if "\x00" in value:
                    value = row[name] = value.replace("\x00", "")
                if len(value) > limit:
                    row[name] = value[:limit]
        for name in _INT32_FIELDS:
            value = row[name]
            if value is not None and not _INT32_MIN <= value <= _INT32_MAX:
                row[name] = max(_INT32_MIN, min(_INT32_MAX, value))
        return row

    async def run(self) -> None:
        """Flush every ``flush_interval`` seconds until cancelled."""
        while True:
            await asyncio.sleep(self.flush_interval)
            await self._flush_quietly()

    async def close(self) -> None:
        """Final flush at shutdown: whatever the database accepts is not lost."""
        self._closed = True
        if self._size_flush is not None:
            await asyncio.gather(self._size_flush, return_exceptions=True)
        try:
            await self.flush()
        except Exception as exc:
            logger.error(
                "usage records lost at shutdown: the database refused the final flush",
                lost=self.pending,
                error=repr(exc),
            )
        self._report_drops(force=True)


def _refused(exc: BaseException) -> bool:
    """The database refused the row's content: a constraint or a value it cannot store
    (SQLSTATE classes 23 and 22). Anything else (a missing table, permissions, an
    outage) is the database's state, not the row's: the rows wait for it to change."""
    if isinstance(exc, IntegrityError | DataError):
        return True
    orig = getattr(exc, "orig", None)
    return isinstance(orig, asyncpg.DataError | asyncpg.IntegrityConstraintViolationError)
