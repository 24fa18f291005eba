"""The reservation contract (``reserve`` / ``settle`` / ``release`` / ``window_total``),
run against the memory and the Redis ``StateStore``."""

from __future__ import annotations

import pytest

from app.lib.state.base import (
    HoldInUseError,
    ReserveWindow,
    StateStore,
    UnknownHoldWindowError,
    WindowLimit,
)
from tests.support.state_harness import Clocked, Harness

# Expiry tests wait HOLD_WAIT on Redis (the server's clock); HOLD leaves a loaded
# machine time to make its "still held" checks before the hold runs out.
HOLD = 0.5
HOLD_WAIT = 0.6
LONG = 60.0


def call(req: int = 1, tokens: int = 300, cost: int = 5_000) -> list[ReserveWindow]:
    """A call's reservation: one request, its token estimate, its cost in micro-units."""
    return [
        ReserveWindow("req", 3, LONG, req),
        ReserveWindow("tok", 1_000, LONG, tokens),
        ReserveWindow("cost", None, LONG, cost),
    ]


async def test_reserve_adds_each_windows_own_amount(store: StateStore) -> None:
    for n in (1, 2, 3):
        d = await store.reserve(call(), f"h{n}", LONG)
        assert d.allowed
        assert d.full == ()
        assert [w.key for w in d.windows] == ["req", "tok", "cost"]
        assert [w.current for w in d.windows] == [n, 300 * n, 5_000 * n]
        assert [w.limit for w in d.windows] == [3, 1_000, None]
        assert all(w.fits and w.retry_after == 0 for w in d.windows)
    # The counters are the ones ``admit_windows`` and ``get`` see.
    assert await store.get("tok") == b"900"
    assert not (await store.admit_windows([WindowLimit("tok", 1_000, LONG)], 101)).allowed


async def test_reserve_refuses_all_or_nothing(store: StateStore) -> None:
    assert (await store.reserve(call(tokens=600), "a", LONG)).allowed
    refused = await store.reserve(call(tokens=401), "b", LONG)
    assert not refused.allowed
    req, tok, cost = refused.windows
    assert (req.fits, req.current, req.retry_after) == (True, 1, 0)
    assert (tok.fits, tok.current, tok.limit) == (False, 600, 1_000)
    assert 0 < tok.retry_after <= LONG
    assert (cost.fits, cost.current) == (True, 5_000)
    assert refused.full == (tok,)
    # Nothing was counted, and no hold was recorded.
    assert [await store.get(k) for k in ("req", "tok", "cost")] == [b"1", b"600", b"5000"]
    assert not await store.settle("b", {})
    assert not await store.release("b")
    # A smaller call still fits exactly.
    assert (await store.reserve(call(tokens=400), "c", LONG)).windows[1].current == 1_000


async def test_reserve_reports_every_full_window(store: StateStore) -> None:
    assert (await store.reserve(call(req=3, tokens=100), "a", LONG)).allowed
    refused = await store.reserve(call(req=1, tokens=901), "b", LONG)
    assert [w.fits for w in refused.windows] == [False, False, True]


async def test_unlimited_and_zero_amount_windows_only_count(store: StateStore) -> None:
    big = [ReserveWindow("cost", None, LONG, 10**15), ReserveWindow("req", 1, LONG, 0)]
    d = await store.reserve(big, "a", LONG)
    assert d.allowed
    assert [w.current for w in d.windows] == [10**15, 0]
    # A zero amount opens the window (a key with 0) and fits a window at its limit...
    assert await store.get("req") == b"0"
    assert (await store.reserve([ReserveWindow("req", 1, LONG, 1)], "b", LONG)).allowed
    assert (await store.reserve([ReserveWindow("req", 1, LONG, 0)], "c", LONG)).allowed
    # ...but not one already past it (an overage was settled into it).
    assert await store.settle("b", {"req": 2})
    refused = await store.reserve([ReserveWindow("req", 1, LONG, 0)], "d", LONG)
    assert not refused.allowed
    assert refused.windows[0].current == 2


async def test_zero_limit_refuses_and_creates_nothing(store: StateStore) -> None:
    refused = await store.reserve(
        [ReserveWindow("z", 0, 5, 1), ReserveWindow("other", None, 5, 1)], "a", LONG
    )
    assert not refused.allowed
    assert refused.windows[0].retry_after == pytest.approx(5, abs=0.01)
    assert not await store.exists("z")
    assert not await store.exists("other")


async def test_settle_refunds_the_unused_part(store: StateStore) -> None:
    assert (await store.reserve(call(), "a", LONG)).allowed
    assert await store.settle("a", {"tok": 120, "cost": 1_999})
    # ``req`` was not named: it keeps the reserved request.
    assert [await store.get(k) for k in ("req", "tok", "cost")] == [b"1", b"120", b"1999"]
    total = await store.window_total("tok")
    assert (total.key, total.total, total.held) == ("tok", 120, 0)
    # The refund is room for others at once.
    d = await store.reserve(call(tokens=880), "b", LONG)
    assert d.allowed
    assert d.windows[1].current == 1_000


