"""What the ``arona`` commands share: settings, start-up checks and serving."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import socket
import sys
from dataclasses import replace
from typing import TYPE_CHECKING

import click
import structlog

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


GC_THRESHOLDS = (10_000, 20, 100)
"""Young-generation collections every 10k allocations instead of 700: a relayed call
allocates hundreds of short-lived objects, so the default collects several times per
request. 10k rather than 50k bounds the rare pass that does run (10-14 ms measured,
none over 20 ms) at no measurable CPU cost; ``make bench-gc``, docs/performance.md."""


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

    with reserve_port(settings.host, settings.port, "Arona") as sock:
        bound = replace(settings, port=int(sock.getsockname()[1]))
        server = uvicorn.Server(uvicorn_config(bound))  # configures logging
        # uvicorn names the address only when it binds the socket itself.
        structlog.get_logger().info("serving", url=f"http://{_url_host(bound)}:{bound.port}")
        tune_gc()
        try:
            server.run(sockets=[sock])
        except KeyboardInterrupt:
            # uvicorn has drained and re-raised the Ctrl-C it captured: exit as a shell
            # expects of an interrupted command (130), without click's "Aborted!".
            sys.exit(130)


def _url_host(settings: Settings) -> str:
    return f"[{settings.host}]" if ":" in settings.host else settings.host


def serve_with_fakes(
    settings: Settings,
    sock: socket.socket,
    fakes: list[tuple[FakeUpstream, socket.socket]],
    engine: tuple[EchoEngine, socket.socket],
) -> None:
    """Serve Arona on ``sock``, the bundled fake upstreams and the reference engine on
    theirs, in one process and one event loop."""
    check_ready_to_serve(settings)
    check_seed_file(settings)
    import uvicorn

    from app.fakes.serve import serve_asgi

    async def run() -> None:
        async with contextlib.AsyncExitStack() as stack:
            for fake, fake_sock in fakes:
                await stack.enter_async_context(serve_asgi(fake, sock=fake_sock))
            echo, engine_sock = engine
            await echo.start(sock=engine_sock)
            stack.push_async_callback(echo.stop)
            server = uvicorn.Server(uvicorn_config(settings))
            tune_gc()
            await server.serve(sockets=[sock])

    asyncio.run(run())


def reserve_port(host: str, port: int, purpose: str) -> socket.socket:
    """A socket bound to ``(host, port)`` (0: a free port), held from now on so that
    nothing else takes the port while the app starts (uvicorn would bind only after
    the app's start-up, which opens connections of its own on ephemeral ports)."""
    from app.lib.ports import bind_tcp

    try:
        return bind_tcp(host, port)
    except OSError as exc:
        reason = exc.strerror or str(exc)
        raise click.ClickException(
            f"cannot listen on {host}:{port} for {purpose}: {reason}"
        ) from exc
