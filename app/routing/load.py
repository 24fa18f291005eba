"""A backend's load as of now, not as of its last scrape.

A scrape of vLLM's ``/metrics`` says how many requests were running and waiting when
it was taken. Routing on that number alone herds: between two scrapes every request
goes to the engine that looked emptiest, until the next scrape shows it swamped. So
the last reading is corrected with what happened since, counted by the gateway itself:

- every replica counts the requests it sends to each backend and the ones that end
  (answered, failed or abandoned), and shares its totals with the others
  (``LoadShare``: a few milliseconds behind, coalesced; one process shares with
  itself);
- a scrape notes the cluster's totals when it is taken; the reading is then corrected
  by what was sent since (not in it yet) and what ended since (in it, gone now):
  ``reading + sent since - ended since``. A request sent and ended since is in both;
- the engine's batch capacity decides where the difference lands: a request runs while
  a slot is free and waits after that, an end frees a slot for the oldest waiting
  request. The capacity is the backend's ``max_concurrency`` when the operator set
  it; otherwise it is learned: once a reading shows requests waiting, the most ever
  seen running. Until then the capacity-aware score assumes what was seen running
  fits (at least ``UNKNOWN_CAPACITY_SCALE``), so a big engine is ranked by what it
  has shown and a small one is caught by its first queue.

Traffic that does not pass through the gateway is seen at the next scrape; busy
backends are scraped every few hundred milliseconds (``MetricsRefresh``).

The seed's score is computed on those current inputs: ``running + 10 * waiting``, the
requests sent since the reading counted as running or waiting by where they land
(without a known capacity, as running: the seed's ``+ local in-flight``). The
capacity-aware score prefers a backend with a free slot (the least KV-cache used,
relative to its size) and otherwise the shortest expected wait: the requests ahead of
a new one divided by the rate at which the backend finishes them.

Framework-free and clock-agnostic (every call takes ``now`` where time matters): the
router drives it in real time, the routing benchmark in virtual time.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

from app.routing.types import ScoreKind

WAITING_WEIGHT = 10.0
UNAVAILABLE_PENALTY = 1_000_000.0
RATE_HALF_LIFE_SECONDS = 10.0
"""How quickly the finish rate follows a change (an EWMA over scrape intervals)."""
UNKNOWN_CAPACITY_SCALE = 8.0
"""The batch a backend of unknown capacity is assumed to hold at least."""
FULL_KV = 0.95
"""KV-cache use at which a backend counts as having no room, free slot or not."""


@dataclass(frozen=True, slots=True)
class Reading:
    """One scrape: the engine's own counts when it answered."""

    running: float
    waiting: float
    kv_usage: float | None = None
    finished_total: float | None = None
    """``vllm:request_success_total``: requests finished since the engine started."""


@dataclass(frozen=True, slots=True)
class Counts:
    """Requests the whole cluster sent to a backend and saw end, since each replica
    started (only differences between two ``Counts`` mean anything)."""

    sent: int
    ended: int


@dataclass(frozen=True, slots=True)
class Estimate:
    """The backend's load now, as the cluster best knows it."""

    running: float
    waiting: float
    capacity: float | None
    """Batch capacity (None: not known yet)."""
    kv_usage: float | None
    finish_rate: float | None
    """Requests finished per second (None: not measured yet)."""
    added: int
    """Requests sent since the reading, still running or waiting (included above)."""
    peak_running: float = 0.0
    """The most requests the backend was ever seen running (a floor of its capacity)."""

    @property
    def free_slots(self) -> float:
        if self.capacity is None:
            return math.inf
        return max(0.0, self.capacity - self.running)


def seed_score(estimate: Estimate | None) -> float:
    """``running + 10 * waiting`` on current inputs; the penalty without metrics."""
    if estimate is None:
        return UNAVAILABLE_PENALTY
    return estimate.running + WAITING_WEIGHT * estimate.waiting


def capacity_score(estimate: Estimate | None) -> float:
    """Below 1: a free slot (the KV-cache share in use, lower first); from 1 up: no
    free slot, 1 + the expected wait in seconds for a new request."""
    if estimate is None:
        return UNAVAILABLE_PENALTY
    kv = estimate.kv_usage
    capacity = estimate.capacity
    if capacity is None:
        # Until a queue has shown what fits, assume what was seen running fits (and at
        # least a small batch): a backend is not ranked full before it was seen so
        # full, and a big one that ran many at once is ranked by that. The KV-cache
        # share alone would pick a batch full of short requests.
        capacity = max(estimate.peak_running, UNKNOWN_CAPACITY_SCALE)
    if estimate.running < capacity and (kv is None or kv < FULL_KV):
        used = estimate.running / capacity
        return used if kv is None else max(used, kv)
    ahead = estimate.waiting + max(0.0, estimate.running - capacity) + 1
    rate = estimate.finish_rate
    if not rate:
        # No finish rate yet: a bigger batch turns its queue over faster.
        return 1.0 + WAITING_WEIGHT * ahead / max(1.0, capacity)
    return 1.0 + ahead / rate


