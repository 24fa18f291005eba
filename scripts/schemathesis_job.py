"""Fuzz every documented operation of a live ``arona serve`` with schemathesis.

The CI job (``make schemathesis``, called by ``.ci/run``): a database of its own on
PostgreSQL, Redis, one real server, and a tenant seeded through the API (a user, a
project, an API key, a runtime token, a backend on a fake upstream, a model profile),
so operations reach their handlers instead of stopping at "not found". Each group of
operations is fuzzed with the credential it takes (the admin token, the project's API
key, the runtime token), with the checks ``not_a_server_error``,
``status_code_conformance`` and ``response_schema_conformance``. Any finding fails the
job; the run is bounded (``--max-examples`` per operation, ``--max-time`` per group).

    python scripts/schemathesis_job.py [--max-examples N] [--max-time SECONDS]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import asyncpg
import httpx

from app.db.migrate import upgrade
from app.fakes.openai_upstream import FakeOpenAI
from app.fakes.serve import serve_asgi
from app.lib.ports import free_port
from app.lib.settings import load_settings
from app.lib.vault import generate_key_spec

ROOT = Path(__file__).resolve().parents[1]
CONFIG = Path(__file__).resolve().parent / "schemathesis.toml"
BIN = Path(sys.executable).parent
PG_ADMIN_DSN = os.environ.get("ARONA_TEST_PG_DSN", "postgresql://postgres@127.0.0.1:5432/postgres")
REDIS_URL = os.environ.get("ARONA_TEST_REDIS_URL", "redis://127.0.0.1:6379/15")
ADMIN_TOKEN = "fuzz-admin-" + uuid.uuid4().hex + uuid.uuid4().hex
PASSWORD = "fuzz password 123"  # noqa: S105 (a throwaway account on a throwaway database)
CHECKS = "not_a_server_error,status_code_conformance,response_schema_conformance"


@dataclass
class Tenant:
    user_token: str
    project_id: str
    api_key: str
    runtime_token: str


@dataclass
class Group:
    """Operations fuzzed with one credential."""

    name: str
    header: str
    include: str | None
    """A regular expression of the paths fuzzed (None: all)."""
    exclude: str | None


def _pg_url(name: str) -> str:
    base = PG_ADMIN_DSN.rsplit("/", 1)[0]
    return f"{base}/{name}".replace("postgresql://", "postgresql+asyncpg://", 1)


@contextlib.asynccontextmanager
async def database() -> AsyncIterator[str]:
    name = f"arona_fuzz_{uuid.uuid4().hex[:10]}"
    conn = await asyncpg.connect(PG_ADMIN_DSN)
    try:
        await conn.execute(f'CREATE DATABASE "{name}"')
    finally:
        await conn.close()
    url = _pg_url(name)
    try:
        await asyncio.to_thread(
            upgrade,
            load_settings(
                {},
                database_url=url,
                jwt_secret="x" * 40,
                vault_keys=load_settings({"ARONA_VAULT_KEYS": generate_key_spec("k1")}).vault_keys,
            ),
        )
        yield url
    finally:
        conn = await asyncpg.connect(PG_ADMIN_DSN)
        try:
            await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        finally:
            await conn.close()


@contextlib.contextmanager
def server(database_url: str, workdir: Path) -> Iterator[str]:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("ARONA_")}
    env.update(
        {
            "ARONA_DATABASE_URL": database_url,
            "ARONA_REDIS_URL": REDIS_URL,
            "ARONA_REDIS_PREFIX": f"fuzz:{uuid.uuid4().hex}:",
            "ARONA_JWT_SECRET": "fuzz-secret-" + uuid.uuid4().hex * 2,
            "ARONA_VAULT_KEYS": generate_key_spec("k1"),
            "ARONA_ADMIN_TOKEN": ADMIN_TOKEN,
            "ARONA_REGISTRATION_OPEN": "true",
            "ARONA_CUSTOM_LLM_ALLOW_PRIVATE": "true",
            "ARONA_LOG_LEVEL": "ERROR",
            "ARONA_LOGIN_MAX_ATTEMPTS": "1000000",
            "ARONA_DATA_DIR": str(workdir / "data"),
        }
    )
    log = (workdir / "server.log").open("wb")
    process = subprocess.Popen(  # noqa: S603 (our own executable, fixed arguments)
        [str(BIN / "arona"), "serve", "--port", str(port)],
        env=env,
        cwd=workdir,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise RuntimeError((workdir / "server.log").read_text())
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{url}/readyz", timeout=2).status_code == 200:
                    break
            time.sleep(0.2)
        else:
            raise RuntimeError("arona serve did not become ready in 60 s")
        yield url
    finally:
        process.terminate()
        try:
            process.wait(timeout=40)
        except subprocess.TimeoutExpired:
            process.kill()
        log.close()


async def seed_platform(url: str, upstream: str) -> None:
    """A backend on the fake upstream and a model profile over it, so routing and the
    runtime reach a real (fake) model."""
    admin = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    async with httpx.AsyncClient(base_url=url, timeout=30) as http:
        response = await http.post(
            "/api/admin/backends",
            json={"name": "fuzz-upstream", "type": "external", "url": upstream},
            headers=admin,
        )
        response.raise_for_status()
        response = await http.post(
            "/api/admin/model-profiles",
            json={
                "id": "fuzz-profile",
                "name": "Fuzz",
                "baseModel": "gpt-4o-mini",
                "contextWindowTokens": 8192,
                "maxOutputTokens": 256,
            },
            headers=admin,
        )
        response.raise_for_status()


async def new_tenant(url: str) -> Tenant:
    """A user, their project, an API key and a runtime token. Each group gets its own:
    stateful fuzzing deletes what it finds (a project, a key), or logs the user out."""
    async with httpx.AsyncClient(base_url=url, timeout=30) as http:
        email = f"fuzz-{uuid.uuid4().hex[:8]}@example.com"
        account = {"email": email, "password": PASSWORD}
        response = await http.post("/api/auth/register", json=account)
        response.raise_for_status()
        tokens = (await http.post("/api/auth/login", json=account)).json()
        user = {"Authorization": f"Bearer {tokens['accessToken']}"}
        slug = f"fuzz-{uuid.uuid4().hex[:8]}"
        project = (
            await http.post("/api/projects", json={"name": "Fuzz", "slug": slug}, headers=user)
        ).json()
        base = f"/api/projects/{project['id']}"
        key = (await http.post(f"{base}/api-keys", json={"name": "fuzz"}, headers=user)).json()
        runtime = (
            await http.post(f"{base}/runtime-tokens", json={"name": "fuzz"}, headers=user)
        ).json()
        return Tenant(tokens["accessToken"], project["id"], key["key"], runtime["token"])


GROUPS: list[tuple[str, str | None, str | None, Callable[[Tenant], str]]] = [
    ("runtime (runtime token)", "^/api/runtime/", None, lambda t: t.runtime_token),
    ("gateway (project API key)", "^/v1/", None, lambda t: t.api_key),
    ("auth (user token)", "^/api/auth/", None, lambda t: t.user_token),
    # Last: the platform admin may delete backends and profiles the others use.
    (
        "admin and projects (admin token)",
        None,
        "^/(api/runtime|v1|api/auth)/",
        lambda _: ADMIN_TOKEN,
    ),
]
"""(name, paths fuzzed, paths left out, the credential), in the order they run."""


def fuzz(url: str, group: Group, args: argparse.Namespace, report_dir: Path) -> int:
    command = [
        str(BIN / "schemathesis"),
        "--config-file",
        str(CONFIG),
        "run",
        f"{url}/schema/openapi.json",
        "--checks",
        CHECKS,
        "--max-examples",
        str(args.max_examples),
        "--max-time",
        str(args.max_time),
        "--seed",
        str(args.seed),
        "--header",
        group.header,
        # One worker: with two, Hypothesis describes strategies in two threads at
        # once, and CPython 3.11's ast module shares its recursion counter between
        # threads (gh-106905), so a run can fail with "AST constructor recursion
        # depth mismatch" while the server is fine (a CI run failed on exactly that).
        "--workers",
        "1",
        "--request-timeout",
        "30",
        "--suppress-health-check",
        "all",
        "--report",
        "junit",
        "--report-dir",
        str(report_dir),
    ]
    if group.include:
        command += ["--include-path-regex", group.include]
    if group.exclude:
        command += ["--exclude-path-regex", group.exclude]
    print(f"\n== schemathesis: {group.name}", flush=True)
    return subprocess.call(command, cwd=ROOT)  # noqa: S603 (fixed arguments)


async def main(args: argparse.Namespace) -> int:
    fake = FakeOpenAI("fuzz-upstream", models=["gpt-4o-mini", "text-embedding-3-small"])
    with tempfile.TemporaryDirectory(prefix="arona-fuzz-") as tmp:
        workdir = Path(tmp)
        async with database() as database_url, serve_asgi(fake) as upstream:
            with server(database_url, workdir) as url:
                await seed_platform(url, upstream)
                failed: list[str] = []
                for number, (name, include, exclude, credential) in enumerate(GROUPS):
                    token = credential(await new_tenant(url))
                    group = Group(name, f"Authorization: Bearer {token}", include, exclude)
                    reports = workdir / "reports" / str(number)
                    code = await asyncio.to_thread(fuzz, url, group, args, reports)
                    if code != 0:
                        failed.append(group.name)
                log = (workdir / "server.log").read_text(errors="replace")
        if failed:
            print(f"\nschemathesis found problems in: {', '.join(failed)}")
            print("----- server log -----\n" + log[-20_000:])
            return 1
    print("\nschemathesis: no findings")
    return 0


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--max-examples", type=int, default=25)
    parser.add_argument("--max-time", type=int, default=120, help="seconds per group")
    parser.add_argument("--seed", type=int, default=20261201)
    return parser.parse_args()


if __name__ == "__main__":
    sys.exit(asyncio.run(main(parse_args())))
