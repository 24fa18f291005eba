"""Routing policies over simulated engines, in virtual time (a discrete-event simulation).

The engines are ``app.fakes.batching_engine.BatchingEngine``, the same model the live
benchmark serves over HTTP. Time is virtual, so a run of minutes of traffic takes a
fraction of a second and is exactly repeatable: the baselines (random, round robin,
least in-flight as LiteLLM's ``least-busy``, the fresh-metrics oracles) are measured
here, and so is Arona's estimator itself (``app.routing.load``, driven by this
module's scrape schedule), with one or several replicas, to compare designs before the
live run measures the real thing through HTTP.
"""

from __future__ import annotations

import heapq
import itertools
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from app.fakes.batching_engine import BatchingEngine, EngineRequest
from app.routing.load import BackendLoad, Counts, Estimate, Reading, score_of
from app.routing.pick import pick_lowest
from app.routing.types import ScoreKind
from bench.routing.workload import FIRST_TOKEN_DEADLINE, Workload

SCRAPE_LATENCY = 0.004
"""A ``/metrics`` answer takes this long (the engine state is read halfway)."""


@dataclass
class Outcome:
    """What one policy did to one workload."""

    policy: str
    engines: list[BatchingEngine]
    choices: list[int]
    """The engine each arrival went to, in arrival order."""
    scrapes: int = 0
    duration: float = 0.0


class Policy:
    name = "policy"

    def choose(self, now: float, engines: list[BatchingEngine], replica: int) -> int:
        raise NotImplementedError

    def sent(self, now: float, engine: int, replica: int, request: EngineRequest) -> None:
        return None

    def done(self, now: float, engine: int, replica: int, request: EngineRequest) -> None:
        return None

    def wakeups(self) -> list[float]:
        """Times at which the policy wants ``tick`` called (scrapes landing)."""
        return []

    def tick(self, now: float, engines: list[BatchingEngine]) -> None:
        return None


class RandomPolicy(Policy):
    name = "random"

    def __init__(self, seed: int) -> None:
        self._rng = random.Random(seed)

    def choose(self, now: float, engines: list[BatchingEngine], replica: int) -> int:
        return self._rng.randrange(len(engines))


class RoundRobin(Policy):
    name = "round-robin"

    def __init__(self) -> None:
        self._turn = itertools.count()

    def choose(self, now: float, engines: list[BatchingEngine], replica: int) -> int:
        return next(self._turn) % len(engines)


class LeastInFlight(Policy):
    """LiteLLM's ``least-busy``: the fewest requests this proxy has in flight."""

    name = "least-in-flight"

    def __init__(self, size: int) -> None:
        self._in_flight = [0] * size
        self._turn = 0

    def choose(self, now: float, engines: list[BatchingEngine], replica: int) -> int:
        self._turn += 1
        return pick_lowest([float(n) for n in self._in_flight], self._turn, margin=0.0)

    def sent(self, now: float, engine: int, replica: int, request: EngineRequest) -> None:
        self._in_flight[engine] += 1

    def done(self, now: float, engine: int, replica: int, request: EngineRequest) -> None:
        self._in_flight[engine] -= 1


class SeedOracle(Policy):
    """The seed's score read fresh from every engine before every request."""

    name = "oracle (seed score, fresh)"

    def __init__(self) -> None:
        self._turn = 0

    def choose(self, now: float, engines: list[BatchingEngine], replica: int) -> int:
        self._turn += 1
        scores = [e.num_running + 10.0 * e.num_waiting for e in engines]
        return pick_lowest(scores, self._turn, margin=0.0)


class CapacityOracle(Policy):
    """Read fresh: a free batch slot first (the least KV-cache use among them), else
    the shortest queue for the engine's size (waiting requests per slot)."""

    name = "oracle (capacity-aware, fresh)"

    def choose(self, now: float, engines: list[BatchingEngine], replica: int) -> int:
        def key(index: int) -> tuple[int, float]:
            engine = engines[index]
            if engine.num_running < engine.shape.slots and not engine.waiting:
                return (0, engine.kv_usage)
            return (1, (engine.num_waiting + 1) / (engine.shape.slots * engine.shape.speed))

        return min(range(len(engines)), key=key)


