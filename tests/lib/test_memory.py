"""``HeapTrimmer``: one trim shortly after a burst of requests, none without a request."""

from __future__ import annotations

import asyncio

from app.lib.memory import HeapTrimmer, _malloc_trim


async def test_a_burst_of_requests_runs_one_trim_after_the_delay() -> None:
    calls: list[int] = []
    trimmer = HeapTrimmer(delay=0.05, trim=lambda: calls.append(1))
    for _ in range(10):
        trimmer.request()
    assert calls == []  # not inside the request that asked: its buffers are still alive
    await asyncio.sleep(0.2)
    assert calls == [1]
    assert trimmer.trims == 1
    trimmer.request()  # a later burst gets a trim of its own
    await asyncio.sleep(0.2)
    assert trimmer.trims == 2


async def test_cancel_drops_a_pending_trim() -> None:
    calls: list[int] = []
    trimmer = HeapTrimmer(delay=0.05, trim=lambda: calls.append(1))
    trimmer.request()
    trimmer.cancel()
    await asyncio.sleep(0.15)
    assert calls == []


async def test_this_machines_c_library_can_trim() -> None:
    # glibc here (and in the container images): the real call exists and runs.
    trim = _malloc_trim()
    assert trim is not None
    trim()
