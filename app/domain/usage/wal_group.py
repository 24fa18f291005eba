"""The consumer side of the usage write-ahead stream (see ``wal``): one
consumer of the group every replica shares, moving entries to the database.

Every step is safe to repeat: rows are inserted with ``ON CONFLICT (id) DO NOTHING``
and an entry is acknowledged and deleted only after its batch committed.
"""

from __future__ import annotations

import math
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import msgspec
import structlog
from redis.asyncio import Redis
from redis.exceptions import ResponseError

from app.domain.usage.entry import UsageEntry
from app.domain.usage.writer import UsageWriter

logger = structlog.get_logger()

GROUP = "usage-writers"
FIELD = b"e"
"""The one field of a stream entry (``wal.APPEND_SCRIPT`` writes it by name)."""
MAX_BATCHES_PER_DRAIN = 20
"""Bounds one read pass under a backlog, so trimming and consumer upkeep still run."""
FORGET_CONSUMER_IDLE_MS = 10 * 60 * 1000
"""A consumer with nothing pending, silent this long, belonged to a gone process."""
CONSUMER_UPKEEP_SECONDS = 60.0
LOG_INTERVAL_SECONDS = 60.0

StreamId = tuple[int, int]
Entries = list[tuple[bytes, dict[bytes, bytes]]]


def parse_id(raw: bytes | str) -> StreamId:
    text = raw.decode() if isinstance(raw, bytes) else raw
    ms, _, seq = text.partition("-")
    return int(ms), int(seq or 0)


def _release(exc: BaseException) -> None:
    """Break the reference cycle a Redis error reply comes with. redis-py raises the
    reply from a frame that still holds it in a local (``read_response``), so the
    exception's traceback holds a frame that holds the exception: each error would
    hand that frame, the ones below it and their closures to the cyclic collector
    (whose pauses stall every stream in flight). Clearing the finished frames' locals
    frees them by reference counting; the traceback's files and lines stay."""
    traceback.clear_frames(exc.__traceback__)


@dataclass(frozen=True, slots=True)
class Written:
    """Which entries are surely written: delivered to the group (ids up to
    ``delivered``) and no longer pending anywhere (ids below ``oldest_pending``)."""

    delivered: StreamId
    oldest_pending: StreamId | None

    def covers(self, entry_id: StreamId) -> bool:
        if entry_id > self.delivered:
            return False
        return self.oldest_pending is None or entry_id < self.oldest_pending


