"""``arona vault rotate``: every encrypted column moves to the newest key, beside a
serving app, without overwriting what the app writes meanwhile.

Each test gets a database of its own (rotation is database-wide, and the rest of
the suite seals its rows under keys this module does not have). The apps run on a
live server in the test's own event loop, so the rotation can write through the API
between its read and its write.
"""

from __future__ import annotations

import asyncio
import base64
import os
import sys
import uuid
from collections.abc import AsyncIterator, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from uuid import UUID

import httpx
import pytest
from click.testing import CliRunner
from sqlalchemy import select, update

from app.cli import main
from app.db.config import build_db_config
from app.db.models import BackendConfig, CustomLlm, OverrideKey, ProjectSecret, ProjectWebhook
from app.domain.secrets.aad import (
    backend_config_aad,
    custom_llm_aad,
    override_key_aad,
    secret_aad,
    webhook_previous_aad,
    webhook_secret_aad,
)
from app.domain.secrets.rotation import RotationReport, render_report, rotate_vault
from app.domain.secrets.services import SecretResolver
from app.fakes.openai_upstream import FakeOpenAI
from app.fakes.serve import serve_asgi
from app.lib.settings import Settings, VaultKey
from app.lib.vault import Vault
from tests.support.api import eventually
from tests.support.auth import fresh_database
from tests.support.conversations import Tenant, new_tenant
from tests.support.live_server import live_server
from tests.support.secrets import (
    ADMIN,
    ADMIN_TOKEN,
    add_custom_llm,
    add_override_key,
    base,
    create_secret,
    engine_for,
    new_key,
    plaintext,
)
from tests.support.settings import AppFactory, with_settings

K0, K1, K2 = new_key("k0"), new_key("k1"), new_key("k2")
ARONA = str(Path(sys.executable).parent / "arona")
CHAT_MODEL = "rotate-chat"
UPSTREAM_KEY = plaintext("upstream")

Counts = tuple[int, int, int]  # rotated, current, failed


def spec(*keys: VaultKey) -> str:
    """ARONA_VAULT_KEYS for ``keys`` (newest first)."""
    return ",".join(f"{k.kid}:{base64.b64encode(k.key).decode()}" for k in keys)


def counts(report: RotationReport) -> dict[str, Counts]:
    return {t.table: (t.rotated, t.current, t.failed) for t in report.tables}


@pytest.fixture(params=["postgres", "sqlite"])
async def fresh(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Settings]:
    """A new migrated database; apps on it start with the key ring [k1]."""
    async with fresh_database(request.param, tmp_path) as settings:
        yield with_settings(settings, vault_keys=(K1,), admin_token=ADMIN_TOKEN)


@asynccontextmanager
async def serving(
    make_app: AppFactory, settings: Settings, *keys: VaultKey
) -> AsyncIterator[httpx.AsyncClient]:
    """A live app on ``settings`` with the key ring ``keys``."""
    app = make_app(with_settings(settings, vault_keys=keys))
    async with live_server(app) as url, httpx.AsyncClient(base_url=url, timeout=30) as http:
        yield http


@dataclass
class Seeded:
    tenant: Tenant
    backend: str
    # (table, row id) -> (plaintext, associated data)
    values: dict[tuple[str, UUID], tuple[str, bytes]] = field(default_factory=dict)
    secrets: dict[str, str] = field(default_factory=dict)
    """secret id -> plaintext"""