@dataclass
class _Replica:
    loads: list[BackendLoad]
    pending: list[tuple[float, int, float, Counts, Reading]] = field(default_factory=list)
    """Scrapes in flight: (lands at, engine, taken at, cluster counts then, reading)."""


class EstimatorPolicy(Policy):
    """Arona's router: ``replicas`` processes, each with its own ``BackendLoad`` per
    engine, scraping as ``MetricsRefresh`` does (busy backends every ``busy_every``,
    the others every ``idle_every``), sharing their counts with each other
    ``share_delay`` seconds late (None: not at all), scoring with ``kind`` and picking
    with ``pick_lowest``. Arrivals are spread over the replicas in turn."""

    def __init__(
        self,
        size: int,
        *,
        kind: ScoreKind = "seed",
        replicas: int = 1,
        busy_every: float = 0.25,
        idle_every: float = 2.0,
        margin: float = 0.0,
        share_delay: float | None = 0.012,
        estimate: bool = True,
        lazy: bool = False,
        capacities: Sequence[int] | None = None,
        name: str | None = None,
    ) -> None:
        self.kind = kind
        self.busy_every = busy_every
        self.idle_every = idle_every
        self.margin = margin
        self.share_delay = share_delay
        self.estimate = estimate
        self.lazy = lazy
        """Scrape only when a routing decision finds a reading due (as the router does)
        rather than on a timer."""
        self.name = name or f"arona ({kind}, {replicas} replica{'s' if replicas > 1 else ''})"
        known = list(capacities) if capacities is not None else [None] * size
        """The operator's ``max_concurrency`` per engine (None: learned)."""
        self.replicas = [
            _Replica([BackendLoad(max_concurrency=known[i]) for i in range(size)])
            for _ in range(replicas)
        ]
        self.scrapes = 0
        self._turn = 0
        self._shares: list[tuple[float, int, int, Counts]] = []
        """Counts on their way to the other replicas: (arrive at, from, engine, counts)."""

    def choose(self, now: float, engines: list[BatchingEngine], replica: int) -> int:
        self._deliver(now)
        state = self.replicas[replica]
        if self.lazy:
            self._scrape_due(now, engines, only=replica)
        if self.estimate:
            estimates = [load.estimate() for load in state.loads]
        else:  # the seed: the raw reading plus this replica's own in-flight count
            estimates = [_raw(load) for load in state.loads]
        scores = [score_of(self.kind, e) for e in estimates]
        self._turn += 1
        return pick_lowest(scores, self._turn, margin=self.margin)

    def _deliver(self, now: float) -> None:
        if not self._shares:
            return
        arrived = [s for s in self._shares if s[0] <= now]
        self._shares = [s for s in self._shares if s[0] > now]
        for _, origin, engine, counts in arrived:
            for number, state in enumerate(self.replicas):
                if number != origin:
                    state.loads[engine].remote(str(origin), counts)

    def _share(self, now: float, replica: int, engine: int) -> None:
        if self.share_delay is None or len(self.replicas) == 1:
            return
        load = self.replicas[replica].loads[engine]
        self._shares.append(
            (now + self.share_delay, replica, engine, Counts(load.sent, load.ended))
        )

    def _scrape_due(
        self, now: float, engines: list[BatchingEngine], only: int | None = None
    ) -> None:
        """Start every scrape that is due: busy backends every ``busy_every``, idle
        ones every ``idle_every`` (a replica's refresh loop, not its traffic, keeps
        its readings young)."""
        for number, state in enumerate(self.replicas):
            if only is not None and number != only:
                continue
            for index, load in enumerate(state.loads):
                if any(p[1] == index for p in state.pending):
                    continue
                reading = load.reading
                busy = load.in_flight > 0 or (reading is not None and reading.running > 0)
                every = self.busy_every if busy else self.idle_every
                if load.read_at is not None and now - load.read_at < every:
                    continue
                engine = engines[index]
                # What the engine says halfway through the scrape: its state now is the
                # closest the simulation has (engine state only changes at events).
                seen = Reading(
                    engine.num_running, engine.num_waiting, engine.kv_usage, engine.stats.finished
                )
                state.pending.append((now + SCRAPE_LATENCY, index, now, load.counts(), seen))
                self.scrapes += 1

    def sent(self, now: float, engine: int, replica: int, request: EngineRequest) -> None:
        self.replicas[replica].loads[engine].dispatched()
        self._share(now, replica, engine)

    def done(self, now: float, engine: int, replica: int, request: EngineRequest) -> None:
        self.replicas[replica].loads[engine].finished()
        self._share(now, replica, engine)

    def wakeups(self) -> list[float]:
        landing = [p[0] for r in self.replicas for p in r.pending]
        if self.lazy:
            return landing
        due = [
            load.read_at + (self.busy_every if load.in_flight else self.idle_every)
            for r in self.replicas
            for load in r.loads
            if load.read_at is not None
        ]
        return landing + due

    def tick(self, now: float, engines: list[BatchingEngine]) -> None:
        self._deliver(now)
        for state in self.replicas:
            landed = [p for p in state.pending if p[0] <= now]
            state.pending = [p for p in state.pending if p[0] > now]
            for _, index, taken_at, counts, reading in landed:
                state.loads[index].observe(reading, taken_at, counts)
        if not self.lazy:
            self._scrape_due(now, engines)


