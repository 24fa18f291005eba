"""The usage write-ahead log: a Redis stream between a metered request and the database.

The in-memory buffer of ``UsageWriter`` loses what it holds when its process dies
without a shutdown (SIGKILL, the OOM killer, a lost node): up to one flush interval
of traffic. With Redis configured, each request's ``UsageEntry`` is appended to one
stream shared by every replica (``XADD``) before the client's response completes,
and a consumer group shared by every replica moves entries to the database in
batches::

    XREADGROUP -> INSERT ... ON CONFLICT (id) DO NOTHING -> MULTI XACK XDEL EXEC

- Entries carry their row id (uuid7), so an entry written twice (a consumer killed
  between its INSERT and its XACK, a graceful stop writing its own entries while
  another replica does too) is still one row.
- Entries read by a consumer that died stay pending on it; every drain claims the
  entries idle for longer than ``claim_idle`` seconds (``XAUTOCLAIM``), so the
  survivors write them.
- While the database refuses, entries stay in the stream (a consumer keeps at most
  one batch pending and retries it first). The stream is trimmed to about
  ``max_entries`` (``XTRIM MAXLEN ~``); what trimming removes is counted as dropped.
- Appends are group-committed: entries recorded while one append is in flight go
  out together in the next (one script call doing an ``XADD`` per entry), so a busy
  replica makes one round trip for many requests and an idle one a round trip per
  request; each request waits for its own.
- Redis unreachable (or refusing writes, say out of memory): the entry goes to the
  in-memory buffer instead (the embedded path), counted as a fallback, and requests
  stop trying Redis until a background ping answers again.
- A graceful stop writes what this process appended and no replica has written yet,
  and what it holds pending, so a stopped installation leaves nothing of its own
  only in Redis.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import uuid
from collections import deque
from collections.abc import Sequence

import msgspec
import structlog
from redis.asyncio import Redis

from app.domain.usage.entry import UsageEntry
from app.domain.usage.wal_group import StreamGroup, StreamId, parse_id
from app.domain.usage.writer import UsageWriter
from app.lib.state.script_pipe import Script, StoreScripts

logger = structlog.get_logger()

DEFAULT_MAX_ENTRIES = 1_000_000
"""About 450 MB of Redis memory (measured: ~450 bytes an entry): hours of a database
outage at a hundred calls a second cluster-wide (docs/deployment.md)."""
DEFAULT_CLAIM_IDLE_SECONDS = 5.0
"""Entries pending this long on one consumer are taken over by the next drain: far
longer than a batch's INSERT, short enough that a killed replica's batch is written
a few seconds later."""
RETRY_SECONDS = 2.0
"""While Redis is unreachable, how often a background ping checks for its return."""

# One command for a whole group commit: redis-py spends ~20 us of CPU packing each
# pipelined XADD; as arguments of one script call an entry costs a few.
APPEND_SCRIPT = """
local ids = {}
for i = 1, #ARGV do
  ids[i] = redis.call('XADD', KEYS[1], '*', 'e', ARGV[i])
