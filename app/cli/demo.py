"""``arona demo``: the newcomer's first run, with every bundled fake upstream."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import click

from app.cli.common import cli_settings, reserve_port, serve_with_fakes
from app.lib.settings import Settings

if TYPE_CHECKING:
    from app.cli.bootstrap import DemoCredentials
    from app.fakes.common import FakeUpstream

PORT = click.IntRange(0, 65535)


@dataclass(frozen=True, slots=True)
class DemoSockets:
    """Every port the demo serves on, bound before anything else runs: a port picked
    free (0) stays the demo's, and a taken one stops the demo before it touches its
    data."""

    arona: socket.socket
    upstream: socket.socket
    pool: dict[str, socket.socket]
    engine: socket.socket


def _beside(port: int, offset: int) -> int:
    """The default port of a bundled server: next to Arona's, or free when Arona's is."""
    return 0 if port == 0 else port + offset


def _port_of(sock: socket.socket) -> int:
    return int(sock.getsockname()[1])


def _hold_ports(
    held: contextlib.ExitStack,
    host: str,
    port: int,
    upstream_port: int | None,
    pool_port: int | None,
    engine_port: int | None,
) -> DemoSockets:
    from app.cli.bootstrap import DEMO_POOL

    first_pool_port = pool_port if pool_port is not None else _beside(port, 2)
    if first_pool_port > 65536 - len(DEMO_POOL):
        raise click.ClickException(f"--pool-port {first_pool_port} leaves no room for the pool")

    def hold(wanted: int, purpose: str) -> socket.socket:
        sock = reserve_port(host, wanted, purpose)
        held.callback(sock.close)
        return sock

    return DemoSockets(
        arona=hold(port, "Arona"),
        upstream=hold(
            upstream_port if upstream_port is not None else _beside(port, 1), "the demo upstream"
        ),
        pool={
            member.name: hold(
                0 if first_pool_port == 0 else first_pool_port + n, f"vLLM pool {member.name}"
            )
            for n, member in enumerate(DEMO_POOL)
        },
        engine=hold(engine_port if engine_port is not None else _beside(port, 5), "the CEP engine"),
    )


def _banner(
    settings: Settings,
    creds: DemoCredentials,
    upstream_url: str,
    pool_urls: dict[str, str],
    engine_url: str,
) -> str:
    from app.cli import bootstrap

    url = f"http://{settings.host}:{settings.port}"
    auth = f"-H 'Authorization: Bearer {creds.api_key}'"
    pool_lines = [
        f"    {member.name:<8} {pool_urls[member.name]}  tags {', '.join(member.tags)}"
        for member in bootstrap.DEMO_POOL
    ]
    return "\n".join(
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
            f"  demo upstream  {upstream_url}  (backend {bootstrap.DEMO_BACKEND}: "
            f"models {bootstrap.DEMO_CHAT_MODEL}, {bootstrap.DEMO_EMBEDDING_MODEL})",
            f"  vLLM pool      model {bootstrap.DEMO_POOL_MODEL}, seeded from "
            f"{settings.data_dir / bootstrap.DEMO_POOL_FILE}; profiles llm, llm-smart (tag smart)",
            *pool_lines,
            f"  CEP engine     {engine_url}  (backend {bootstrap.DEMO_ENGINE}: "
            f"models {bootstrap.DEMO_ENGINE_MODEL}, {bootstrap.DEMO_ENGINE_EMBEDDING_MODEL})",
            "",
            f"  try: curl {auth} -H 'Content-Type: application/json' "
            f"{url}/v1/chat/completions "
            f'-d \'{{"model":"{bootstrap.DEMO_CHAT_MODEL}","messages":'
            f'[{{"role":"user","content":"Hello"}}]}}\'',
            f"       OPENAI_BASE_URL={url}/v1 OPENAI_API_KEY={creds.api_key} python ...",
            f"       curl -H 'Authorization: Bearer {creds.runtime_token}' {url}/api/runtime/me",
            "",
        ]
    )


def _serve(settings: Settings, sockets: DemoSockets) -> None:
    from app.cli import bootstrap
    from app.fakes.engine_echo import EchoEngine
    from app.fakes.openai_upstream import FakeOpenAI
    from app.fakes.vllm_upstream import FakeVllm

    fakes: list[tuple[FakeUpstream, socket.socket]] = [
        (
            FakeOpenAI(
                bootstrap.DEMO_BACKEND,
                models=(bootstrap.DEMO_CHAT_MODEL, bootstrap.DEMO_EMBEDDING_MODEL),
                chunks=8,
            ),
            sockets.upstream,
        )
    ]
    for member in bootstrap.DEMO_POOL:
        fake = FakeVllm(member.name, models=(bootstrap.DEMO_POOL_MODEL,), chunks=8)
        fake.running, fake.waiting = member.running, member.waiting
        fake.kv_cache, fake.engines = member.kv_cache, member.engines
        fakes.append((fake, sockets.pool[member.name]))
    echo = EchoEngine(
        bootstrap.DEMO_ENGINE,
        models=(bootstrap.DEMO_ENGINE_MODEL,),
        embedding_models=(bootstrap.DEMO_ENGINE_EMBEDDING_MODEL,),
    )
    serve_with_fakes(settings, sockets.arona, fakes, (echo, sockets.engine))


@click.command()
@click.option("--port", type=PORT, default=None, help="Port (default 8420; 0 picks a free one).")
@click.option(
    "--upstream-port",
    type=PORT,
    default=None,
    help="Port of the bundled fake upstream (default: the port after Arona's).",
)
@click.option(
    "--pool-port",
    type=PORT,
    default=None,
    help="First of the three ports of the fake vLLM pool (default: Arona's port + 2; "
    "0 picks free ports).",
)
@click.option(
    "--engine-port",
    type=PORT,
    default=None,
    help="Port of the reference CEP engine (default: Arona's port + 5; 0 picks a free one).",
)
def demo(
    port: int | None, upstream_port: int | None, pool_port: int | None, engine_port: int | None
) -> None:
    """First run: embedded SQLite + in-memory state, a demo admin, project, API key and
    runtime token, a bundled fake OpenAI-compatible upstream registered as a backend,
    and a pool of three fake vLLM servers seeded from a vLLM backends file.

    With --port 0 every bundled server gets a free port too; the banner shows them."""
    from app.cli.bootstrap import (
        DEMO_POOL_FILE,
        ensure_demo,
        load_demo_secrets,
        write_demo_pool_file,
    )
    from app.db.migrate import upgrade
    from app.lib.passwords import PasswordHasher
    from app.lib.settings import parse_vault_keys

    base = cli_settings()
    data_dir = base.data_dir
    database_url = base.database_url
    if database_url == Settings().database_url:
        database_url = f"sqlite+aiosqlite:///{(data_dir / 'arona.db').resolve()}"
    with contextlib.ExitStack() as held:
        sockets = _hold_ports(
            held,
            base.host,
            port if port is not None else base.port,
            upstream_port,
            pool_port,
            engine_port,
        )
        stored = load_demo_secrets(data_dir)
        settings = replace(
            base,
            demo=True,
            database_url=database_url,
            jwt_secret=base.jwt_secret or stored["jwt_secret"],
            vault_keys=base.vault_keys or parse_vault_keys(stored["vault_keys"]),
            port=_port_of(sockets.arona),
            # The demo pool goes through the operator's path: a seed file read at start-up.
            vllm_backends_file=data_dir / DEMO_POOL_FILE,
        )
        upgrade(settings)
        upstream_url = f"http://{settings.host}:{_port_of(sockets.upstream)}"
        pool_urls = {
            name: f"http://{settings.host}:{_port_of(sock)}" for name, sock in sockets.pool.items()
        }
        write_demo_pool_file(data_dir / DEMO_POOL_FILE, pool_urls)
        engine_url = f"ws://{settings.host}:{_port_of(sockets.engine)}"
        hasher = PasswordHasher()
        try:
            creds = asyncio.run(
                ensure_demo(settings, hasher, upstream_url=upstream_url, engine_url=engine_url)
            )
        finally:
            hasher.close()
        click.echo(_banner(settings, creds, upstream_url, pool_urls, engine_url))
        try:
            _serve(settings, sockets)
        except KeyboardInterrupt:
            # Ctrl-C is how a newcomer ends the demo: a plain goodbye, exit status 0,
            # rather than click's "Aborted!" and a make error. uvicorn has drained.
            click.echo(
                f"\nArona demo stopped. Its data stays in {data_dir}; `make demo` resumes it."
            )