async def test_settle_counts_an_overage_past_the_limit(store: StateStore) -> None:
    assert (await store.reserve(call(tokens=900), "a", LONG)).allowed
    assert await store.settle("a", {"tok": 1_250})
    assert (await store.window_total("tok")).total == 1_250
    refused = await store.reserve(call(tokens=0), "b", LONG)
    assert not refused.allowed
    assert refused.windows[1].current == 1_250


async def test_settle_and_release_are_idempotent(store: StateStore) -> None:
    assert (await store.reserve(call(), "a", LONG)).allowed
    assert await store.settle("a", {"tok": 100})
    assert not await store.settle("a", {"tok": 999})
    assert not await store.release("a")
    assert await store.get("tok") == b"100"

    assert (await store.reserve(call(), "b", LONG)).allowed
    assert await store.release("b")
    assert not await store.release("b")
    assert not await store.settle("b", {"tok": 999})
    assert [await store.get(k) for k in ("req", "tok", "cost")] == [b"1", b"100", b"5000"]
    assert not await store.settle("never-reserved", {"tok": 1})


async def test_release_gives_back_everything(store: StateStore) -> None:
    assert (await store.reserve(call(), "a", LONG)).allowed
    assert (await store.reserve(call(tokens=50), "b", LONG)).allowed
    assert await store.release("a")
    assert [await store.get(k) for k in ("req", "tok", "cost")] == [b"1", b"50", b"5000"]
    tok = await store.window_total("tok")
    assert (tok.total, tok.held) == (50, 50)


async def test_a_hold_id_is_reusable_only_once_dropped(store: StateStore) -> None:
    assert (await store.reserve(call(), "a", LONG)).allowed
    with pytest.raises(HoldInUseError, match="live"):
        await store.reserve(call(), "a", LONG)
    with pytest.raises(HoldInUseError):
        await store.reserve([], "a", LONG)
    assert await store.get("tok") == b"300"
    assert await store.settle("a", {})
    assert (await store.reserve(call(), "a", LONG)).windows[1].current == 600


async def test_settle_naming_a_foreign_window_changes_nothing(store: StateStore) -> None:
    assert (await store.reserve(call(), "a", LONG)).allowed
    with pytest.raises(UnknownHoldWindowError, match="other"):
        await store.settle("a", {"tok": 1, "other": 1})
    with pytest.raises(ValueError, match="at least 0"):
        await store.settle("a", {"tok": -1})
    assert await store.get("tok") == b"300"
    # The hold is still live and settles normally.
    assert await store.settle("a", {"tok": 7})
    assert await store.get("tok") == b"7"


async def test_window_total(store: StateStore) -> None:
    empty = await store.window_total("tok")
    assert (empty.total, empty.held, empty.resets_in) == (0, 0, None)
    assert (await store.reserve(call(), "a", LONG)).allowed
    assert (await store.reserve(call(tokens=200), "b", LONG)).allowed
    assert await store.settle("a", {"tok": 250})
    tok = await store.window_total("tok")
    assert (tok.key, tok.total, tok.held) == ("tok", 450, 200)
    assert tok.resets_in is not None
    assert 0 < tok.resets_in <= LONG


async def test_extend_moves_a_live_holds_end(clocked: Clocked) -> None:
    store = clocked.replica()
    assert (await store.reserve([ReserveWindow("w", None, LONG, 5)], "a", LONG)).allowed
    # Shortened to HOLD, it then expires like any other hold.
    assert await store.extend("a", HOLD)
    assert not await store.extend("never-reserved", LONG)
    with pytest.raises(ValueError, match="hold_ttl"):
        await store.extend("a", 0)
    with pytest.raises(ValueError, match="hold_id"):
        await store.extend("", LONG)
    if clocked.kind == "memory":  # on Redis this expiry is waited for in the test above
        await clocked.advance(HOLD_WAIT)
        assert (await store.window_total("w")).held == 0
        assert not await store.extend("a", LONG)
        assert not await store.settle("a", {})
    else:
        assert (await store.window_total("w")).held == 5
        assert await store.release("a")
        assert not await store.extend("a", LONG)
    assert (await store.window_total("w")).total == 0


async def test_reserve_rejects_bad_arguments(store: StateStore) -> None:
    ok = ReserveWindow("w", 5, LONG, 1)
    cases: list[tuple[list[ReserveWindow], str, float, str]] = [
        ([ReserveWindow("w", 5, LONG, -1)], "h", LONG, "amount"),
        ([ok, ReserveWindow("w", 9, LONG, 1)], "h", LONG, "twice"),
        ([ReserveWindow("w", 5, 0, 1)], "h", LONG, "ttl"),
        ([ReserveWindow("w", 5, -1, 1)], "h", LONG, "ttl"),
        ([ReserveWindow("w", -1, LONG, 1)], "h", LONG, "limit"),
        ([ok], "h", 0, "hold_ttl"),
        ([ok], "h", -5, "hold_ttl"),
        ([ok], "", LONG, "hold_id"),
    ]
    for windows, hold_id, hold_ttl, match in cases:
        with pytest.raises(ValueError, match=match):
            await store.reserve(windows, hold_id, hold_ttl)
    assert not await store.exists("w")
    assert not await store.release("h")
    with pytest.raises(ValueError, match="hold_id"):
        await store.settle("", {})
    with pytest.raises(ValueError, match="hold_id"):
        await store.release("")