def score_of(kind: ScoreKind, estimate: Estimate | None) -> float:
    return capacity_score(estimate) if kind == "capacity" else seed_score(estimate)


@dataclass(slots=True)
class BackendLoad:
    """The cluster's bookkeeping of one backend, as this replica holds it."""

    max_concurrency: int | None = None
    """The operator's capacity for this backend, if set (it wins over the learned)."""
    reading: Reading | None = None
    read_at: float | None = None
    """When the reading was taken (its scrape's start)."""
    learned_capacity: float | None = None
    peak_running: float = 0.0
    """The most requests any reading showed running: what fits at least."""
    finish_rate: float | None = None
    sent: int = 0
    """Requests this replica sent to the backend."""
    ended: int = 0
    """Of those, the ones that ended."""
    listener: Callable[[], None] | None = field(default=None, repr=False)
    """Told of every request sent or ended (``LoadShare`` publishes the counts)."""
    _remote: dict[str, Counts] = field(default_factory=dict)
    """The other replicas' totals, as they last shared them."""
    _at_reading: Counts | None = None
    _rate_base: tuple[float, float] | None = None
    """(time, finished_total) of the reading the rate is measured from."""

    @property
    def in_flight(self) -> int:
        """This replica's requests on the backend now."""
        return self.sent - self.ended

    def dispatched(self) -> None:
        self.sent += 1
        if self.listener is not None:
            self.listener()

    def finished(self) -> None:
        self.ended += 1
        if self.listener is not None:
            self.listener()

    def remote(self, origin: str, counts: Counts) -> None:
        """Another replica's totals (absolute: a lost update is made good by the next).
        A replica first heard of after the reading adds nothing until it changes:
        whatever it had in flight then is in the reading already."""
        if origin not in self._remote and self._at_reading is not None:
            self._at_reading = Counts(
                self._at_reading.sent + counts.sent, self._at_reading.ended + counts.ended
            )
        self._remote[origin] = counts

    def counts(self) -> Counts:
        sent, ended = self.sent, self.ended
        for other in self._remote.values():
            sent += other.sent
            ended += other.ended
        return Counts(sent, ended)

    def observe(self, reading: Reading, taken_at: float, counts: Counts) -> None:
        """A scrape started at ``taken_at``, when the cluster's totals were ``counts``,
        answered ``reading``."""
        if self.read_at is not None and taken_at < self.read_at:
            return  # an older scrape that answered late
        self._learn_capacity(reading)
        self.peak_running = max(self.peak_running, reading.running)
        self._learn_rate(reading, taken_at)
        self.reading = reading
        self.read_at = taken_at
        self._at_reading = counts

    def forget_reading(self) -> None:
        """The metrics are unavailable: no estimate until the next good scrape."""
        self.reading = None
        self.read_at = None
        self._at_reading = None

    @property
    def capacity(self) -> float | None:
        if self.max_concurrency is not None:
            return float(self.max_concurrency)
        return self.learned_capacity

    def estimate(self) -> Estimate | None:
        reading, base = self.reading, self._at_reading
        if reading is None or base is None:
            return None
        now = self.counts()
        sent = max(0, now.sent - base.sent)
        ended = max(0, now.ended - base.ended)
        capacity = self.capacity
        total = reading.running + reading.waiting + sent - ended
        running, waiting = _settle(max(0.0, total), capacity)
        kv = reading.kv_usage
        if kv is not None:
            kv = _scaled_kv(kv, reading.running, running, capacity)
        return Estimate(running, waiting, capacity, kv, self.finish_rate, sent, self.peak_running)

    def _learn_capacity(self, reading: Reading) -> None:
        # Requests queue behind a full batch: what runs is what fits. A reading can
        # also catch a request that just arrived before the engine's next step took
        # it in, so the capacity is the most ever seen running, never less.
        if reading.waiting > 0 or self.learned_capacity is not None:
            self.learned_capacity = max(self.learned_capacity or 0.0, reading.running) or None

    def _learn_rate(self, reading: Reading, taken_at: float) -> None:
        total = reading.finished_total
        if total is None:
            return
        base = self._rate_base
        self._rate_base = (taken_at, total)
        if base is None or total < base[1] or taken_at <= base[0]:
            return  # the first reading, or the engine restarted
        elapsed = taken_at - base[0]
        sample = (total - base[1]) / elapsed
        if self.finish_rate is None:
            self.finish_rate = sample
            return
        weight = 1.0 - 0.5 ** (elapsed / RATE_HALF_LIFE_SECONDS)
        self.finish_rate += weight * (sample - self.finish_rate)


def _settle(total: float, capacity: float | None) -> tuple[float, float]:
    """Running fills up to the capacity, the rest waits (no capacity: all run)."""
    if capacity is None:
        return total, 0.0
    running = min(total, max(capacity, 0.0))
    return running, total - running


def _scaled_kv(kv: float, read_running: float, running: float, capacity: float | None) -> float:
    """KV use in proportion to the running requests (each holds about the same)."""
    if read_running > 0:
        return min(1.0, kv * running / read_running)
    if capacity:
        return min(1.0, running / capacity)
    return kv
