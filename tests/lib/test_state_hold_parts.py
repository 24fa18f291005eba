"""``settle_part``: a lease's calls end one by one while its hold lives on (run
against the memory and the Redis ``StateStore``)."""

from __future__ import annotations

import pytest

from app.lib.state.base import ReserveWindow, StateStore, UnknownHoldWindowError
from tests.support.state_harness import Clocked, Harness

HOLD = 0.5
HOLD_WAIT = 0.6
LONG = 60.0


def lease(calls: int, tokens: int = 300) -> list[ReserveWindow]:
    """Room for ``calls`` calls of ``tokens`` each, reserved as one hold."""
    return [
        ReserveWindow("req", 100, LONG, calls),
        ReserveWindow("tok", 10_000, LONG, calls * tokens),
    ]


async def test_a_part_counts_its_actual_and_leaves_the_rest_held(store: StateStore) -> None:
    assert (await store.reserve(lease(4), "L", LONG)).allowed
    # One call of the four ended: its request stays, its 300 tokens became 120.
    assert await store.settle_part("L", {"req": (1, 1), "tok": (300, 120)})
    req, tok = await store.window_total("req"), await store.window_total("tok")
    assert (req.total, req.held) == (4, 3)
    assert (tok.total, tok.held) == (900 + 120, 900)
    # A call that never reached an upstream gives its units back.
    assert await store.settle_part("L", {"req": (1, 0), "tok": (300, 0)})
    assert (await store.window_total("req")).total == 3
    assert (await store.window_total("tok")).total == 600 + 120
    # A window not named is left alone; an overage is counted.
    assert await store.settle_part("L", {"tok": (300, 700)})
    assert (await store.window_total("tok")).total == 300 + 120 + 700
    # Releasing the lease gives back only what it still holds.
    assert await store.release("L")
    assert [await store.get(k) for k in ("req", "tok")] == [b"1", b"820"]


async def test_a_part_never_takes_more_than_the_hold_still_has(store: StateStore) -> None:
    assert (await store.reserve(lease(1), "L", LONG)).allowed
    # Asked to end 5 requests of a hold of 1: one leaves the hold, 5 are counted.
    assert await store.settle_part("L", {"req": (5, 5), "tok": (0, 0)})
    assert await store.get("req") == b"5"
    assert (await store.window_total("req")).held == 0
    assert await store.settle("L", {})  # the hold still lives (its tokens)
    assert await store.get("tok") == b"300"


async def test_parts_of_a_gone_hold_change_nothing(store: StateStore) -> None:
    assert not await store.settle_part("never", {"req": (1, 1)})
    assert (await store.reserve(lease(2), "L", LONG)).allowed
    assert await store.release("L")
    assert not await store.settle_part("L", {"req": (1, 1), "tok": (300, 100)})
    assert [await store.get(k) for k in ("req", "tok")] == [b"0", b"0"]


async def test_parts_reject_bad_arguments(store: StateStore) -> None:
    assert (await store.reserve(lease(2), "L", LONG)).allowed
    with pytest.raises(UnknownHoldWindowError):
        await store.settle_part("L", {"other": (1, 1)})
    with pytest.raises(ValueError, match="at least 0"):
        await store.settle_part("L", {"req": (-1, 1)})
    with pytest.raises(ValueError, match="at least 0"):
        await store.settle_part("L", {"req": (1, -1)})
    with pytest.raises(ValueError, match="hold_id"):
        await store.settle_part("", {})
    # Nothing changed: both calls' units are still held.
    assert (await store.window_total("tok")).held == 600


async def test_an_expired_lease_returns_its_unended_part(clocked: Clocked) -> None:
    """A replica's lease whose replica died: the calls that ended were counted, the
    rest comes back when the hold expires."""
    dying, survivor = clocked.replica(), clocked.replica()
    assert (await dying.reserve(lease(3), "L", HOLD)).allowed
    assert await dying.settle_part("L", {"req": (1, 1), "tok": (300, 50)})
    await clocked.advance(HOLD_WAIT)
    req, tok = await survivor.window_total("req"), await survivor.window_total("tok")
    assert (req.total, req.held, tok.total, tok.held) == (1, 0, 50, 0)
    assert not await dying.settle_part("L", {"req": (1, 1), "tok": (300, 50)})


async def test_a_part_skips_a_window_that_ended(clocked: Clocked) -> None:
    store = clocked.replica()
    windows = [ReserveWindow("short", None, HOLD, 5), ReserveWindow("long", None, LONG, 5)]
    assert (await store.reserve(windows, "L", LONG)).allowed
    await clocked.advance(HOLD_WAIT)
    assert await store.settle_part("L", {"short": (1, 1), "long": (1, 1)})
    assert not await store.exists("short")
    assert (await store.window_total("long")).total == 5


async def test_a_part_is_seen_by_another_replica(harness: Harness) -> None:
    here, there = harness.state(), harness.state()
    assert (await here.reserve(lease(2), "L", LONG)).allowed
    # Settled by a replica that did not take it (reads the hold's record).
    assert await there.settle_part("L", {"req": (1, 1), "tok": (300, 10)})
    assert (await here.window_total("tok")).total == 310
