"""Serve an ASGI app with uvicorn inside the current event loop, on a loopback port.

Used by test fixtures, ``arona demo`` and benchmarks to run the fakes next to the
code under test. The embedded server leaves logging and signals to the host process,
and its shutdown never waits on a request that is hung on purpose.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import sys
from collections.abc import AsyncIterator, Coroutine, Iterator
from typing import Any, Protocol, runtime_checkable

import uvicorn

from app.fakes.asgi_io import ASGIApp
from app.lib.ports import bind_tcp
from app.lib.tasks import wait_for_stop_signal

__all__ = ["run_in_foreground", "serve_asgi", "wait_for_stop_signal"]

STARTUP_TIMEOUT_SECONDS = 30.0
GRACEFUL_SHUTDOWN_SECONDS = 1
"""Requests still running after this are cancelled (a stream nobody reads, say)."""
SHUTDOWN_TIMEOUT_SECONDS = 5.0


@runtime_checkable
class Releasable(Protocol):
    def release(self) -> None:
        """Answer every request that is being held on purpose."""


class _EmbeddedConfig(uvicorn.Config):
    def configure_logging(self) -> None:
        # uvicorn would reconfigure its global loggers (levels, handlers) for every
        # server; next to another uvicorn server (``arona demo``) that silences it.
        return None


class _EmbeddedServer(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        # Signals belong to the host (pytest, the CLI); one Ctrl-C must stop it all.
        yield


@contextlib.asynccontextmanager
async def serve_asgi(
    app: ASGIApp,
    host: str = "127.0.0.1",
    port: int = 0,
    sock: socket.socket | None = None,
    *,
    lifespan: bool = False,
) -> AsyncIterator[str]:
    """Run ``app`` until the block exits; yields its base URL (``http://host:port``).

    ``sock``, when given, is a socket already bound (see ``bind_tcp``) to serve on
    instead of ``host``/``port``; it is closed when the block exits. ``lifespan``
    runs the app's start-up and shutdown (Arona itself, in tests).
    """
    sock = sock if sock is not None else bind_tcp(host, port)
    bound_port = sock.getsockname()[1]
    config = _EmbeddedConfig(
        app,
        lifespan="on" if lifespan else "off",
        access_log=False,
        log_config=None,
        timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_SECONDS,
    )
    server = _EmbeddedServer(config)
    task = asyncio.create_task(_serve(server, sock))
    try:
        async with asyncio.timeout(STARTUP_TIMEOUT_SECONDS):
            while not server.started:
                if task.done():
                    task.result()  # start-up failed: surface the error
                    raise RuntimeError("the server exited during start-up")
                await asyncio.sleep(0.01)
        yield f"http://{_url_host(host)}:{bound_port}"
    finally:
        await _stop(app, server, task)
        sock.close()


async def _serve(server: uvicorn.Server, sock: socket.socket) -> None:
    try:
        await server.serve(sockets=[sock])
    except SystemExit as exc:
        # uvicorn exits the process when its start-up fails (a lifespan error, say).
        # Raised from a task, SystemExit escapes the event loop and stops the host's
        # loop with it (pytest's: every later test would error); an error stays here.
        raise RuntimeError(f"the server's start-up failed (exit status {exc.code})") from exc


async def _stop(app: Any, server: uvicorn.Server, task: asyncio.Task[None]) -> None:
    if isinstance(app, Releasable):
        app.release()
    server.should_exit = True
    done, _ = await asyncio.wait([task], timeout=SHUTDOWN_TIMEOUT_SECONDS)
    if not done:
        server.force_exit = True
        await asyncio.wait([task], timeout=SHUTDOWN_TIMEOUT_SECONDS)
    if task.done() and not task.cancelled():
        task.exception()  # retrieved so a failed shutdown is not reported as unhandled
    elif not task.done():
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def _url_host(host: str) -> str:
    if host in ("0.0.0.0", ""):
        return "127.0.0.1"
    if host == "::":
        return "[::1]"
    return f"[{host}]" if ":" in host else host


def run_in_foreground(main: Coroutine[Any, Any, None]) -> None:
    """``asyncio.run(main)``; a Ctrl-C before the handlers are installed exits 130."""
    try:
        asyncio.run(main)
    except KeyboardInterrupt:
        sys.exit(130)
