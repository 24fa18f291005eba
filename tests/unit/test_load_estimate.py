"""The load estimate between scrapes (``app.routing.load``) and the router on top of it.

A fake clock that never moves stands for a burst arriving between two scrapes: the
estimate must spread it over the engines by their headroom, not send it all to the one
that looked emptiest when it was last read.
"""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest

from app.lib.events.memory import MemoryEventBus
from app.routing.load import (
    UNAVAILABLE_PENALTY,
    BackendLoad,
    Counts,
    Reading,
    capacity_score,
    seed_score,
)
from app.routing.load_share import LoadShare
from app.routing.types import RouteHints, ScoreKind
from tests.support.helpers import until
from tests.support.routing_fakes import RoutingRig, vllm_metrics


def read(load: BackendLoad, running: float, waiting: float = 0, **extra: float) -> None:
    load.observe(Reading(running, waiting, **extra), 0.0, load.counts())


def test_requests_sent_since_the_reading_are_added_ended_ones_taken_out() -> None:
    load = BackendLoad(max_concurrency=4)
    for _ in range(3):
        load.dispatched()  # before the scrape: in the reading
    read(load, running=3)
    for _ in range(2):
        load.dispatched()  # after it: not in the reading yet
    estimate = load.estimate()
    assert estimate is not None
    assert (estimate.running, estimate.waiting, estimate.added) == (4, 1, 2)
    assert seed_score(estimate) == 4 + 10 * 1
    load.finished()
    load.finished()  # two of the requests that were in the reading ended
    estimate = load.estimate()
    assert estimate is not None
    assert (estimate.running, estimate.waiting) == (3, 0)  # the waiting one got a slot


def test_capacity_is_learned_from_a_queue_and_the_operator_wins() -> None:
    load = BackendLoad()
    read(load, running=6)
    assert load.capacity is None  # no queue seen: nothing is known
    read(load, running=5, waiting=2)
    assert load.capacity == 5
    read(load, running=8)  # more ran later: the batch is bigger than it looked
    assert load.capacity == 8
    read(load, running=3, waiting=1)  # a request caught before its first step
    assert load.capacity == 8
    assert BackendLoad(max_concurrency=32).capacity == 32


def test_the_finish_rate_follows_the_engines_counter() -> None:
    load = BackendLoad()
    load.observe(Reading(1, 0, finished_total=100), 0.0, Counts(0, 0))
    load.observe(Reading(1, 0, finished_total=110), 2.0, Counts(0, 0))
    assert load.finish_rate == pytest.approx(5.0)
    load.observe(Reading(1, 0, finished_total=90), 4.0, Counts(0, 0))  # restarted
    assert load.finish_rate == pytest.approx(5.0)


def test_other_replicas_counts_join_and_a_newcomer_adds_only_its_changes() -> None:
    load = BackendLoad(max_concurrency=8)
    load.remote("b", Counts(sent=10, ended=8))  # b had 2 in flight before the reading
    read(load, running=2)
    load.remote("c", Counts(sent=100, ended=97))  # heard of after it: 3 in flight then
    estimate = load.estimate()
    assert estimate is not None
    assert estimate.running == 2  # both replicas' earlier requests are in the reading
    load.remote("b", Counts(sent=12, ended=8))
    load.remote("c", Counts(sent=101, ended=99))
    estimate = load.estimate()
    assert estimate is not None
    assert estimate.running == 2 + 2 + 1 - 2


def test_scores_prefer_a_free_slot_then_the_shortest_wait() -> None:
    roomy, full, slow = (BackendLoad(max_concurrency=c) for c in (16, 8, 8))
    read(roomy, running=10, kv_usage=0.5)
    read(full, running=8, waiting=2, kv_usage=0.9, finished_total=0)
    read(slow, running=8, waiting=2, finished_total=0)
    full.observe(Reading(8, 2, 0.9, 40), 10.0, full.counts())  # 4 finished a second
    slow.observe(Reading(8, 2, None, 10), 10.0, slow.counts())  # 1 a second
    scores = [capacity_score(x.estimate()) for x in (roomy, full, slow)]
    assert scores[0] < 1 <= scores[1] < scores[2]
    assert scores[1] == pytest.approx(1 + 3 / 4)
    assert capacity_score(None) == seed_score(None) == UNAVAILABLE_PENALTY


