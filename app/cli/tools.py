"""Operator tools: vault key rotation, the reference CEP engine and the GPU agent."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import click

from app.cli.common import check_ready_to_serve, cli_settings

# Arguments pass through to the command's own parser (argparse prints its --help).
PASS_THROUGH = {"ignore_unknown_options": True, "allow_extra_args": True}


@click.command("engine-echo", context_settings=PASS_THROUGH, add_help_option=False)
@click.pass_context
def engine_echo(ctx: click.Context) -> None:
    """Run the reference CEP engine: `arona engine-echo --port N [--token T] ...`."""
    from app.fakes.engine_echo import main as run_engine

    run_engine(list(ctx.args))


@click.command("agent", context_settings=PASS_THROUGH, add_help_option=False)
@click.pass_context
def agent(ctx: click.Context) -> None:
    """Run a GPU agent: `arona agent --panel URL --token T --command TEMPLATE`."""
    from app.agent.__main__ import main as run_agent

    run_agent(list(ctx.args))


@click.group()
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

    settings = cli_settings()
    check_ready_to_serve(replace(settings, jwt_secret=settings.jwt_secret or "x" * 32))
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
