"""Supervised background loops: a crash is logged and the loop restarts."""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Awaitable, Callable

import structlog

logger = structlog.get_logger()


async def supervise(
    name: str, body: Callable[[], Awaitable[None]], retry_delay: float = 1.0
) -> None:
    """Run ``body`` until cancelled, restarting it after failures."""
    while True:
        try:
            await body()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            logger.warning("background task failed; restarting", task=name, error=repr(exc))
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
