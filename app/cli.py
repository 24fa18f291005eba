"""The ``arona`` command line."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import socket
import sys
from dataclasses import replace
from typing import TYPE_CHECKING

import click

from app import __version__
from app.lib.settings import Settings, SettingsError, load_settings

if TYPE_CHECKING:
    import uvicorn

    from app.fakes.common import FakeUpstream


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


def _check_seed_file(settings: Settings) -> None:
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
        # In-flight streams get this long to finish on a stop; an open dashboard stream
        # would otherwise hold the shutdown until it ends on its own.
        timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_SECONDS,
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
    _check_seed_file(settings)
    import uvicorn

    server = uvicorn.Server(_uvicorn_config(settings))
    _tune_gc()
    server.run()


def _serve_with_fakes(settings: Settings, fakes: list[tuple[FakeUpstream, int]]) -> None:
    """Serve Arona and the bundled fake upstreams in one process and one event loop."""
    _check_ready_to_serve(settings)
    _check_seed_file(settings)
    import uvicorn

    from app.fakes.serve import serve_asgi

    async def run() -> None:
        async with contextlib.AsyncExitStack() as stack:
            for fake, port in fakes:
                await stack.enter_async_context(serve_asgi(fake, host=settings.host, port=port))
            server = uvicorn.Server(_uvicorn_config(settings))
            _tune_gc()
            await server.serve()

    asyncio.run(run())


def _free_port(host: str) -> int:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


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
@click.option(
    "--pool-port",
    type=int,
    default=None,
    help="First of the three ports of the fake vLLM pool (default: Arona's port + 2; "
    "0 picks free ports).",
)
def demo(port: int | None, upstream_port: int | None, pool_port: int | None) -> None:
    """First run: embedded SQLite + in-memory state, a demo admin, project, API key and
    runtime token, a bundled fake OpenAI-compatible upstream registered as a backend,
    and a pool of three fake vLLM servers seeded from a vLLM backends file."""
    from app.bootstrap import (
        DEMO_BACKEND,
        DEMO_CHAT_MODEL,
        DEMO_EMBEDDING_MODEL,
        DEMO_POOL,
        DEMO_POOL_FILE,
        DEMO_POOL_MODEL,
        ensure_demo,
        load_demo_secrets,
        write_demo_pool_file,
    )
    from app.db.migrate import upgrade
    from app.fakes.openai_upstream import FakeOpenAI
    from app.fakes.vllm_upstream import FakeVllm
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
        # The demo pool goes through the operator's path: a seed file read at start-up.
        vllm_backends_file=data_dir / DEMO_POOL_FILE,
    )
    upgrade(settings)
    upstream_port = upstream_port if upstream_port is not None else settings.port + 1
    upstream_url = f"http://{settings.host}:{upstream_port}"
    first_pool_port = pool_port if pool_port is not None else settings.port + 2
    if not 0 <= first_pool_port <= 65536 - len(DEMO_POOL):
        raise click.ClickException(f"--pool-port {first_pool_port} leaves no room for the pool")
    pool_ports = {
        member.name: _free_port(settings.host) if first_pool_port == 0 else first_pool_port + n
        for n, member in enumerate(DEMO_POOL)
    }
    pool_urls = {name: f"http://{settings.host}:{p}" for name, p in pool_ports.items()}
    write_demo_pool_file(data_dir / DEMO_POOL_FILE, pool_urls)
    hasher = PasswordHasher()
    try:
        creds = asyncio.run(ensure_demo(settings, hasher, upstream_url=upstream_url))
    finally:
        hasher.close()
    url = f"http://{settings.host}:{settings.port}"
    auth = f"-H 'Authorization: Bearer {creds.api_key}'"
    pool_lines = [
        f"    {member.name:<8} {pool_urls[member.name]}  tags {', '.join(member.tags)}"
        for member in DEMO_POOL
    ]
    click.echo(
        "\n".join(
            [
                "",
                "Arona demo (embedded SQLite + in-memory state)",
                f"  console        {url}/  (sign in with the admin credentials below)",
                f"  API            {url}/api  (docs: {url}/schema)",
                f"  health         {url}/healthz",
                f"  admin login    {creds.admin_email} / {creds.admin_password}",
                f"  demo project   {creds.project_id}",
                f"  demo API key   {creds.api_key}",
                f"  runtime token  {creds.runtime_token}",
                f"  demo upstream  {upstream_url}  (backend {DEMO_BACKEND}: "
                f"models {DEMO_CHAT_MODEL}, {DEMO_EMBEDDING_MODEL})",
                f"  vLLM pool      model {DEMO_POOL_MODEL}, seeded from "
                f"{data_dir / DEMO_POOL_FILE}; profiles llm, llm-smart (tag smart)",
                *pool_lines,
                "",
                f"  try: curl {auth} -H 'Content-Type: application/json' "
                f"{url}/v1/chat/completions "
                f'-d \'{{"model":"{DEMO_CHAT_MODEL}","messages":'
                f'[{{"role":"user","content":"Hello"}}]}}\'',
                f"       OPENAI_BASE_URL={url}/v1 OPENAI_API_KEY={creds.api_key} python ...",
                f"       curl -H 'Authorization: Bearer {creds.runtime_token}' "
                f"{url}/api/runtime/me",
                "",
            ]
        )
    )
    fakes: list[tuple[FakeUpstream, int]] = [
        (
            FakeOpenAI(DEMO_BACKEND, models=(DEMO_CHAT_MODEL, DEMO_EMBEDDING_MODEL), chunks=8),
            upstream_port,
        )
    ]
    for member in DEMO_POOL:
        fake = FakeVllm(member.name, models=(DEMO_POOL_MODEL,), chunks=8)
        fake.running, fake.waiting = member.running, member.waiting
        fake.kv_cache, fake.engines = member.kv_cache, member.engines
        fakes.append((fake, pool_ports[member.name]))
    _serve_with_fakes(settings, fakes)


@main.group()
def vault() -> None:
    """Vault master keys (ARONA_VAULT_KEYS)."""


@vault.command("rotate")
@click.option(
    "--batch-size",
    type=click.IntRange(min=1),
    default=200,
    show_default=True,
    help="Rows read and written per transaction.",
)
@click.option("--dry-run", is_flag=True, help="Decrypt and count, write nothing.")
def vault_rotate(batch_size: int, dry_run: bool) -> None:
    """Re-encrypt every stored secret under the newest key of ARONA_VAULT_KEYS.

    Safe while servers keep serving: rows are rewritten one compare-and-set at a time
    and a value a server changed meanwhile is never overwritten. Servers must list the
    newest key first before the run. Exits non-zero if any value could not be
    decrypted (the table, row id and key id are printed, never a value); once a run
    reports no failures, older keys can be removed from ARONA_VAULT_KEYS.
    """
    from app.db.config import build_db_config, install_sqlite_pragmas
    from app.domain.secrets.rotation import RotationReport, render_report, rotate_vault
    from app.lib.vault import Vault

    settings = _settings()
    _check_ready_to_serve(replace(settings, jwt_secret=settings.jwt_secret or "x" * 32))
    keyring = Vault(settings.vault_keys)

    async def run() -> RotationReport:
        engine = build_db_config(settings).get_engine()
        install_sqlite_pragmas(engine)
        try:
            return await rotate_vault(engine, keyring, batch_size=batch_size, dry_run=dry_run)
        finally:
            await engine.dispose()

    report = asyncio.run(run())
    for line in render_report(report, keyring.kids):
        click.echo(line)
    if not report.ok:
        raise click.exceptions.Exit(1)


@main.command()
def version() -> None:
    """Print the version."""
    click.echo(__version__)