end
return ids
"""


def consumer_name() -> str:
    """Unique per process: a restarted replica is a new consumer (the old one's
    pending entries are claimed like any dead consumer's)."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


class UsageWal:
    def __init__(
        self,
        redis: Redis,
        writer: UsageWriter,
        *,
        key: str,
        max_entries: int = DEFAULT_MAX_ENTRIES,
        claim_idle: float = DEFAULT_CLAIM_IDLE_SECONDS,
        retry_seconds: float = RETRY_SECONDS,
        consumer: str | None = None,
        scripts: StoreScripts | None = None,
    ) -> None:
        if max_entries < 1:
            raise ValueError(f"max_entries must be at least 1, got {max_entries}")
        self._redis = redis
        # On the app's script pipe, an append leaves in the same write as the settle
        # of the call it meters (both are sent in one event-loop turn).
        self._append_script: Script = (
            redis.register_script(APPEND_SCRIPT)
            if scripts is None
            else scripts.register(APPEND_SCRIPT)
        )
        self._writer = writer
        self.key = key
        self.group = StreamGroup(
            redis,
            writer,
            key=key,
            consumer=consumer or consumer_name(),
            claim_idle=claim_idle,
            max_entries=max_entries,
        )
        self._retry_seconds = retry_seconds
        self._batch = writer.max_batch
        self._encoder = msgspec.msgpack.Encoder(uuid_format="bytes")
        self._queue: list[tuple[UsageEntry, asyncio.Future[None]]] = []
        self._appender: asyncio.Task[None] | None = None
        self._own: deque[tuple[StreamId, bytes, UsageEntry]] = deque()
        """What this process appended that may not be written yet, oldest first."""
        self._max_own = writer.max_buffered
        self._unavailable = False
        self._probe: asyncio.Task[None] | None = None
        self._drain_lock = asyncio.Lock()
        self._since_drain = 0
        self._size_drain: asyncio.Task[None] | None = None
        self._drain_failing = False
        self._closed = False
        self.appended = 0
        """Entries this process put in the stream."""
        self.append_batches = 0
        """Script calls those took: one round trip each, however many entries."""
        self.fallbacks = 0
        """Entries recorded in memory because the stream could not take them."""

    @property
    def consumer(self) -> str:
        return self.group.consumer

    @property
    def available(self) -> bool:
        return not self._unavailable

    @property
    def unconfirmed(self) -> int:
        """Own entries not known to be written yet (what a graceful stop writes)."""
        return len(self._own)

    @property
    def trimmed(self) -> int:
        return self.group.trimmed

    @property
    def undecodable(self) -> int:
        return self.group.undecodable

    @property
    def length(self) -> int:
        return self.group.length

    # ------------------------------------------------------------------ appending

    async def append(self, entry: UsageEntry) -> None:
        """Returns once ``entry`` is in the stream, or in the memory buffer when the
        stream cannot take it. Cancelling the caller does not lose the entry."""
        if self._unavailable or self._closed:
            self._fallback([entry])
            return
        loop = asyncio.get_running_loop()
        done: asyncio.Future[None] = loop.create_future()
        self._queue.append((entry, done))
        if self._appender is None or self._appender.done():
            self._appender = loop.create_task(self._append_queued())
        await done

    async def _append_queued(self) -> None:
        while self._queue:
            batch, self._queue = self._queue, []
            entries = [entry for entry, _ in batch]
            try:
                if self._unavailable:
                    self._fallback(entries)
                else:
                    await self._xadd(entries)
            except asyncio.CancelledError:
                self._fallback(entries)  # the loop is going away: keep them for close()
                raise
            except Exception as exc:  # the entries must land somewhere, whatever failed
                self._went_unavailable(exc)
                self._fallback(entries)
            finally:
                for _, done in batch:
                    if not done.done():
                        done.set_result(None)

    async def _xadd(self, entries: list[UsageEntry]) -> None:
        encode = self._encoder.encode
        ids: list[bytes] = await self._append_script(
            keys=[self.key], args=[encode(entry) for entry in entries]
        )
        self.appended += len(entries)
        self.append_batches += 1
        own = self._own
        for raw, entry in zip(ids, entries, strict=True):
            own.append((parse_id(raw), raw, entry))
        # Past the bound the oldest stay in the stream for the group; only this
        # process's shutdown would have written them itself.
        while len(own) > self._max_own:
            own.popleft()
        self._since_drain += len(entries)
        if self._since_drain >= self._batch and not (self._drain_failing or self._closed):
            self._trigger_drain()

    def _fallback(self, entries: Sequence[UsageEntry]) -> None:
        self.fallbacks += len(entries)
        for entry in entries:
            self._writer.record(entry)

    def _went_unavailable(self, exc: BaseException) -> None:
        if self._unavailable:
            return
        self._unavailable = True
        logger.warning(
            "usage write-ahead stream unavailable; recording usage in memory until "
            "Redis answers (a replica killed meanwhile loses what it holds)",
            error=repr(exc),
        )
        if not self._closed:
            self._probe = asyncio.get_running_loop().create_task(self._wait_for_redis())

    async def _wait_for_redis(self) -> None:
        while True:
            await asyncio.sleep(self._retry_seconds)
            with contextlib.suppress(Exception):  # still down: keep recording in memory
                await self._redis.ping()
                break
        self._unavailable = False
        logger.info("usage write-ahead stream available again", fallbacks=self.fallbacks)

    # ------------------------------------------------------------------- draining

    def _trigger_drain(self) -> None:
        if self._size_drain is not None and not self._size_drain.done():
            return
        self._size_drain = asyncio.get_running_loop().create_task(self.drain_quietly())

    async def run(self, interval: float) -> None:
        """Drain every ``interval`` seconds until cancelled."""
        while True:
            await asyncio.sleep(interval)
            await self.drain_quietly()

    async def drain_quietly(self) -> None:
        try:
            await self.drain()
        except Exception as exc:
            if not self._drain_failing:
                logger.warning(
                    "usage write-ahead drain failed; entries stay in the stream for retry",
                    error=repr(exc),
                )
            self._drain_failing = True

    async def drain(self) -> int:
        """Move what the group can read to the database (``StreamGroup.move``);
        returns the rows written, raises what Redis or the database raised."""
        async with self._drain_lock:
            self._since_drain = 0
            try:
                written = await self.group.move()
            finally:
                # Also (above all) while the database refuses: that is when the
                # stream grows to its bound.
                await self._upkeep()
            if self._drain_failing:
                logger.info("usage write-ahead drain recovered", written_total=self._writer.written)
                self._drain_failing = False
            return written

    async def drain_all(self) -> int:
        """Drain until nothing is left to read (tests, the app's ``flush``)."""
        total = 0
        while written := await self.drain():
            total += written
        return total

    async def _upkeep(self) -> None:
        try:
            written = await self.group.upkeep()
        except Exception as exc:  # the drain's own error, if any, is reported by its caller
            self.group.warn("upkeep", "usage write-ahead stream upkeep failed", exc)
            return
        # Stop tracking own entries some replica wrote.
        own = self._own
        while written is not None and own and written.covers(own[0][0]):
            own.popleft()

    # ------------------------------------------------------------------- stopping

    async def close(self) -> None:
        """Write this process's own entries (pending on it, or appended and not yet
        written by anyone) and leave the group. Whatever fails stays in the stream
        for the other replicas or the next start."""
        self._closed = True
        if self._appender is not None:
            await asyncio.gather(self._appender, return_exceptions=True)
        if self._size_drain is not None:
            await asyncio.gather(self._size_drain, return_exceptions=True)
        if self._probe is not None:
            self._probe.cancel()
            await asyncio.gather(self._probe, return_exceptions=True)
        if self._unavailable:
            logger.warning("usage entries left in the write-ahead stream", left=len(self._own))
            return
        try:
            async with self._drain_lock:
                await self.group.ensure(recheck=True)  # Redis may have lost it
                await self.group.move_reads("0")
                await self._write_own()
                await self.group.leave()
        except Exception as exc:
            logger.warning(
                "usage entries left in the write-ahead stream at shutdown; another "
                "replica or the next start writes them",
                left=len(self._own),
                error=repr(exc),
            )

    async def _write_own(self) -> None:
        while self._own:
            count = min(self._batch, len(self._own))
            chunk = [self._own.popleft() for _ in range(count)]
            try:
                # Some may be written already (by a drain elsewhere): skipped.
                await self._writer.write([entry for _, _, entry in chunk])
                await self.group.forget([raw for _, raw, _ in chunk])
            except BaseException:
                self._own.extendleft(reversed(chunk))
                raise