async def seed(http: Any, settings: Settings, upstream_url: str) -> Seeded:
    """Under [k1]: a backend key, secrets, a custom LLM key, an override key and a
    webhook's current and previous signing secrets."""
    vault_k1 = Vault([K1])
    name = f"rot-{uuid.uuid4().hex[:8]}"
    response = await http.post(
        "/api/admin/backends",
        json={
            "name": name,
            "type": "external",
            "url": upstream_url,
            "api_key": UPSTREAM_KEY,
            "models": [CHAT_MODEL],
        },
        headers=ADMIN,
    )
    assert response.status_code == 201, response.text
    # A backend without a key has nothing to rotate.
    keyless = await http.post(
        "/api/admin/backends",
        json={"name": f"nokey-{uuid.uuid4().hex[:8]}", "type": "external", "url": upstream_url},
        headers=ADMIN,
    )
    assert keyless.status_code == 201, keyless.text
    tenant = await new_tenant(http)
    seeded = Seeded(tenant=tenant, backend=name)
    pid = UUID(tenant.project_id)
    for _ in range(3):
        value = plaintext("secret")
        created = await create_secret(http, tenant.project_id, tenant.owner, value=value)
        sid = UUID(created["id"])
        seeded.secrets[created["id"]] = value
        seeded.values[("project_secrets", sid)] = (value, secret_aad(pid, sid))
    # A webhook whose secret was rotated: both its secrets are sealed (a public literal
    # address needs no DNS at write time and is never called here).
    hooks = f"/api/projects/{tenant.project_id}/webhooks"
    hook = await http.post(hooks, json={"url": "https://1.1.1.1/arona"}, headers=tenant.owner)
    assert hook.status_code == 201, hook.text
    hook_id = UUID(hook.json()["id"])
    rotated = await http.post(f"{hooks}/{hook_id}/rotate-secret", headers=tenant.owner)
    assert rotated.status_code == 200, rotated.text
    seeded.values[("project_webhooks", hook_id)] = (
        rotated.json()["secret"],
        webhook_secret_aad(pid, hook_id),
    )
    seeded.values[("project_webhooks.previous", hook_id)] = (
        hook.json()["secret"],
        webhook_previous_aad(pid, hook_id),
    )
    async with engine_for(settings) as engine:
        async with engine.connect() as conn:
            backend_id = await conn.scalar(
                select(BackendConfig.id).where(BackendConfig.name == name)
            )
        assert isinstance(backend_id, UUID)
        seeded.values[("backend_configs", backend_id)] = (
            UPSTREAM_KEY,
            backend_config_aad(backend_id),
        )
        llm_key, override = plaintext("llm"), plaintext("override")
        llm_id = await add_custom_llm(
            engine,
            pid,
            secret_id=next(iter(seeded.secrets)),
            api_key=llm_key,
            vault=vault_k1,
        )
        seeded.values[("custom_llms", llm_id)] = (llm_key, custom_llm_aad(pid, llm_id))
        override_id = await add_override_key(engine, pid, override, vault_k1)
        seeded.values[("override_keys", override_id)] = (
            override,
            override_key_aad(pid, override_id),
        )
    return seeded


_COLUMNS: dict[str, Any] = {
    "backend_configs": (BackendConfig, BackendConfig.api_key_encrypted),
    "project_secrets": (ProjectSecret, ProjectSecret.value_encrypted),
    "custom_llms": (CustomLlm, CustomLlm.api_key_encrypted),
    "override_keys": (OverrideKey, OverrideKey.key_encrypted),
    "project_webhooks": (ProjectWebhook, ProjectWebhook.secret_encrypted),
    "project_webhooks.previous": (ProjectWebhook, ProjectWebhook.previous_secret_encrypted),
}


async def stored(settings: Settings) -> dict[tuple[str, UUID], str]:
    """Every non-null encrypted value in the database, by (table, row id)."""
    out: dict[tuple[str, UUID], str] = {}
    async with engine_for(settings) as engine, engine.connect() as conn:
        for table, (model, column) in _COLUMNS.items():
            for row_id, token in await conn.execute(
                select(model.id, column).where(column.is_not(None))
            ):
                out[(table, row_id)] = token
    return out


def assert_all_on(
    tokens: dict[tuple[str, UUID], str],
    expected: dict[tuple[str, UUID], tuple[str, bytes]],
    vault: Vault,
    kid: str,
) -> None:
    assert set(tokens) == set(expected)
    for where, token in tokens.items():
        assert token.startswith(f"v1:{kid}:"), where
        value, aad = expected[where]
        assert vault.decrypt(token, aad) == value, where


async def chat(http: Any, tenant: Tenant) -> httpx.Response:
    response: httpx.Response = await http.post(
        "/v1/chat/completions",
        json={"model": CHAT_MODEL, "messages": [{"role": "user", "content": "hi"}]},
        headers=tenant.key,
    )
    return response


async def wait_routable(http: Any, tenant: Tenant) -> None:
    async def ok() -> bool:
        return (await chat(http, tenant)).status_code == 200

    await eventually(ok, within=5.0, interval=0.05)


