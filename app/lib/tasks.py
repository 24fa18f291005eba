"""Supervised background loops: a crash is logged and the loop restarts."""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Awaitable, Callable

import structlog

logger = structlog.get_logger()


REPEAT_LOG_EVERY = 60
"""While a loop keeps failing (Redis down: every subscriber fails each retry), log the
first failure and then every 60th, not one line per task per second."""
HEALTHY_RUN_SECONDS = 10.0
"""A run that lasted this long before failing starts a new failure streak."""


async def supervise(
    name: str, body: Callable[[], Awaitable[None]], retry_delay: float = 1.0
) -> None:
    """Run ``body`` until cancelled, restarting it after failures."""
    loop = asyncio.get_running_loop()
    streak = 0
    while True:
        started = loop.time()
        try:
            await body()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            streak = 1 if loop.time() - started >= HEALTHY_RUN_SECONDS else streak + 1
            if streak == 1 or streak % REPEAT_LOG_EVERY == 0:
                logger.warning(
                    "background task failed; restarting",
                    task=name,
                    error=repr(exc),
                    failures_in_a_row=streak,
                )
        await asyncio.sleep(retry_delay)


async def every(seconds: float, body: Callable[[], Awaitable[object]]) -> None:
    """Call ``body`` every ``seconds`` forever (wrap in ``supervise`` for resilience)."""
    while True:
        await asyncio.sleep(seconds)
        await body()


async def wait_for_stop_signal() -> None:
    """Until SIGINT or SIGTERM: how foreground tools (fakes, the GPU agent) run
    "until stopped"."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):  # not on Windows
            loop.add_signal_handler(sig, stop.set)
    await stop.wait()