def test_a_backend_of_unknown_capacity_is_not_ranked_full_before_seen_that_full() -> None:
    big, small = BackendLoad(), BackendLoad()
    read(big, running=20)  # never queued, but it ran 20 at once: at least 20 fit
    read(small, running=6)
    assert (big.capacity, small.capacity) == (None, None)
    # 20 of at least 20 is as full as it was ever seen; 6 of at least 8 is not.
    assert capacity_score(small.estimate()) < 1 <= capacity_score(big.estimate())
    read(big, running=12)
    assert capacity_score(big.estimate()) == pytest.approx(12 / 20)
    # Once a queue shows what fits, that is the capacity (and the seed score is
    # untouched by the guess: requests run until a queue was seen).
    read(small, running=6, waiting=3)
    assert small.capacity == 6
    assert seed_score(big.estimate()) == 12


@pytest.mark.parametrize("kind", ["seed", "capacity"])
async def test_a_burst_between_scrapes_spreads_by_headroom(kind: ScoreKind) -> None:
    """Sixteen requests, no scrape in between (the clock stands still): with
    capacity-aware routing each engine receives exactly its free slots; with the
    seed score the counts even out instead of all going to the emptiest engine."""
    rig = RoutingRig()
    rig.router.score_kind = kind
    shapes = {"big": (16, 8), "mid": (8, 4), "small": (4, 0)}  # slots, running
    for name, (slots, running) in shapes.items():
        rig.add(name, kind="vllm", max_concurrency=slots)
        rig.script(name).metrics = vllm_metrics(running=running)
    sent: list[str] = []
    for _ in range(16):
        selection = await rig.router.select("m", "chat", RouteHints())
        selection.state.load.dispatched()  # sent, and still running
        sent.append(selection.state.name)
    counts = Counter(sent)
    if kind == "capacity":
        assert counts == {"big": 8, "mid": 4, "small": 4}
    else:
        # Every engine gets a share, and few requests queue while another engine has
        # a free slot (the seed score sees a queue only once a request joins it:
        # then it counts ten). Routing on the stale reading sent all 16 to "small".
        assert min(counts.values()) >= 4
        queued = sum(
            max(0, running + counts[name] - slots) for name, (slots, running) in shapes.items()
        )
        assert queued <= 2
    longest = max(len(list(g)) for g in _runs(sent))
    assert longest <= 8


def _runs(items: list[str]) -> list[list[str]]:
    runs: list[list[str]] = []
    for item in items:
        if runs and runs[-1][0] == item:
            runs[-1].append(item)
        else:
            runs.append([item])
    return runs


async def test_replicas_share_what_they_send() -> None:
    bus = MemoryEventBus()
    a, b = RoutingRig(events=bus), RoutingRig(events=bus)
    shares = []
    for number, rig in enumerate((a, b)):
        rig.add("x")
        share = LoadShare(rig.registry, bus, instance=f"replica-{number}", flush_seconds=0.001)
        share.watch()
        state = rig.registry.get("x")
        assert state is not None
        share.track(state)
        shares.append(share)
    follower = asyncio.create_task(shares[1].follow())
    try:
        await asyncio.sleep(0.01)  # subscribed
        state_a, state_b = a.registry.get("x"), b.registry.get("x")
        assert state_a is not None
        assert state_b is not None
        for _ in range(3):
            state_a.load.dispatched()
        state_a.load.finished()
        await until(lambda: state_b.load.counts() == Counts(3, 1))
        assert state_b.in_flight == 0  # b's own requests: none
    finally:
        follower.cancel()
        await asyncio.gather(follower, return_exceptions=True)
        for share in shares:
            await share.close()


async def test_a_change_after_a_quiet_spell_is_shared_at_once_a_burst_once_per_interval() -> None:
    bus = MemoryEventBus()
    rig = RoutingRig(events=bus)
    state = rig.add("x")
    share = LoadShare(rig.registry, bus, instance="replica-0", flush_seconds=60)
    share.track(state)
    seen: list[list[list[object]]] = []

    async def listen() -> None:
        async with bus.subscribe("routing.load") as events:
            async for event in events:
                seen.append(event["loads"])

    listener = asyncio.create_task(listen())
    try:
        await asyncio.sleep(0.01)  # subscribed
        state.load.dispatched()
        await until(lambda: len(seen) == 1)  # at once, not a minute later
        state.load.dispatched()
        state.load.finished()
        await asyncio.sleep(0.05)
        assert len(seen) == 1  # the rest of the burst waits for the interval's end
        assert seen[0][0][2:4] == [1, 0]
    finally:
        listener.cancel()
        await asyncio.gather(listener, return_exceptions=True)
        await share.close()