def _raw(load: BackendLoad) -> Estimate | None:
    """The seed's inputs: the last reading as is, plus every request in flight here."""
    if load.reading is None:
        return None
    r = load.reading
    return Estimate(r.running + load.in_flight, r.waiting, None, r.kv_usage, None, 0)


def simulate(workload: Workload, policy: Policy, replicas: int = 1) -> Outcome:
    engines = [BatchingEngine(shape) for shape in workload.pool]
    arrivals = workload.arrivals()
    outcome = Outcome(policy.name, engines, [], duration=workload.duration)
    # Events: (time, order, kind, payload). Kinds: 0 step end, 1 arrival, 2 deadline.
    events: list[tuple[float, int, int, int]] = []
    order = itertools.count()
    stepping = [False] * len(engines)
    owner: dict[int, tuple[int, int]] = {}  # id(request) -> (engine, replica)
    requests: dict[int, EngineRequest] = {}

    def start(index: int, now: float) -> None:
        seconds = engines[index].start_step(now)
        if seconds is None:
            stepping[index] = False
            return
        stepping[index] = True
        heapq.heappush(events, (now + seconds, next(order), 0, index))

    def finisher(index: int, replica: int) -> Callable[[EngineRequest, int, bool], None]:
        def sink(request: EngineRequest, _: int, done: bool) -> None:
            if done:
                policy.done(request.finished or 0.0, index, replica, request)

        return sink

    for number, arrival in enumerate(arrivals):
        heapq.heappush(events, (arrival.at, next(order), 1, number))
    scrape_marks: set[float] = set()
    remaining = len(arrivals)
    while events:
        now, _, kind, payload = heapq.heappop(events)
        if remaining == 0 and all(engine.idle for engine in engines):
            break  # everything answered: only the policy's own timers are left
        for wake in policy.wakeups():
            if wake not in scrape_marks and wake >= now:
                scrape_marks.add(wake)
                heapq.heappush(events, (wake, next(order), 3, 0))
        if kind == 3:
            policy.tick(now, engines)
            continue
        if kind == 0:
            engines[payload].finish_step(now)
            start(payload, now)
            continue
        if kind == 2:
            request = requests.get(payload)
            if request is not None and request.first_token is None and not request.aborted:
                index, replica = owner[payload]
                engines[index].abort(request, now)
                policy.done(now, index, replica, request)
                if not stepping[index]:
                    start(index, now)
            continue
        arrival = arrivals[payload]
        remaining -= 1
        replica = payload % replicas
        policy.tick(now, engines)
        index = policy.choose(now, engines, replica)
        outcome.choices.append(index)
        request = engines[index].submit(
            arrival.prompt_tokens, arrival.output_tokens, now, finisher(index, replica)
        )
        key = id(request)
        owner[key] = (index, replica)
        requests[key] = request
        policy.sent(now, index, replica, request)
        heapq.heappush(events, (now + FIRST_TOKEN_DEADLINE, next(order), 2, key))
        if not stepping[index]:
            start(index, now)
    outcome.scrapes = getattr(policy, "scrapes", 0)
    return outcome