@pytest.fixture
async def upstream() -> AsyncIterator[str]:
    """A real OpenAI-compatible server that only answers with the right key."""
    fake = FakeOpenAI("rot-upstream", models=[CHAT_MODEL], api_key=UPSTREAM_KEY)
    async with serve_asgi(fake) as url:
        yield url


# ------------------------------------------------------------------------ tests


async def test_rotation_moves_every_column_to_the_newest_key(
    fresh: Settings, make_app: AppFactory, upstream: str
) -> None:
    async with serving(make_app, fresh, K1) as http:
        seeded = await seed(http, fresh, upstream)
        await wait_routable(http, seeded.tenant)
    before = await stored(fresh)
    assert_all_on(before, seeded.values, Vault([K1]), "k1")

    ring = Vault([K2, K1])
    async with engine_for(fresh) as engine:
        report = await rotate_vault(engine, ring, batch_size=2)
        assert report.ok, report.failures
        assert counts(report) == {
            "backend_configs": (1, 0, 0),
            "project_secrets": (3, 0, 0),
            "custom_llms": (1, 0, 0),
            "override_keys": (1, 0, 0),
            "project_webhooks": (1, 0, 0),
            "project_webhooks.previous": (1, 0, 0),
        }
        after = await stored(fresh)
        assert_all_on(after, seeded.values, Vault([K2]), "k2")
        lines = render_report(report, ring.kids)
        assert lines[-1].startswith("every encrypted value is on key 'k2'")
        assert "'k1' can be removed from ARONA_VAULT_KEYS" in lines[-1]

        # Idempotent: a second run finds everything current and writes nothing.
        again = await rotate_vault(engine, ring)
        assert again.ok
        assert counts(again) == {
            "backend_configs": (0, 1, 0),
            "project_secrets": (0, 3, 0),
            "custom_llms": (0, 1, 0),
            "override_keys": (0, 1, 0),
            "project_webhooks": (0, 1, 0),
            "project_webhooks.previous": (0, 1, 0),
        }
        assert await stored(fresh) == after

    # An app that knows only k2 serves with every value.
    async with serving(make_app, fresh, K2) as http:
        tenant = seeded.tenant
        await wait_routable(http, tenant)  # the backend's key opened: the upstream let us in
        secrets = (await http.get(base(tenant.project_id), headers=tenant.owner)).json()
        assert {item["id"] for item in secrets["items"]} == set(seeded.secrets)
        sid = next(iter(seeded.secrets))
        replaced = await http.put(
            f"{base(tenant.project_id)}/{sid}/value", json={"value": "new"}, headers=tenant.owner
        )
        assert replaced.status_code == 200, replaced.text
    config = build_db_config(fresh)
    try:
        resolver = SecretResolver(config, Vault([K2]))
        pid = UUID(seeded.tenant.project_id)
        for secret_id, secret_value in seeded.secrets.items():
            expected = "new" if secret_id == sid else secret_value
            assert await resolver.reveal(pid, UUID(secret_id)) == expected
    finally:
        await config.get_engine().dispose()


