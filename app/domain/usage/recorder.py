"""What the app meters through (``resources.usage_writer``): the write-ahead stream
when Redis is configured, the in-memory buffer otherwise and as its fallback.

Loss windows (docs/deployment.md, "Usage durability"):

- Redis configured (``ARONA_USAGE_WAL``, on by default): none for a completed
  response; ``record`` returns once the entry is in the stream, and the gateway and
  runtime relays call it before the response's last bytes (``[DONE]``). While Redis
  is unreachable entries are buffered in memory as without it.
- No Redis (the embedded default): what the buffer holds when the process is killed,
  up to ``ARONA_USAGE_FLUSH_SECONDS`` (1 s) of traffic, or more while the database
  refuses. A graceful stop writes it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import structlog
from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from redis.asyncio import Redis
from sqlalchemy.ext.asyncio import AsyncEngine

from app.domain.usage.entry import UsageEntry
from app.domain.usage.wal import UsageWal
from app.domain.usage.writer import UsageWriter
from app.lib.settings import Settings
from app.lib.state.script_pipe import StoreScripts

logger = structlog.get_logger()


class UsageRecorder:
    def __init__(self, writer: UsageWriter, wal: UsageWal | None = None) -> None:
        self.writer = writer
        self.wal = wal

    @property
    def pending(self) -> int:
        """Entries held in this process's memory (not in the stream)."""
        return self.writer.pending

    async def record(self, entry: UsageEntry) -> None:
        try:
            if self.wal is None:
                self.writer.record(entry)
            else:
                await self.wal.append(entry)
        except Exception as exc:  # metering must never fail the request it meters
            logger.error("could not record usage", error=repr(exc))

    async def flush(self) -> int:
        """Write everything this process can reach now: its buffer, and every entry
        the stream's group can deliver. Raises what the database raised."""
        written = await self.writer.flush()
        if self.wal is not None:
            written += await self.wal.drain_all()
        return written

    async def run(self) -> None:
        if self.wal is None:
            await self.writer.run()
            return
        # The buffer still runs: it holds what Redis could not take.
        await asyncio.gather(self.writer.run(), self.wal.run(self.writer.flush_interval))

    async def close(self) -> None:
        if self.wal is not None:
            await self.wal.close()
        await self.writer.close()


class UsageMetrics(Collector):
    """Read at scrape time from the writer's and the stream's own counters, so
    metering costs nothing extra per request."""

    def __init__(self, writer: UsageWriter, wal: UsageWal | None) -> None:
        self._writer = writer
        self._wal = wal

    def collect(self) -> Iterator[Metric]:
        writer, wal = self._writer, self._wal
        yield GaugeMetricFamily(
            "arona_usage_buffered",
            "Usage entries held in this process's memory, waiting for the database.",
            value=writer.pending,
        )
        yield CounterMetricFamily(
            "arona_usage_written",
            "Usage rows this process inserted into the database.",
            value=writer.written,
        )
        dropped = CounterMetricFamily(
            "arona_usage_dropped",
            "Usage entries lost: the memory buffer was full (buffer_full), the write-ahead "
            "stream was trimmed (wal_trimmed), an entry could not be read (undecodable), "
            "or the database refused the row itself (refused).",
            labels=("reason",),
        )
        dropped.add_metric(("buffer_full",), writer.dropped)
        dropped.add_metric(("refused",), writer.rejected)
        dropped.add_metric(("wal_trimmed",), wal.trimmed if wal else 0)
        dropped.add_metric(("undecodable",), wal.undecodable if wal else 0)
        yield dropped
        if wal is None:
            return
        yield CounterMetricFamily(
            "arona_usage_wal_appended",
            "Usage entries this process appended to the write-ahead stream.",
            value=wal.appended,
        )
        yield CounterMetricFamily(
            "arona_usage_wal_fallback",
            "Usage entries recorded in memory because the write-ahead stream was unavailable.",
            value=wal.fallbacks,
        )
        yield GaugeMetricFamily(
            "arona_usage_wal_length",
            "Entries in the write-ahead stream at this process's last drain.",
            value=wal.length,
        )
        yield GaugeMetricFamily(
            "arona_usage_wal_available",
            "1 while this process appends usage to the write-ahead stream, 0 while it "
            "falls back to memory.",
            value=1 if wal.available else 0,
        )


def build_usage_recorder(
    settings: Settings,
    engine: AsyncEngine,
    redis: Redis | None,
    registry: CollectorRegistry | None = None,
    scripts: StoreScripts | None = None,
) -> UsageRecorder:
    writer = UsageWriter(engine, flush_interval=settings.usage_flush_seconds)
    wal: UsageWal | None = None
    if redis is not None and settings.usage_wal:
        wal = UsageWal(
            redis,
            writer,
            key=f"{settings.redis_prefix}usage:wal",
            max_entries=settings.usage_wal_max_entries,
            scripts=scripts,
        )
    if registry is not None:
        registry.register(UsageMetrics(writer, wal))
    return UsageRecorder(writer, wal)
