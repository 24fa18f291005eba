"""Supervised loops restart after failures and do not flood the log while failing."""

from __future__ import annotations

import asyncio

import pytest
from structlog.testing import capture_logs

from app.lib.tasks import REPEAT_LOG_EVERY, supervise


async def test_a_failing_loop_restarts_and_logs_the_first_failure_then_every_nth() -> None:
    runs = 0
    done = asyncio.Event()

    async def body() -> None:
        nonlocal runs
        runs += 1
        if runs == 2 * REPEAT_LOG_EVERY + 5:
            done.set()
            await asyncio.Event().wait()  # recovered: runs until cancelled
        raise ConnectionError("redis is down")

    with capture_logs() as logs:
        task = asyncio.create_task(supervise("sync", body, retry_delay=0))
        async with asyncio.timeout(5):
            await done.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    failures = [e for e in logs if e["event"] == "background task failed; restarting"]
    assert [e["failures_in_a_row"] for e in failures] == [1, REPEAT_LOG_EVERY, 2 * REPEAT_LOG_EVERY]
    assert all(e["task"] == "sync" for e in failures)
    assert "ConnectionError" in failures[0]["error"]


async def test_cancelling_stops_the_loop_without_a_restart() -> None:
    started = asyncio.Event()

    async def body() -> None:
        started.set()
        await asyncio.Event().wait()

    with capture_logs() as logs:
        task = asyncio.create_task(supervise("idle", body))
        await started.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    assert logs == []