async def test_concurrent_writes_during_rotation_are_never_overwritten(
    fresh: Settings, make_app: AppFactory
) -> None:
    """Between the rotation's read and write, a server on the old ring [k1] replaces
    one value and deletes another, and a server on the new ring [k2, k1] replaces a
    third: each write stands, and every surviving value ends on k2."""
    async with AsyncExitStack() as stack:
        old = await stack.enter_async_context(serving(make_app, fresh, K1))
        new = await stack.enter_async_context(serving(make_app, fresh, K2, K1))
        tenant = await new_tenant(old)  # type: ignore[arg-type]
        url = base(tenant.project_id)
        ids: list[str] = []
        values: dict[str, str] = {}
        for _ in range(4):
            value = plaintext("orig")
            ids.append(
                (await create_secret(old, tenant.project_id, tenant.owner, value=value))["id"]
            )
            values[ids[-1]] = value
        by_old, by_new, deleted, untouched = ids
        calls: list[tuple[str, Sequence[UUID]]] = []

        async def write_meanwhile(table: str, row_ids: Sequence[UUID]) -> None:
            calls.append((table, row_ids))
            if table != "project_secrets":
                return
            assert {str(r) for r in row_ids} == set(ids)
            for http, sid in ((old, by_old), (new, by_new)):
                values[sid] = plaintext("meanwhile")
                response = await http.put(
                    f"{url}/{sid}/value", json={"value": values[sid]}, headers=tenant.owner
                )
                assert response.status_code == 200, response.text
            gone = await old.delete(f"{url}/{deleted}", headers=tenant.owner)
            assert gone.status_code == 204, gone.text
            del values[deleted]

        ring = Vault([K2, K1])
        async with engine_for(fresh) as engine:
            report = await rotate_vault(engine, ring, on_batch=write_meanwhile)
        assert report.ok, report.failures
        # Called once per batch read; the other tables are empty here.
        assert [table for table, _ in calls] == ["project_secrets"]
        secrets_report = next(t for t in report.tables if t.table == "project_secrets")
        # by_old was rewritten under k1 and resealed on retry; untouched rotated at
        # once; by_new was already on k2; deleted is gone.
        assert (secrets_report.rotated, secrets_report.current) == (2, 1)
        assert (secrets_report.failed, secrets_report.gone) == (0, 1)

        pid = UUID(tenant.project_id)
        expected = {
            ("project_secrets", UUID(sid)): (value, secret_aad(pid, UUID(sid)))
            for sid, value in values.items()
        }
        assert_all_on(await stored(fresh), expected, Vault([K2]), "k2")
        assert untouched in values


async def test_unreadable_rows_fail_clearly_and_the_command_exits_non_zero(
    fresh: Settings, make_app: AppFactory
) -> None:
    async with serving(make_app, fresh, K1) as http:
        tenant = await new_tenant(http)  # type: ignore[arg-type]
        good, copied, foreign = plaintext("good"), plaintext("copied"), plaintext("foreign")
        s_good = await create_secret(http, tenant.project_id, tenant.owner, value=good)
        s_copied = await create_secret(http, tenant.project_id, tenant.owner, value=copied)
        s_foreign = await create_secret(http, tenant.project_id, tenant.owner, value=foreign)
    pid = UUID(tenant.project_id)
    good_id, copied_id, foreign_id = (UUID(s["id"]) for s in (s_good, s_copied, s_foreign))
    async with engine_for(fresh) as engine:
        async with engine.begin() as conn:
            good_token = await conn.scalar(
                select(ProjectSecret.value_encrypted).where(ProjectSecret.id == good_id)
            )
            # Sealed under a key no ring here has, and a ciphertext copied onto another row.
            await conn.execute(
                update(ProjectSecret)
                .where(ProjectSecret.id == foreign_id)
                .values(value_encrypted=Vault([K0]).encrypt(foreign, secret_aad(pid, foreign_id)))
            )
            await conn.execute(
                update(ProjectSecret)
                .where(ProjectSecret.id == copied_id)
                .values(value_encrypted=good_token)
            )
        before = await stored(fresh)
        ring = Vault([K2, K1])
        report = await rotate_vault(engine, ring, dry_run=True)
        assert not report.ok
        assert counts(report)["project_secrets"] == (1, 0, 2)
        assert await stored(fresh) == before  # a dry run writes nothing

        report = await rotate_vault(engine, ring)
        assert not report.ok
        assert counts(report)["project_secrets"] == (1, 0, 2)
        failures = {f.row_id: f for f in report.failures}
        assert set(failures) == {copied_id, foreign_id}
        assert failures[foreign_id].table == "project_secrets"
        assert failures[foreign_id].kid == "k0"
        assert "vault key 'k0' is not configured" in failures[foreign_id].reason
        assert failures[copied_id].kid == "k1"
        assert "failed authentication" in failures[copied_id].reason
        after = await stored(fresh)
        # The failed rows are left as they were; the good one moved.
        assert after[("project_secrets", foreign_id)] == before[("project_secrets", foreign_id)]
        assert after[("project_secrets", copied_id)] == good_token
        assert after[("project_secrets", good_id)].startswith("v1:k2:")
        text = "\n".join(render_report(report, ring.kids))
        assert f"failed: project_secrets {foreign_id}: vault key 'k0' is not configured" in text
        assert "(missing key: k0)" in text
        for value in (good, copied, foreign):
            assert value not in text

    # The command as an operator runs it.
    result = await run_cli(fresh, spec(K2, K1), real=True)
    assert result.returncode == 1, result.output
    assert f"project_secrets {foreign_id}: vault key 'k0' is not configured" in result.output
    assert f"project_secrets {copied_id}" in result.output
    assert "(missing key: k0)" in result.output
    assert_clean(result.output, (good, copied, foreign))

    # With k0 back in the ring and the copied row replaced, the next run completes.
    async with serving(make_app, fresh, K2, K1) as http:
        replaced = await http.put(
            f"{base(tenant.project_id)}/{copied_id}/value",
            json={"value": copied},
            headers=tenant.owner,
        )
        assert replaced.status_code == 200, replaced.text
    dry = await run_cli(fresh, spec(K2, K1, K0), "--dry-run")
    assert dry.returncode == 0, dry.output
    assert "dry run, nothing written" in dry.output
    assert_line(dry.output, "project_secrets", 1, 2, 0)
    done = await run_cli(fresh, spec(K2, K1, K0), "--batch-size", "1")
    assert done.returncode == 0, done.output
    assert_line(done.output, "project_secrets", 1, 2, 0)
    assert "every encrypted value is on key 'k2': 'k1', 'k0' can be removed" in done.output
    assert_clean(done.output, (good, copied, foreign))
    # ... and then only k2 is needed.
    final = await run_cli(fresh, spec(K2))
    assert final.returncode == 0, final.output
    assert_line(final.output, "project_secrets", 0, 3, 0)
    expected = {
        ("project_secrets", sid): (value, secret_aad(pid, sid))
        for sid, value in ((good_id, good), (copied_id, copied), (foreign_id, foreign))
    }
    assert_all_on(await stored(fresh), expected, Vault([K2]), "k2")


