"""Arona as in production: ``arona serve`` on a throwaway PostgreSQL database and Redis.

Setup goes through the public API only (register, login, project, API key, backend),
the way an operator would; ``close()`` drops the database and the Redis keys.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import asyncpg
import httpx
import redis

from app import __version__
from app.lib.ports import free_port
from app.lib.vault import generate_key_spec
from bench.baseline import Baseline
from bench.procs import SUT_CPU, BenchError, Supervisor, run_checked, wait_http
from bench.systems import CHAT_MODEL, EMBED_MODEL, FakeUpstream, System

PG_ADMIN_DSN = "postgresql://postgres@127.0.0.1:5432/postgres"
PG_HOST = "postgres@127.0.0.1:5432"
REDIS_URL = "redis://127.0.0.1:6379/14"
BACKEND_NAME = "bench"
HEALTHY_TIMEOUT_SECONDS = 30.0


def _arona_executable() -> str:
    # The project venv's entry point, next to the interpreter running the harness.
    return str(Path(sys.executable).parent / "arona")


async def _admin_sql(statement: str) -> None:
    connection = await asyncpg.connect(PG_ADMIN_DSN)
    try:
        await connection.execute(statement)
    finally:
        await connection.close()


@dataclass(slots=True)
class AronaDeployment:
    run_id: str
    database: str = field(init=False)
    redis_prefix: str = field(init=False)
    database_created: bool = False

    def __post_init__(self) -> None:
        self.database = f"arona_bench_{self.run_id}"
        self.redis_prefix = f"bench:{self.run_id}:"

    def environment(self, port: int) -> dict[str, str]:
        # Start from a clean slate: ARONA_* of the caller's shell must not leak in.
        env = {k: v for k, v in os.environ.items() if not k.startswith("ARONA_")}
        env.update(
            ARONA_DATABASE_URL=f"postgresql+asyncpg://{PG_HOST}/{self.database}",
            ARONA_REDIS_URL=REDIS_URL,
            ARONA_REDIS_PREFIX=self.redis_prefix,
            ARONA_JWT_SECRET=secrets.token_urlsafe(48),
            ARONA_VAULT_KEYS=generate_key_spec("b1"),
            ARONA_ADMIN_TOKEN=secrets.token_urlsafe(32),
            ARONA_REGISTRATION_OPEN="true",
            ARONA_LOG_LEVEL="WARNING",
            ARONA_PORT=str(port),
        )
        return env

    def create_database(self) -> None:
        try:
            asyncio.run(_admin_sql(f'CREATE DATABASE "{self.database}"'))
        except (OSError, asyncpg.PostgresError) as exc:
            raise BenchError(f"cannot create database on {PG_ADMIN_DSN}: {exc}") from exc
        self.database_created = True

    def close(self) -> list[str]:
        """Drop the database and the Redis keys; the problems met, if any."""
        problems: list[str] = []
        if self.database_created:
            try:
                statement = f'DROP DATABASE IF EXISTS "{self.database}" WITH (FORCE)'
                asyncio.run(_admin_sql(statement))
                self.database_created = False
            except (OSError, asyncpg.PostgresError) as exc:
                problems.append(f"could not drop database {self.database}: {exc}")
        try:
            client = redis.Redis.from_url(REDIS_URL)
            try:
                keys = list(client.scan_iter(match=f"{self.redis_prefix}*", count=1000))
                if keys:
                    client.delete(*keys)
            finally:
                client.close()
        except redis.RedisError as exc:
            problems.append(f"could not delete Redis keys {self.redis_prefix}*: {exc}")
        return problems


def start_arona(
    supervisor: Supervisor,
    deployment: AronaDeployment,
    fake: FakeUpstream,
    run_dir: Path,
    *,
    limits: Literal["none", "quota", "all"] = "none",
    baseline: Baseline | None = None,
) -> System:
    """Arona on its own database. ``limits``: ``quota``, the limits Arona had before
    Step 13 (request quotas, the key's rpm); ``all``, every spend control too (prices,
    project token limits and budgets, the key's tpm and budget). All far above what a
    run sends, so each call pays for its admission (and, with ``all``, a reservation
    and its settle) and none is refused.

    ``baseline``: an earlier Arona instead of this checkout's (``bench.baseline``),
    with the request quota it had (the project's requests per minute and day: no key
    limits, which came with Step 13)."""
    key = {"none": "arona", "quota": "arona-quota", "all": "arona-limits"}[limits]
    executable = _arona_executable()
    version = f"arona {__version__}"
    if baseline is not None:
        key, executable, version = "arona-before", baseline.executable, f"arona {baseline.short}"
        limits = "quota"
    port = free_port()
    env = deployment.environment(port)
    deployment.create_database()
    run_checked([executable, "migrate"], env=env)
    started = time.monotonic()
    child = supervisor.start(
        key, [executable, "serve"], cpu=SUT_CPU, log=run_dir / f"{key}.log", env=env
    )
    url = f"http://127.0.0.1:{port}"
    wait_http(f"{url}/healthz", child, timeout=60)
    startup = time.monotonic() - started
    with httpx.Client(base_url=url, timeout=10.0, trust_env=False) as client:
        admin = {"Authorization": f"Bearer {env['ARONA_ADMIN_TOKEN']}"}
        _call(
            client,
            "POST",
            "/api/admin/backends",
            headers=admin,
            json={
                "name": BACKEND_NAME,
                "type": "external",
                "url": fake.url,
                "models": [CHAT_MODEL, EMBED_MODEL],
            },
        )
        _wait_healthy(client, admin)
        api_key = _create_api_key(client, admin, limits, key_limits=baseline is None)
    return System(key, url, api_key, child.pid, version, startup, child)


def _call(client: httpx.Client, method: str, path: str, **kwargs: Any) -> Any:
    try:
        response = client.request(method, path, **kwargs)
    except httpx.HTTPError as exc:
        raise BenchError(f"Arona {method} {path} failed: {exc!r}") from exc
    if not response.is_success:
        raise BenchError(f"Arona {method} {path} -> {response.status_code}: {response.text}")
    return response.json() if response.content else None


def _wait_healthy(client: httpx.Client, admin: dict[str, str]) -> None:
    deadline = time.monotonic() + HEALTHY_TIMEOUT_SECONDS
    status = "unknown"
    while time.monotonic() < deadline:
        backend = _call(client, "GET", f"/api/admin/backends/{BACKEND_NAME}", headers=admin)
        status = backend["health"]["status"]
        if status == "healthy":
            return
        time.sleep(0.2)
    raise BenchError(f"backend {BACKEND_NAME!r} is still {status!r} after probing")


# Far above a run's traffic (a few hundred thousand calls): every window is counted
# and reserved, none refuses.
BIG_TOKENS = 10**12
BIG_BUDGET = "100000000"


def _limit(
    client: httpx.Client, admin: dict[str, str], project_id: str, limits: str, key_limits: bool
) -> dict[str, Any]:
    """Sets the project's limits; the key's own limits to create it with."""
    quota: dict[str, Any] = {"perMinute": 10**9, "perDay": 10**9}
    key: dict[str, Any] = {"rpm": 1_000_000} if key_limits else {}
    if limits == "all":
        for model in (CHAT_MODEL, EMBED_MODEL):
            price = {"model": model, "input": "0.15", "output": "0.6", "embedding": "0.02"}
            _call(client, "POST", "/api/admin/prices", headers=admin, json=price)
        quota.update(
            tokensPerMinute=BIG_TOKENS,
            tokensPerDay=BIG_TOKENS,
            budgetPerDay=BIG_BUDGET,
            budgetPerMonth=BIG_BUDGET,
        )
        key.update(tpm=2_000_000_000, budget=BIG_BUDGET)
    _call(client, "PUT", f"/api/admin/projects/{project_id}/quota", headers=admin, json=quota)
    return key


def _create_api_key(
    client: httpx.Client, admin: dict[str, str], limits: str, *, key_limits: bool
) -> str:
    email = f"bench-{secrets.token_hex(4)}@bench.arona.local"
    password = secrets.token_urlsafe(16)
    _call(client, "POST", "/api/auth/register", json={"email": email, "password": password})
    login = _call(client, "POST", "/api/auth/login", json={"email": email, "password": password})
    user = {"Authorization": f"Bearer {login['accessToken']}"}
    project = _call(
        client, "POST", "/api/projects", headers=user, json={"name": "Bench", "slug": "bench"}
    )
    body: dict[str, Any] = {"name": "bench"}
    if limits != "none":
        body.update(_limit(client, admin, project["id"], limits, key_limits))
    created = _call(
        client, "POST", f"/api/projects/{project['id']}/api-keys", headers=user, json=body
    )
    key: str = created["key"]
    return key
