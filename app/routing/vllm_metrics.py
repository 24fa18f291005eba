"""Load of vLLM backends, read from their Prometheus endpoint, cached for routing.

A vLLM server exposes ``vllm:num_requests_running``, ``vllm:num_requests_waiting`` and
KV-cache usage (``vllm:kv_cache_usage_perc``; older releases ``vllm:gpu_cache_usage_perc``,
plus ``vllm:cpu_cache_usage_perc`` where present), labelled by ``model_name`` and, on
multi-engine servers, ``engine``; ``vllm:request_success_total`` counts finished
requests. Counts are summed across engines; cache usage is the highest of any engine
(the fullest one decides whether a new request fits).

The cache answers routing without waiting on the network: a reading is refreshed in
the background once it is ``busy_seconds`` old for a backend with requests on it
(what it says changes with every token) and ``fresh_seconds`` old otherwise; up to
``expire_seconds`` it is used meanwhile; older (or never read) it counts as
unavailable, and the caller waits for a scrape at most ``wait_seconds`` before giving
up on it. Each reading goes to the backend's ``BackendLoad`` with the cluster's
request counts of the moment the scrape started (``app.routing.load``), which keeps
the estimate current between scrapes.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

from app.routing.load import BackendLoad, Counts, Reading
from app.routing.types import Clock, monotonic

RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
FINISHED = "vllm:request_success_total"
CACHE_USAGE = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
CPU_CACHE_USAGE = "vllm:cpu_cache_usage_perc"

FRESH_SECONDS = 2.0
BUSY_SECONDS = 0.25
EXPIRE_SECONDS = 10.0
WAIT_SECONDS = 0.05

Scrape = Callable[[], Awaitable[str]]
"""Fetches the exposition text of one backend (raises on failure)."""


class MetricsFormatError(ValueError):
    """The endpoint answered, but not with vLLM metrics."""


@dataclass(frozen=True, slots=True)
class VllmLoad:
    running: float
    waiting: float
    cache_usage: float | None
    cpu_cache_usage: float | None = None
    finished_total: float | None = None

    def reading(self) -> Reading:
        return Reading(self.running, self.waiting, self.cache_usage, self.finished_total)


def parse_vllm_metrics(text: str, model: str | None = None) -> VllmLoad:
    """Sum the load gauges across engines (only ``model``'s samples when given)."""
    totals = {RUNNING: 0.0, WAITING: 0.0}
    seen: set[str] = set()
    cache: float | None = None
    cpu_cache: float | None = None
    finished: float | None = None
    try:
        families = list(text_string_to_metric_families(text))
    except ValueError as exc:
        raise MetricsFormatError(f"not Prometheus text: {exc}") from exc
    for family in families:
        for sample in family.samples:
            if model is not None and sample.labels.get("model_name", model) != model:
                continue
            name = sample.name
            if name in totals:
                totals[name] += sample.value
                seen.add(name)
            elif name in CACHE_USAGE:
                cache = sample.value if cache is None else max(cache, sample.value)
            elif name == CPU_CACHE_USAGE:
                cpu_cache = sample.value if cpu_cache is None else max(cpu_cache, sample.value)
            elif name == FINISHED:
                finished = sample.value + (finished or 0.0)
    if RUNNING not in seen and WAITING not in seen:
        raise MetricsFormatError("no vllm:num_requests_running or _waiting gauge")
    return VllmLoad(totals[RUNNING], totals[WAITING], cache, cpu_cache, finished)


@dataclass(slots=True)
class _Entry:
    load: VllmLoad | None = None
    read_at: float | None = None
    refreshing: asyncio.Task[None] | None = None
    error: str = ""
    scrapes: int = 0


class VllmMetricsCache:
    def __init__(
        self,
        *,
        fresh_seconds: float = FRESH_SECONDS,
        busy_seconds: float = BUSY_SECONDS,
        expire_seconds: float = EXPIRE_SECONDS,
        wait_seconds: float = WAIT_SECONDS,
        clock: Clock = monotonic,
    ) -> None:
        self.fresh_seconds = fresh_seconds
        self.busy_seconds = busy_seconds
        self.expire_seconds = expire_seconds
        self.wait_seconds = wait_seconds
        self._clock = clock
        self._entries: dict[str, _Entry] = {}

    def forget(self, backend: str) -> None:
        entry = self._entries.pop(backend, None)
        if entry is not None and entry.refreshing is not None:
            entry.refreshing.cancel()

    def last_error(self, backend: str) -> str:
        entry = self._entries.get(backend)
        return entry.error if entry is not None else ""

    def scrapes(self, backend: str) -> int:
        """Scrapes started for ``backend`` (for the routing benchmark's figures)."""
        entry = self._entries.get(backend)
        return entry.scrapes if entry is not None else 0

    async def prepare(self, backend: str, scrape: Scrape, load: BackendLoad) -> None:
        """Make ``load``'s reading usable for a routing decision now: refresh it in the
        background when due, and wait briefly only when there is none (never read, or
        expired: then the backend is unavailable until a scrape answers)."""
        entry = self._entries.setdefault(backend, _Entry())
        now = self._clock()
        age = None if entry.read_at is None else now - entry.read_at
        reading = load.reading
        busy = load.in_flight > 0 or (reading is not None and reading.running + reading.waiting > 0)
        due = self.busy_seconds if busy else self.fresh_seconds
        if age is not None and age < due:
            return
        refresh = self._refresh(backend, entry, scrape, load)
        if age is not None and age < self.expire_seconds:
            return  # stale but usable while the refresh runs
        if load.reading is not None:
            load.forget_reading()
        try:
            await asyncio.wait_for(asyncio.shield(refresh), self.wait_seconds)
        except TimeoutError:
            return

    async def load(self, backend: str, scrape: Scrape, target: BackendLoad) -> VllmLoad | None:
        """The backend's last reading (for pages), or None when it is unavailable. A
        scrape this starts feeds ``target`` as routing's own would."""
        entry = self._entries.setdefault(backend, _Entry())
        age = None if entry.read_at is None else self._clock() - entry.read_at
        if age is not None and age < self.fresh_seconds:
            return entry.load
        refresh = self._refresh(backend, entry, scrape, target)
        if age is not None and age < self.expire_seconds:
            return entry.load  # stale but usable while the refresh runs
        # Expired or never read: wait briefly, never for a slow endpoint's full timeout.
        try:
            await asyncio.wait_for(asyncio.shield(refresh), self.wait_seconds)
        except TimeoutError:
            return None
        fresh = entry.read_at is not None and self._clock() - entry.read_at < self.expire_seconds
        return entry.load if fresh else None

    def _refresh(
        self, backend: str, entry: _Entry, scrape: Scrape, target: BackendLoad
    ) -> asyncio.Task[None]:
        if entry.refreshing is None or entry.refreshing.done():
            entry.scrapes += 1
            entry.refreshing = asyncio.get_running_loop().create_task(
                self._scrape(entry, scrape, target), name=f"vllm-metrics:{backend}"
            )
        return entry.refreshing

    async def _scrape(self, entry: _Entry, scrape: Scrape, target: BackendLoad | None) -> None:
        started = self._clock()
        counts: Counts | None = target.counts() if target is not None else None
        try:
            text = await scrape()
            entry.load = parse_vllm_metrics(text)
            entry.read_at = self._clock()
            entry.error = ""
            if target is not None and counts is not None:
                target.observe(entry.load.reading(), started, counts)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # an unreadable endpoint is "metrics unavailable"
            entry.error = str(exc) or type(exc).__name__
