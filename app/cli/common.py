"""What the ``arona`` commands share: settings, start-up checks and serving."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import socket
from typing import TYPE_CHECKING

import click

from app.lib.settings import Settings, SettingsError, load_settings

if TYPE_CHECKING:
    import uvicorn

    from app.fakes.common import FakeUpstream
    from app.fakes.engine_echo import EchoEngine


def cli_settings(**overrides: object) -> Settings:
    try:
        return load_settings(None, **overrides)
    except SettingsError as exc:
        raise click.ClickException(str(exc)) from exc


def check_ready_to_serve(settings: Settings) -> None:
    # Validate before importing the database stack: a bad setting should fail fast.
    try:
        settings.validate()
    except SettingsError as exc:
        raise click.ClickException(str(exc)) from exc

    from app.db.config import build_db_config
    from app.db.migrate import DatabaseNotMigratedError, ensure_migrated

    async def check() -> None:
        engine = build_db_config(settings).get_engine()
        try:
            await ensure_migrated(engine)
        finally:
            await engine.dispose()

    try:
        asyncio.run(check())
    except DatabaseNotMigratedError as exc:
        raise click.ClickException(str(exc)) from exc


def check_seed_file(settings: Settings) -> None:
    """A broken vLLM backends file stops start-up here, with a plain message (the
    server's start-up would refuse it too, in the middle of its log)."""
    from app.domain.backends.seeding import SeedingError, load_seed_file, seed_file

    try:
        path = seed_file(settings)
        if path is not None:
            load_seed_file(path)
    except SeedingError as exc:
        raise click.ClickException(str(exc)) from exc


GRACEFUL_SHUTDOWN_SECONDS = 30


def uvicorn_config(settings: Settings) -> uvicorn.Config:
    import uvicorn

    from app.server.app import create_app

    return uvicorn.Config(
        create_app(settings),
        host=settings.host,
        port=settings.port,
        log_config=None,
        access_log=False,
        server_header=False,
        # Behind a load balancer the client address (login rate limits, the agent's
        # address) and the scheme come from the proxy's headers, trusted only from the
        # proxies listed in ARONA_FORWARDED_ALLOW_IPS.
        proxy_headers=settings.forwarded_allow_ips is not None,
        forwarded_allow_ips=settings.forwarded_allow_ips or "",
        # In-flight streams get this long to finish on a stop; an open dashboard stream
        # would otherwise hold the shutdown until it ends on its own.
        timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_SECONDS,
    )


GC_THRESHOLDS = (50_000, 20, 100)
"""Young-generation collections every 50k allocations instead of 700: a relayed call
allocates hundreds of short-lived objects, so the default collects several times per
request; measured in docs/performance.md."""


def tune_gc() -> None:
    # What exists now (the app, its routes, ORM metadata, imported modules) lives as
    # long as the process: freeze it out of the collector's sight so full collections
    # stay short instead of pausing every request in flight.
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


def serve_app(settings: Settings) -> None:
    check_ready_to_serve(settings)
    check_seed_file(settings)
    import uvicorn

    server = uvicorn.Server(uvicorn_config(settings))
    tune_gc()
    server.run()


def serve_with_fakes(
    settings: Settings, fakes: list[tuple[FakeUpstream, int]], engine: tuple[EchoEngine, int]
) -> None:
    """Serve Arona, the bundled fake upstreams and the reference engine in one process
    and one event loop."""
    check_ready_to_serve(settings)
    check_seed_file(settings)
    import uvicorn

    from app.fakes.serve import serve_asgi

    async def run() -> None:
        async with contextlib.AsyncExitStack() as stack:
            for fake, port in fakes:
                await stack.enter_async_context(serve_asgi(fake, host=settings.host, port=port))
            echo, engine_port = engine
            await echo.start(settings.host, engine_port)
            stack.push_async_callback(echo.stop)
            server = uvicorn.Server(uvicorn_config(settings))
            tune_gc()
            await server.serve()

    asyncio.run(run())


def free_port(host: str) -> int:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])