async def test_no_windows_is_allowed_and_holds_nothing(store: StateStore) -> None:
    d = await store.reserve([], "a", LONG)
    assert d.allowed
    assert d.windows == ()
    assert not await store.settle("a", {})


async def test_an_expired_hold_stops_counting(clocked: Clocked) -> None:
    """A replica reserves and dies (no settle): its units come back after ``hold_ttl``."""
    dying, survivor = clocked.replica(), clocked.replica()
    window = [ReserveWindow("w", 2, LONG, 2)]
    assert (await dying.reserve(window, "dead", HOLD)).allowed
    # A live replica's long call keeps its hold alive with ``extend``.
    assert (await survivor.reserve([ReserveWindow("long", 9, LONG, 4)], "kept", HOLD)).allowed
    assert await survivor.extend("kept", LONG)
    refused = await survivor.reserve([ReserveWindow("w", 2, LONG, 1)], "s", HOLD)
    assert not refused.allowed
    assert refused.windows[0].current == 2
    held = await survivor.window_total("w")
    assert (held.total, held.held) == (2, 2)

    await clocked.advance(HOLD_WAIT)
    gone = await survivor.window_total("w")
    assert (gone.total, gone.held) == (0, 0)
    assert not await dying.settle("dead", {"w": 1})
    assert not await dying.release("dead")
    assert not await dying.extend("dead", LONG)
    kept = await survivor.window_total("long")
    assert (kept.total, kept.held) == (4, 4)
    assert await survivor.settle("kept", {"long": 3})
    assert not await survivor.extend("kept", LONG)
    assert await survivor.get("long") == b"3"
    # The next reservation on the window purges the expired hold for good.
    d = await survivor.reserve([ReserveWindow("w", 2, LONG, 1)], "s", LONG)
    assert d.allowed
    assert d.windows[0].current == 1
    assert await survivor.get("w") == b"1"
    # The expired id may be used again.
    assert (await survivor.reserve([ReserveWindow("w", 2, LONG, 1)], "dead", LONG)).allowed


async def test_a_window_that_ends_takes_its_holds_along(clocked: Clocked) -> None:
    store = clocked.replica()
    both = [ReserveWindow("short", None, HOLD, 5), ReserveWindow("long", None, LONG, 5)]
    assert (await store.reserve(both, "a", LONG)).allowed
    assert (await store.reserve([ReserveWindow("short", None, HOLD, 3)], "b", LONG)).allowed

    await clocked.advance(HOLD_WAIT)
    assert not await store.exists("short")
    # The long window is settled; the ended one is not recreated nor charged.
    assert await store.settle("a", {"short": 9, "long": 9})
    assert await store.get("long") == b"9"
    assert not await store.exists("short")
    # A hold whose every window ended has nothing left to settle.
    assert not await store.settle("b", {"short": 1})
    # A new window of the same key starts without the old holds.
    d = await store.reserve([ReserveWindow("short", None, LONG, 1)], "c", LONG)
    assert d.windows[0].current == 1
    assert (await store.window_total("short")).held == 1


async def test_settle_many_settles_each_hold_as_settle_would(harness: Harness) -> None:
    store, elsewhere = harness.state(), harness.state()  # two replicas on one store

    def windows() -> list[ReserveWindow]:
        return [
            ReserveWindow("{p}:req", None, LONG, 1),
            ReserveWindow("{p}:tok", 10_000, LONG, 500),
        ]

    for hold in ("{p}:a", "{p}:b", "{p}:gone"):
        assert (await store.reserve(windows(), hold, LONG)).allowed
    assert (await elsewhere.reserve(windows(), "{p}:far", LONG)).allowed
    assert (await store.reserve([ReserveWindow("{q}:tok", None, LONG, 70)], "{q}:c", LONG)).allowed
    assert await store.release("{p}:gone")
    results = await store.settle_many(
        [
            ("{p}:a", {"{p}:tok": 100}),
            ("{p}:b", {}),  # keeps its reserved units
            ("{p}:gone", {"{p}:tok": 1}),
            ("{p}:far", {"{p}:tok": 30}),  # reserved by the other replica
            ("{q}:c", {"{q}:tok": 7}),  # another hash tag
            ("{p}:never", {}),
        ]
    )
    assert results == [True, True, False, True, True, False]
    assert (await store.window_total("{p}:tok")).total == 100 + 500 + 30
    assert (await store.window_total("{p}:tok")).held == 0
    assert (await store.window_total("{p}:req")).total == 3
    assert (await store.window_total("{q}:tok")).total == 7
    assert await store.settle_many([("{p}:a", {})]) == [False]  # settled once
    with pytest.raises(ValueError, match="at least 0"):
        await store.settle_many([("{p}:x", {"{p}:tok": -1})])
    assert await store.settle_many([]) == []
