"""``arona demo``: the newcomer's first run, with every bundled fake upstream."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import TYPE_CHECKING

import click

from app.cli.common import cli_settings, free_port, serve_with_fakes
from app.lib.settings import Settings

if TYPE_CHECKING:
    from app.fakes.common import FakeUpstream


@click.command()
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
@click.option(
    "--engine-port",
    type=int,
    default=None,
    help="Port of the reference CEP engine (default: Arona's port + 5; 0 picks a free one).",
)
def demo(
    port: int | None, upstream_port: int | None, pool_port: int | None, engine_port: int | None
) -> None:
    """First run: embedded SQLite + in-memory state, a demo admin, project, API key and
    runtime token, a bundled fake OpenAI-compatible upstream registered as a backend,
    and a pool of three fake vLLM servers seeded from a vLLM backends file."""
    from app.bootstrap import (
        DEMO_BACKEND,
        DEMO_CHAT_MODEL,
        DEMO_EMBEDDING_MODEL,
        DEMO_ENGINE,
        DEMO_ENGINE_EMBEDDING_MODEL,
        DEMO_ENGINE_MODEL,
        DEMO_POOL,
        DEMO_POOL_FILE,
        DEMO_POOL_MODEL,
        ensure_demo,
        load_demo_secrets,
        write_demo_pool_file,
    )
    from app.db.migrate import upgrade
    from app.fakes.engine_echo import EchoEngine
    from app.fakes.openai_upstream import FakeOpenAI
    from app.fakes.vllm_upstream import FakeVllm
    from app.lib.passwords import PasswordHasher
    from app.lib.settings import parse_vault_keys

    base = cli_settings()
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
        member.name: free_port(settings.host) if first_pool_port == 0 else first_pool_port + n
        for n, member in enumerate(DEMO_POOL)
    }
    pool_urls = {name: f"http://{settings.host}:{p}" for name, p in pool_ports.items()}
    write_demo_pool_file(data_dir / DEMO_POOL_FILE, pool_urls)
    engine_port = engine_port if engine_port is not None else settings.port + 5
    engine_port = free_port(settings.host) if engine_port == 0 else engine_port
    engine_url = f"ws://{settings.host}:{engine_port}"
    hasher = PasswordHasher()
    try:
        creds = asyncio.run(
            ensure_demo(settings, hasher, upstream_url=upstream_url, engine_url=engine_url)
        )
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
                f"  CEP engine     {engine_url}  (backend {DEMO_ENGINE}: "
                f"models {DEMO_ENGINE_MODEL}, {DEMO_ENGINE_EMBEDDING_MODEL})",
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
    echo = EchoEngine(
        DEMO_ENGINE, models=(DEMO_ENGINE_MODEL,), embedding_models=(DEMO_ENGINE_EMBEDDING_MODEL,)
    )
    try:
        serve_with_fakes(settings, fakes, (echo, engine_port))
    except KeyboardInterrupt:
        # Ctrl-C is how a newcomer ends the demo: a plain goodbye, exit status 0, rather
        # than click's "Aborted!" and a make error. uvicorn has drained and flushed.
        click.echo(f"\nArona demo stopped. Its data stays in {data_dir}; `make demo` resumes it.")
