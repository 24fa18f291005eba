"""Serve an app on a real loopback port for tests that need truly concurrent requests.

``AsyncTestClient`` runs each request to completion through a blocking portal, so
``asyncio.gather`` over it never overlaps two requests. Races (two refreshes of one
token, two first registrations) need a real server: uvicorn on an ephemeral port,
in the test's own event loop, driven by a plain ``httpx.AsyncClient``.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import cast

import httpx
from litestar import Litestar

from app.fakes.asgi_io import ASGIApp
from app.fakes.serve import serve_asgi
from app.server.resources import Resources


@contextlib.asynccontextmanager
async def live_server(app: Litestar, port: int = 0) -> AsyncIterator[str]:
    """Run ``app`` (lifespan included) until the block exits; yields its base URL."""
    # Litestar types its scopes and events more narrowly than the plain ASGI callable.
    async with serve_asgi(cast("ASGIApp", app), port=port, lifespan=True) as url:
        yield url


@dataclass
class LiveApp:
    """An app served on a loopback port, with a client for it."""

    url: str
    app: Litestar
    http: httpx.AsyncClient

    @property
    def resources(self) -> Resources:
        resources: Resources = self.app.state.resources
        return resources
