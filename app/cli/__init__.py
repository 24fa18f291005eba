"""The ``arona`` command line."""

from __future__ import annotations

import asyncio
import sys
from dataclasses import replace

import click

from app import __version__
from app.cli.common import check_ready_to_serve, cli_settings, serve_app


@click.group()
def main() -> None:
    """Arona: a multi-tenant control plane for LLM traffic."""


@main.command()
@click.option("--host", default=None, help="Bind address (default ARONA_HOST or 127.0.0.1).")
@click.option(
    "--port",
    type=click.IntRange(0, 65535),
    default=None,
    help="Port (default ARONA_PORT or 8420; 0 picks a free one).",
)
def serve(host: str | None, port: int | None) -> None:
    """Serve the control plane (the database must be migrated first)."""
    overrides: dict[str, object] = {}
    if host is not None:
        overrides["host"] = host
    if port is not None:
        overrides["port"] = port
    serve_app(cli_settings(**overrides))


@main.command()
def migrate() -> None:
    """Apply every database migration (Alembic upgrade head)."""
    from app.db.migrate import head_revision, upgrade

    settings = cli_settings()
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
    from app.cli.bootstrap import create_admin
    from app.db.config import build_db_config
    from app.lib.passwords import PasswordHasher

    if password_stdin:
        password = sys.stdin.readline().rstrip("\n")
    else:
        password = click.prompt("Password", hide_input=True, confirmation_prompt=True)
    if len(password) < 8:
        raise click.ClickException("the password must be at least 8 characters")
    settings = cli_settings()
    check_ready_to_serve(replace(settings, jwt_secret=settings.jwt_secret or "x" * 32))

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
def version() -> None:
    """Print the version."""
    click.echo(__version__)


def _register_commands() -> None:
    from app.cli.demo import demo
    from app.cli.tools import agent, engine_echo, vault

    for command in (demo, engine_echo, agent, vault):
        main.add_command(command)


_register_commands()
