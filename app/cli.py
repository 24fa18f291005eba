"""The ``arona`` command line."""

from __future__ import annotations

import asyncio
import gc
import sys
from dataclasses import replace
from typing import TYPE_CHECKING

import click

from app import __version__
from app.lib.settings import Settings, SettingsError, load_settings

if TYPE_CHECKING:
    import uvicorn

    from app.fakes.openai_upstream import FakeOpenAI


def _settings(**overrides: object) -> Settings:
    try:
        return load_settings(None, **overrides)
    except SettingsError as exc:
        raise click.ClickException(str(exc)) from exc


def _check_ready_to_serve(settings: Settings) -> None:
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


def _uvicorn_config(settings: Settings) -> uvicorn.Config:
    import uvicorn

    from app.server.app import create_app

    return uvicorn.Config(
        create_app(settings),
        host=settings.host,
        port=settings.port,
        log_config=None,
        access_log=False,
        server_header=False,
        proxy_headers=False,
    )


GC_THRESHOLDS = (50_000, 20, 100)
"""Young-generation collections every 50k allocations instead of 700: a relayed call
allocates hundreds of short-lived objects, so the default collects several times per
request; measured in docs/performance.md."""


def _tune_gc() -> None:
    # What exists now (the app, its routes, ORM metadata, imported modules) lives as
    # long as the process: freeze it out of the collector's sight so full collections
    # stay short instead of pausing every request in flight.
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


def _serve(settings: Settings) -> None:
    _check_ready_to_serve(settings)
    import uvicorn

    server = uvicorn.Server(_uvicorn_config(settings))
    _tune_gc()
    server.run()


def _serve_with_demo_upstream(settings: Settings, upstream: FakeOpenAI, upstream_port: int) -> None:
    """Serve Arona and the bundled fake upstream in one process and one event loop."""
    _check_ready_to_serve(settings)
    import uvicorn

    from app.fakes.serve import serve_asgi

    async def run() -> None:
        async with serve_asgi(upstream, host=settings.host, port=upstream_port):
            server = uvicorn.Server(_uvicorn_config(settings))
            _tune_gc()
            await server.serve()

    asyncio.run(run())


@click.group()
def main() -> None:
    """Arona: a multi-tenant control plane for LLM traffic."""


@main.command()
@click.option("--host", default=None, help="Bind address (default ARONA_HOST or 127.0.0.1).")
@click.option("--port", type=int, default=None, help="Port (default ARONA_PORT or 8420).")
def serve(host: str | None, port: int | None) -> None:
    """Serve the control plane (the database must be migrated first)."""
    overrides: dict[str, object] = {}
    if host is not None:
        overrides["host"] = host
    if port is not None:
        overrides["port"] = port
    _serve(_settings(**overrides))


@main.command()
def migrate() -> None:
    """Apply every database migration (Alembic upgrade head)."""
    from app.db.migrate import head_revision, upgrade

    settings = _settings()
    upgrade(settings)
    click.echo(f"database is at revision {head_revision()}")


@main.command("create-admin")
@click.argument("email")
@click.option("--name", default="", help="Display name.")
@click.option(
    "--password-stdin", is_flag=True, help="Read the password from standard input, not a prompt."
)
def create_admin_command(email: str, name: str, password_stdin: bool) -> None:
    """Create a platform admin (or promote an existing user)."""
    from app.bootstrap import create_admin
    from app.db.config import build_db_config
    from app.lib.passwords import PasswordHasher

    if password_stdin:
        password = sys.stdin.readline().rstrip("\n")
    else:
        password = click.prompt("Password", hide_input=True, confirmation_prompt=True)
    if len(password) < 8:
        raise click.ClickException("the password must be at least 8 characters")
    settings = _settings()
    _check_ready_to_serve(replace(settings, jwt_secret=settings.jwt_secret or "x" * 32))

    async def run() -> tuple[str, bool]:
        db_config = build_db_config(settings)
        hasher = PasswordHasher()
        try:
            user, created = await create_admin(
                db_config, hasher, email=email, password=password, name=name
            )
            return user.email, created
        finally:
            hasher.close()
            await db_config.get_engine().dispose()

    try:
        address, created = asyncio.run(run())
    except Exception as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(f"{'created' if created else 'promoted'} admin {address}")


@main.command()
@click.option("--port", type=int, default=None, help="Port (default 8420).")
@click.option(
    "--upstream-port",
    type=int,
    default=None,
    help="Port of the bundled fake upstream (default: the port after Arona's).",
)
def demo(port: int | None, upstream_port: int | None) -> None:
    """First run: embedded SQLite + in-memory state, a demo admin, project and API key,
    and a bundled fake OpenAI-compatible upstream registered as a backend."""
    from app.bootstrap import (
        DEMO_BACKEND,
        DEMO_CHAT_MODEL,
        DEMO_EMBEDDING_MODEL,
        ensure_demo,
        load_demo_secrets,
    )
    from app.db.migrate import upgrade
    from app.fakes.openai_upstream import FakeOpenAI
    from app.lib.passwords import PasswordHasher
    from app.lib.settings import parse_vault_keys

    base = _settings()
    data_dir = base.data_dir
    stored = load_demo_secrets(data_dir)
    database_url = base.database_url
    if database_url == Settings().database_url:
        database_url = f"sqlite+aiosqlite:///{(data_dir / 'arona.db').resolve()}"
    settings = replace(
        base,
        demo=True,
        database_url=database_url,
        jwt_secret=base.jwt_secret or stored["jwt_secret"],
        vault_keys=base.vault_keys or parse_vault_keys(stored["vault_keys"]),
        host=base.host,
        port=port if port is not None else base.port,
    )
    upgrade(settings)
    upstream_port = upstream_port if upstream_port is not None else settings.port + 1
    upstream_url = f"http://{settings.host}:{upstream_port}"
    hasher = PasswordHasher()
    try:
        creds = asyncio.run(ensure_demo(settings, hasher, upstream_url=upstream_url))
    finally:
        hasher.close()
    url = f"http://{settings.host}:{settings.port}"
    auth = f"-H 'Authorization: Bearer {creds.api_key}'"
    click.echo(
        "\n".join(
            [
                "",
                "Arona demo (embedded SQLite + in-memory state)",
                f"  API            {url}/api  (docs: {url}/api/docs)",
                f"  health         {url}/healthz",
                f"  admin login    {creds.admin_email} / {creds.admin_password}",
                f"  demo project   {creds.project_id}",
                f"  demo API key   {creds.api_key}",
                f"  demo upstream  {upstream_url}  (backend {DEMO_BACKEND}: "
                f"models {DEMO_CHAT_MODEL}, {DEMO_EMBEDDING_MODEL})",
                "",
                f"  try: curl {auth} -H 'Content-Type: application/json' "
                f"{url}/v1/chat/completions "
                f'-d \'{{"model":"{DEMO_CHAT_MODEL}","messages":'
                f'[{{"role":"user","content":"Hello"}}]}}\'',
                f"       OPENAI_BASE_URL={url}/v1 OPENAI_API_KEY={creds.api_key} python ...",
                "",
            ]
        )
    )
    upstream = FakeOpenAI(DEMO_BACKEND, models=(DEMO_CHAT_MODEL, DEMO_EMBEDDING_MODEL), chunks=8)
    _serve_with_demo_upstream(settings, upstream, upstream_port)


@main.command()
def version() -> None:
    """Print the version."""
    click.echo(__version__)