@dataclass
class CliResult:
    returncode: int
    output: str


async def run_cli(settings: Settings, keys: str, *args: str, real: bool = False) -> CliResult:
    """``arona vault rotate`` in-process (click's runner, in a thread of its own since
    the command runs its own event loop), or as a real process when ``real``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ARONA_")}
    env["ARONA_DATABASE_URL"] = settings.database_url
    env["ARONA_VAULT_KEYS"] = keys
    if not real:
        runner = CliRunner()
        cleared = {k: None for k in os.environ if k.startswith("ARONA_")}
        result = await asyncio.to_thread(
            runner.invoke, main, ["vault", "rotate", *args], env={**cleared, **env}
        )
        return CliResult(result.exit_code, result.output)
    process = await asyncio.create_subprocess_exec(
        ARONA,
        "vault",
        "rotate",
        *args,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    async with asyncio.timeout(120):
        out, _ = await process.communicate()
    assert process.returncode is not None
    return CliResult(process.returncode, out.decode())


def assert_line(output: str, table: str, rotated: int, current: int, failed: int) -> None:
    rows = [line.split() for line in output.splitlines() if line.startswith(table + " ")]
    assert rows == [[table, str(rotated), str(current), str(failed)]], output


def assert_clean(output: str, values: Sequence[str] = ()) -> None:
    """Neither key material nor any of ``values`` in the output."""
    for key in (K0, K1, K2):
        assert base64.b64encode(key.key).decode() not in output
    for value in values:
        assert value not in output


@pytest.mark.parametrize("fresh", ["sqlite"], indirect=True)
async def test_cli_on_an_empty_database_and_without_keys(fresh: Settings) -> None:
    result = await run_cli(fresh, spec(K2, K1))
    assert result.returncode == 0, result.output
    for table in ("backend_configs", "project_secrets", "custom_llms", "override_keys"):
        assert_line(result.output, table, 0, 0, 0)
    assert_line(result.output, "project_webhooks", 0, 0, 0)
    assert_line(result.output, "project_webhooks.previous", 0, 0, 0)
    assert "newest key 'k2' (configured: k2, k1)" in result.output
    bad = await run_cli(fresh, "")
    assert bad.returncode != 0
    assert "ARONA_VAULT_KEYS is empty" in bad.output