class StreamGroup:
    def __init__(
        self,
        redis: Redis,
        writer: UsageWriter,
        *,
        key: str,
        consumer: str,
        claim_idle: float,
        max_entries: int,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._redis = redis
        self._writer = writer
        self.key = key
        self.consumer = consumer
        self.max_entries = max_entries
        self._claim_idle_ms = max(1, int(claim_idle * 1000))
        self._batch = writer.max_batch
        self._decoder = msgspec.msgpack.Decoder(UsageEntry)
        self._clock = clock
        self._ready = False
        self._next_consumer_upkeep = -math.inf
        self._next_warning: dict[str, float] = {}
        self._trimmed_logged = 0
        self.trimmed = 0
        """Entries this process trimmed off the full stream (lost: counted as dropped)."""
        self.undecodable = 0
        """Entries no version of ``UsageEntry`` here could read (acknowledged, lost)."""
        self.length = 0
        """The stream's length at the last upkeep."""

    async def move(self) -> int:
        """One pass: entries pending on this consumer, then entries idle on others,
        then new ones. Returns the rows written; raises what Redis or the database
        raised (a failed batch stays pending here and is retried first)."""
        try:
            return await self._move()
        except ResponseError as exc:
            _release(exc)
            if "NOGROUP" not in str(exc):
                raise
            # Redis lost the group (a restart without persistence, a flush): what
            # the stream holds now was appended since; read all of it.
            self._ready = False
            return await self._move()

    async def _move(self) -> int:
        await self.ensure()
        written = await self.move_reads("0")
        written += await self._claim()
        return written + await self.move_reads(">")

    async def ensure(self, *, recheck: bool = False) -> None:
        if self._ready and not recheck:
            return
        try:
            # From the first entry: entries appended before the group existed count.
            await self._redis.xgroup_create(self.key, GROUP, id="0", mkstream=True)
        except ResponseError as exc:
            _release(exc)  # BUSYGROUP on every start but the first: no cycle each time
            if "BUSYGROUP" not in str(exc):
                raise
        self._ready = True

    async def move_reads(self, start: str) -> int:
        """``start`` "0": what is pending on this consumer; ">": never delivered."""
        written = 0
        for _ in range(MAX_BATCHES_PER_DRAIN):
            # RESP2 (app.lib.redis_client): [[key, [(id, fields), ...]]], or empty.
            reply: Any = await self._redis.xreadgroup(
                GROUP, self.consumer, {self.key: start}, count=self._batch
            )
            entries: Entries = reply[0][1] if reply else []
            if not entries:
                break
            written += await self._commit(entries)
        return written

    async def _claim(self) -> int:
        written = 0
        cursor: bytes | str = "0-0"
        for _ in range(MAX_BATCHES_PER_DRAIN):
            reply = await self._redis.xautoclaim(
                self.key,
                GROUP,
                self.consumer,
                min_idle_time=self._claim_idle_ms,
                start_id=cursor,
                count=self._batch,
            )
            cursor, entries = reply[0], reply[1]
            if entries:
                # A replica died holding them (or, during a database outage, is
                # failing to write them like everyone else).
                self.warn(
                    "claimed",
                    "usage entries taken over from an idle consumer",
                    None,
                    count=len(entries),
                )
                written += await self._commit(entries)
            if parse_id(cursor) == (0, 0):
                break
        return written

    async def _commit(self, entries: Entries) -> int:
        rows: list[UsageEntry] = []
        for _, fields in entries:
            payload = fields.get(FIELD) if fields else None
            if payload is None:
                continue  # trimmed while pending: counted when it was trimmed
            try:
                rows.append(self._decoder.decode(payload))
            except (msgspec.DecodeError, msgspec.ValidationError) as exc:
                self.undecodable += 1
                self.warn("undecodable", "an undecodable usage entry was discarded", exc)
        if rows:
            await self._writer.write(rows)
        await self.forget([entry_id for entry_id, _ in entries])
        return len(rows)

    async def forget(self, ids: Sequence[bytes]) -> None:
        """Acknowledge and delete written entries in one atomic step: an acknowledged
        entry left in the stream would never be delivered again, only trimmed."""
        if not ids:
            return
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.xack(self.key, GROUP, *ids)
            pipe.xdel(self.key, *ids)
            await pipe.execute()

    async def upkeep(self) -> Written | None:
        """Trim to the bound, read the stream's state, now and then forget consumers
        of gone processes. Returns what is surely written (None without the group)."""
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.xtrim(self.key, maxlen=self.max_entries, approximate=True)
            pipe.xlen(self.key)
            pipe.xpending(self.key, GROUP)
            pipe.xinfo_groups(self.key)
            trimmed, length, pending, groups = await pipe.execute()
        self.length = int(length)
        self.trimmed += int(trimmed)
        if self.trimmed > self._trimmed_logged and self.warn(
            "trimmed",
            "usage entries dropped: the write-ahead stream is full while the database refuses",
            None,
            dropped=self.trimmed - self._trimmed_logged,
            dropped_total=self.trimmed,
            max_entries=self.max_entries,
        ):
            self._trimmed_logged = self.trimmed
        now = self._clock()
        if now >= self._next_consumer_upkeep:
            self._next_consumer_upkeep = now + CONSUMER_UPKEEP_SECONDS
            await self._forget_gone_consumers()
        group = next((g for g in groups if g.get("name") in (GROUP, GROUP.encode())), None)
        if group is None:
            return None
        oldest = parse_id(pending["min"]) if pending.get("pending") else None
        return Written(parse_id(group["last-delivered-id"]), oldest)

    async def _forget_gone_consumers(self) -> None:
        for consumer in await self._redis.xinfo_consumers(self.key, GROUP):
            name = consumer["name"]
            name = name.decode() if isinstance(name, bytes) else name
            if name == self.consumer or consumer["pending"]:
                continue
            if consumer["idle"] > FORGET_CONSUMER_IDLE_MS:
                await self._redis.xgroup_delconsumer(self.key, GROUP, name)

    async def leave(self) -> None:
        """Leave the group, only with nothing pending: deleting a consumer forgets its
        pending entries, which would then never be delivered again."""
        held = await self._redis.xpending_range(
            self.key, GROUP, min="-", max="+", count=1, consumername=self.consumer
        )
        if not held:
            await self._redis.xgroup_delconsumer(self.key, GROUP, self.consumer)

    def warn(self, kind: str, message: str, exc: BaseException | None, **fields: Any) -> bool:
        """At most one line of each kind per minute; whether this one was logged."""
        now = self._clock()
        if now < self._next_warning.get(kind, -math.inf):
            return False
        self._next_warning[kind] = now + LOG_INTERVAL_SECONDS
        logger.warning(message, error=None if exc is None else repr(exc), **fields)
        return True
