"""Serve an app on a real loopback port for tests that need truly concurrent requests.

``AsyncTestClient`` runs each request to completion through a blocking portal, so
``asyncio.gather`` over it never overlaps two requests. Races (two refreshes of one
token, two first registrations) need a real server: uvicorn on an ephemeral port,
in the test's own event loop, driven by a plain ``httpx.AsyncClient``.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator

import uvicorn
from litestar import Litestar

STARTUP_TIMEOUT_SECONDS = 10.0


@contextlib.asynccontextmanager
async def live_server(app: Litestar) -> AsyncIterator[str]:
    """Run ``app`` (lifespan included) until the block exits; yields its base URL."""
    # IPPROTO_TCP, not 0: asyncio sets TCP_NODELAY only on sockets that say TCP,
    # and without it every small response waits ~40 ms on a delayed ACK.
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(
        app, lifespan="on", log_level="warning", access_log=False, timeout_graceful_shutdown=2
    )
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        async with asyncio.timeout(STARTUP_TIMEOUT_SECONDS):
            while not server.started:
                if task.done():
                    task.result()  # start-up failed: surface the error
                    raise RuntimeError("the test server exited during start-up")
                await asyncio.sleep(0.01)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        with contextlib.suppress(asyncio.CancelledError):
            await task
        sock.close()
