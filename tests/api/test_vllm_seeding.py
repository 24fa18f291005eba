"""Seeding vLLM backends from ``config/vllm-backends.json`` at start-up.

Apps are started for real (lifespan included) on a database of this module's own;
the seeded backends point at fake vLLM servers on loopback ports, and one of them
demands an API key, so its turning healthy proves the seeded key was stored
encrypted and sent.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from litestar.testing import AsyncTestClient
from sqlalchemy import func, select

from app.db.config import build_db_config
from app.db.models import BackendConfig
from app.domain.backends.schemas import ValidRegistration
from app.domain.backends.seeding import (
    DEFAULT_FILE,
    SeedingError,
    load_seed_file,
    seed_file,
    seed_vllm_backends,
)
from app.domain.backends.services import BackendConfigService
from app.fakes.serve import serve_asgi
from app.fakes.vllm_upstream import FakeVllm
from app.lib.settings import Settings
from app.lib.vault import Vault
from app.routing.registry import BackendRegistry
from tests.support.api import eventually, resources_of
from tests.support.auth import execute
from tests.support.live_server import live_server
from tests.support.routing import (
    ADMIN,
    UPSTREAM_KEY,
    backend,
    register_backend,
    routing_pg_settings,
    routing_settings,
    unique_name,
    wait_healthy,
)
from tests.support.settings import AppFactory, with_settings

__all__ = ["routing_pg_settings", "routing_settings"]

Pool = tuple[str, str]
"""Base URLs of two fake vLLM servers; the second wants ``UPSTREAM_KEY``."""


@pytest.fixture
async def pool() -> AsyncIterator[Pool]:
    open_fake = FakeVllm("pool-open", models=["demo-llama"])
    keyed_fake = FakeVllm("pool-keyed", models=["demo-llama"])
    keyed_fake.api_key = UPSTREAM_KEY
    async with serve_asgi(open_fake) as open_url, serve_asgi(keyed_fake) as keyed_url:
        yield open_url, keyed_url


def write(path: Path, backends: list[dict[str, Any]] | Any) -> Path:
    document = {"backends": backends} if isinstance(backends, list) else backends
    path.write_text(json.dumps(document))
    return path


def seeded_settings(settings: Settings, path: Path) -> Settings:
    return with_settings(settings, vllm_backends_file=path)


async def stored_rows(settings: Settings, *names: str) -> dict[str, Any]:
    """name -> (name, url, tags, api_key_encrypted, updated_at) as stored."""
    columns = (
        BackendConfig.name,
        BackendConfig.url,
        BackendConfig.tags,
        BackendConfig.api_key_encrypted,
        BackendConfig.updated_at,
    )
    rows = await execute(settings, select(*columns).where(BackendConfig.name.in_(names)))
    return {row.name: row for row in rows}


# ---------------------------------------------------------------- seeding


async def test_the_file_is_seeded_on_first_start_and_kept_as_is_on_the_next(
    routing_settings: Settings, make_app: AppFactory, pool: Pool, tmp_path: Path
) -> None:
    open_url, keyed_url = pool
    first, second = unique_name("seed-a"), unique_name("seed-b")
    path = write(
        tmp_path / "vllm-backends.json",
        [
            {"name": first, "url": open_url, "models": ["demo-llama"], "tags": ["general"]},
            {
                "name": second,
                "url": keyed_url,
                "tags": [" general ", "smart", "smart"],
                "api_key": UPSTREAM_KEY,
                "type": "vllm",
                "overwrite": False,
            },
        ],
    )
    settings = seeded_settings(routing_settings, path)
    async with AsyncTestClient(app=make_app(settings)) as client:
        shown_a = await wait_healthy(client, first)
        shown_b = await wait_healthy(client, second)
        assert (shown_a["type"], shown_a["url"], shown_a["models"], shown_a["tags"]) == (
            "vllm",
            open_url,
            ["demo-llama"],
            ["general"],
        )
        assert shown_a["has_api_key"] is False
        # Checked like the admin API: trimmed, de-duplicated tags; the key is write-only.
        assert (shown_b["type"], shown_b["tags"], shown_b["has_api_key"]) == (
            "vllm",
            ["general", "smart"],
            True,
        )
        assert UPSTREAM_KEY not in json.dumps(shown_b)
        assert shown_b["advertised_models"] == ["demo-llama"]
        registry = resources_of(client).backend_registry
        state = registry.get(second)
        assert state is not None
        assert state.spec.tags == frozenset({"general", "smart"})
        assert state.spec.api_key == UPSTREAM_KEY
        # An admin changes one of them after seeding.
        changed = await register_backend(
            client, name=first, type="vllm", url=open_url, tags=["general", "pinned-by-admin"]
        )
        assert changed.status_code == 201, changed.text
    before = await stored_rows(settings, first, second)

    async with AsyncTestClient(app=make_app(settings)) as client:
        # Not overwritten: the admin's change stands and nothing was written.
        assert (await backend(client, first)).json()["tags"] == ["general", "pinned-by-admin"]
        await wait_healthy(client, second)
    after = await stored_rows(settings, first, second)
    for name in (first, second):
        assert after[name].updated_at == before[name].updated_at
        assert after[name].api_key_encrypted == before[name].api_key_encrypted
    [(count,)] = await execute(
        settings,
        select(func.count())
        .select_from(BackendConfig)
        .where(BackendConfig.name.in_([first, second])),
    )
    assert count == 2


async def test_overwrite_true_replaces_and_an_equal_entry_writes_nothing(
    routing_settings: Settings, make_app: AppFactory, pool: Pool, tmp_path: Path
) -> None:
    open_url, keyed_url = pool
    name = unique_name("seed-over")
    entry = {
        "name": name,
        "url": keyed_url,
        "models": ["demo-llama"],
        "tags": ["smart"],
        "api_key": UPSTREAM_KEY,
        "overwrite": True,
    }
    settings = seeded_settings(routing_settings, write(tmp_path / "seed.json", [entry]))
    async with AsyncTestClient(app=make_app(settings)) as client:
        await wait_healthy(client, name)
        # An admin points it elsewhere and drops its key and tags.
        changed = await register_backend(client, name=name, type="external", url=open_url)
        assert changed.status_code == 201, changed.text

    async with AsyncTestClient(app=make_app(settings)) as client:
        shown = await wait_healthy(client, name)
        assert (shown["type"], shown["url"], shown["tags"], shown["has_api_key"]) == (
            "vllm",
            keyed_url,
            ["smart"],
            True,
        )
    replaced = (await stored_rows(settings, name))[name]

    async with AsyncTestClient(app=make_app(settings)) as client:
        await wait_healthy(client, name)
    again = (await stored_rows(settings, name))[name]
    assert again.updated_at == replaced.updated_at
    assert again.api_key_encrypted == replaced.api_key_encrypted

    # A change of the file's tags alone is applied on the next start.
    write(tmp_path / "seed.json", [{**entry, "tags": ["smart", "general"]}])
    async with AsyncTestClient(app=make_app(settings)) as client:
        assert (await backend(client, name)).json()["tags"] == ["smart", "general"]
        state = resources_of(client).backend_registry.get(name)
        assert state is not None
        assert state.spec.tags == frozenset({"smart", "general"})


async def test_max_concurrency_is_seeded_and_an_overwrite_changing_it_alone_applies(
    routing_settings: Settings, make_app: AppFactory, pool: Pool, tmp_path: Path
) -> None:
    open_url, _ = pool
    kept, replaced = unique_name("seed-slots"), unique_name("seed-slots-over")
    path = tmp_path / "seed.json"
    entries: list[dict[str, Any]] = [
        {"name": kept, "url": open_url, "max_concurrency": 32},
        {"name": replaced, "url": open_url, "max_concurrency": 48, "overwrite": True},
    ]
    settings = seeded_settings(routing_settings, write(path, entries))

    def slots(client: AsyncTestClient[Any], name: str) -> int | None:
        state = resources_of(client).backend_registry.get(name)
        assert state is not None
        assert state.load.max_concurrency == state.spec.max_concurrency
        return state.spec.max_concurrency

    async with AsyncTestClient(app=make_app(settings)) as client:
        assert (await backend(client, kept)).json()["max_concurrency"] == 32
        assert (await backend(client, replaced)).json()["max_concurrency"] == 48
        assert (slots(client, kept), slots(client, replaced)) == (32, 48)
    before = await stored_rows(settings, kept, replaced)

    # The same file again writes nothing; a change of max_concurrency alone is an
    # overwrite for the entry that allows it, and ignored for the one that does not.
    async with AsyncTestClient(app=make_app(settings)) as client:
        assert (slots(client, kept), slots(client, replaced)) == (32, 48)
    again = await stored_rows(settings, kept, replaced)
    assert [again[n].updated_at for n in (kept, replaced)] == [
        before[n].updated_at for n in (kept, replaced)
    ]

    write(path, [{**entries[0], "max_concurrency": 8}, {**entries[1], "max_concurrency": None}])
    async with AsyncTestClient(app=make_app(settings)) as client:
        assert (await backend(client, replaced)).json()["max_concurrency"] is None
        assert (slots(client, kept), slots(client, replaced)) == (32, None)
    after = await stored_rows(settings, kept, replaced)
    assert after[kept].updated_at == before[kept].updated_at
    assert after[replaced].updated_at > before[replaced].updated_at


async def test_the_default_file_is_used_when_present_and_silently_skipped_when_not(
    routing_settings: Settings,
    make_app: AppFactory,
    pool: Pool,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(tmp_path)
    assert routing_settings.vllm_backends_file is None
    assert seed_file(routing_settings) is None
    async with AsyncTestClient(app=make_app(routing_settings)) as client:
        assert (await client.get("/healthz")).status_code == 200

    name = unique_name("seed-default")
    DEFAULT_FILE.parent.mkdir()
    write(DEFAULT_FILE, [{"name": name, "url": pool[0], "tags": ["general"]}])
    assert seed_file(routing_settings) == DEFAULT_FILE
    async with AsyncTestClient(app=make_app(routing_settings)) as client:
        shown = await wait_healthy(client, name)
        assert (shown["type"], shown["tags"]) == ("vllm", ["general"])


def test_the_shipped_files_are_valid() -> None:
    root = Path(__file__).resolve().parents[2] / "config"
    assert load_seed_file(root / "vllm-backends.json") == []
    example = load_seed_file(root / "vllm-backends.example.json")
    assert [e.registration.kind for e in example] == ["vllm", "vllm"]
    assert [e.registration.tags for e in example] == [("general",), ("general", "smart")]
    assert [e.registration.max_concurrency for e in example] == [None, 256]


# ---------------------------------------------------------------- refusals


BAD_FILES: list[tuple[str, str]] = [
    ('{"backends": [', "not valid JSON: Expecting value: line 1 column 15"),
    ("[]", 'expected {"backends": [...]}'),
    ('{"backends": {}}', 'expected {"backends": [...]}'),
    ('{"backend": []}', "unknown field `backend`"),
    ('{"backends": ["vllm-a"]}', "Expected `object`, got `str` - at `$.backends[0]`"),
]

BAD_ENTRIES: list[tuple[list[dict[str, Any]], str]] = [
    (
        [{"name": "ok", "url": "http://127.0.0.1:1"}, {"name": "two", "url": "ftp://h"}],
        "backends[1] ('two'): url must start with http:// or https:// (or evernight://)"
        " for vllm backends (field url)",
    ),
    (
        [{"name": "bad name", "url": "http://127.0.0.1:1"}],
        "backends[0] ('bad name'): Expected `str` matching regex",
    ),
    ([{"url": "http://127.0.0.1:1"}], "backends[0]: Object missing required field `name`"),
    (
        [{"name": "c", "url": "http://127.0.0.1:8188", "type": "comfyui"}],
        "backends[0] ('c'): type must be \"vllm\" (this file registers vLLM servers only), "
        "got 'comfyui'",
    ),
    (
        [{"name": "e", "url": "http://127.0.0.1:1", "type": "external"}],
        'type must be "vllm"',
    ),
    (
        [{"name": "o", "url": "http://127.0.0.1:1", "type": "ollama"}],
        'type must be "vllm"',
    ),
    (
        [{"name": "k", "url": "http://127.0.0.1:1", "api_key_env": "VLLM_KEY"}],
        "backends[0] ('k'): Object contains unknown field `api_key_env`",
    ),
    (
        [{"name": "w", "url": "http://127.0.0.1:1", "overwrite": "yes"}],
        "overwrite must be true or false",
    ),
    (
        [{"name": "t", "url": "http://127.0.0.1:1", "tags": ["ok", " "]}],
        "backends[0] ('t'): Expected `str` matching regex",
    ),
    (
        [{"name": "t", "url": "http://127.0.0.1:1", "tags": ["ok", " "]}],
        "- at `$.tags[1]`",
    ),
    (
        [{"name": "d", "url": "http://127.0.0.1:1"}, {"name": "d", "url": "http://127.0.0.1:2"}],
        "backends[1] ('d'): the name is also used by backends[0]",
    ),
    (
        [{"name": "s", "url": f"http://user:{UPSTREAM_KEY}@127.0.0.1:1"}],
        "url must not carry credentials",
    ),
    (
        [{"name": "l", "url": "http://127.0.0.1:1", "api_key": UPSTREAM_KEY * 400}],
        "Expected `str` of length <= 8192 - at `$.api_key`",
    ),
    (
        [{"name": "m", "url": "http://127.0.0.1:1", "max_concurrency": 0}],
        "backends[0] ('m'): Expected `int` >= 1 - at `$.max_concurrency`",
    ),
    (
        [{"name": "m", "url": "http://127.0.0.1:1", "max_concurrency": 100_001}],
        "Expected `int` <= 100000 - at `$.max_concurrency`",
    ),
    (
        [{"name": "m", "url": "http://127.0.0.1:1", "max_concurrency": "64"}],
        "- at `$.max_concurrency`",
    ),
    (
        [{"name": "m", "url": "http://127.0.0.1:1", "maxConcurrency": 64}],
        "Object contains unknown field `maxConcurrency`",
    ),
]


@pytest.mark.parametrize(("content", "message"), BAD_FILES)
def test_a_malformed_file_is_refused_naming_the_file(
    tmp_path: Path, content: str, message: str
) -> None:
    path = tmp_path / "vllm-backends.json"
    path.write_text(content)
    with pytest.raises(SeedingError) as raised:
        load_seed_file(path)
    assert str(raised.value).startswith(f"{path}: ")
    assert message in str(raised.value)


@pytest.mark.parametrize(("entries", "message"), BAD_ENTRIES)
def test_an_invalid_entry_is_refused_naming_the_file_and_entry(
    tmp_path: Path, entries: list[dict[str, Any]], message: str
) -> None:
    path = write(tmp_path / "vllm-backends.json", entries)
    with pytest.raises(SeedingError) as raised:
        load_seed_file(path)
    assert str(raised.value).startswith(f"{path}: backends[")
    assert message in str(raised.value)
    assert UPSTREAM_KEY not in str(raised.value)


def test_a_missing_explicit_file_is_refused(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere" / "vllm-backends.json"
    with pytest.raises(SeedingError, match=r"ARONA_VLLM_BACKENDS_FILE is .*which does not exist"):
        seed_file(Settings(vllm_backends_file=missing))
    with pytest.raises(SeedingError, match="which is not a file"):
        seed_file(Settings(vllm_backends_file=tmp_path))


async def test_start_up_stops_on_a_bad_file_before_writing_anything(
    routing_settings: Settings, make_app: AppFactory, tmp_path: Path
) -> None:
    good = unique_name("seed-good")
    path = write(
        tmp_path / "vllm-backends.json",
        [
            {"name": good, "url": "http://127.0.0.1:1"},
            {"name": unique_name(), "url": "http://127.0.0.1:1", "type": "comfyui"},
        ],
    )
    message = await start_up_refusal(make_app(seeded_settings(routing_settings, path)))
    assert message.startswith(f"{path}: backends[1] (")
    assert 'type must be "vllm"' in message
    missing = seeded_settings(routing_settings, tmp_path / "missing.json")
    assert "does not exist" in await start_up_refusal(make_app(missing))
    assert await stored_rows(routing_settings, good) == {}


async def start_up_refusal(app: Any) -> str:
    """The message of the ``SeedingError`` that stopped ``app`` from starting."""
    errors: list[BaseException] = []
    try:
        async with AsyncTestClient(app=app):
            pass
    except* SeedingError as group:  # the test client's task group wraps it
        errors = _leaves(group)
    assert errors, "start-up was not refused"
    return str(errors[0])


def _leaves(error: BaseException) -> list[BaseException]:
    if isinstance(error, BaseExceptionGroup):
        return [leaf for inner in error.exceptions for leaf in _leaves(inner)]
    return [error]


# ---------------------------------------------------------------- replicas


async def test_replicas_seeding_at_once_end_with_one_row_per_name(
    routing_pg_settings: Settings, tmp_path: Path
) -> None:
    names = [unique_name("race") for _ in range(4)]
    entries: list[dict[str, Any]] = [
        {"name": name, "url": "http://127.0.0.1:1", "tags": ["general"], "overwrite": n % 2 == 1}
        for n, name in enumerate(names)
    ]
    settings = seeded_settings(routing_pg_settings, write(tmp_path / "race.json", entries))
    vault = Vault(settings.vault_keys)
    configs = [build_db_config(settings) for _ in range(3)]
    try:
        reports = await asyncio.gather(
            *(seed_vllm_backends(settings, config, vault) for config in configs)
        )
    finally:
        for config in configs:
            await config.get_engine().dispose()
    for name in names:
        # Whoever lost a race kept the winner's row (or wrote the same content).
        assert sum(name in report.created for report in reports) >= 1
    [(count,)] = await execute(
        settings,
        select(func.count()).select_from(BackendConfig).where(BackendConfig.name.in_(names)),
    )
    assert count == len(names)


class _StaleReads(BackendConfigService):
    """Reads as if another replica had not inserted yet: forces the insert race."""

    async def get_by_name(self, name: str) -> BackendConfig | None:
        return None


async def test_losing_the_insert_race_keeps_the_winners_row(
    routing_pg_settings: Settings,
) -> None:
    name = unique_name("lost")
    vault = Vault(routing_pg_settings.vault_keys)
    registration = ValidRegistration(
        name=name,
        kind="vllm",
        url="http://127.0.0.1:1",
        api_key=None,
        models=(),
        tags=("general",),
    )
    config = build_db_config(routing_pg_settings)
    try:
        async with BackendConfigService.new(config=config) as service:
            assert await service.create_if_absent(registration, vault) is not None
            assert await service.create_if_absent(registration, vault) is None
        async with _StaleReads.new(config=config) as stale:
            loser = ValidRegistration(
                name=name, kind="vllm", url="http://127.0.0.1:2", api_key=None, models=()
            )
            assert await stale.create_if_absent(loser, vault) is None
    finally:
        await config.get_engine().dispose()
    row = (await stored_rows(routing_pg_settings, name))[name]
    assert (row.url, row.tags) == ("http://127.0.0.1:1", ["general"])


async def test_a_replica_that_seeds_tells_the_running_ones(
    routing_pg_settings: Settings, make_app: AppFactory, pool: Pool, tmp_path: Path
) -> None:
    name = unique_name("announce")
    path = write(tmp_path / "seed.json", [{"name": name, "url": pool[0], "tags": ["smart"]}])
    running = make_app(routing_pg_settings)
    async with live_server(running):
        registry: BackendRegistry = running.state.resources.backend_registry
        assert registry.get(name) is None
        # A second replica starts with the file; the running one hears of it at once
        # (not at its next periodic reload, a minute away).
        async with live_server(make_app(seeded_settings(routing_pg_settings, path))) as url:

            async def arrived() -> bool:
                return registry.get(name) is not None

            await eventually(arrived, within=5.0)
            state = registry.get(name)
            assert state is not None
            assert state.spec.tags == frozenset({"smart"})
            async with httpx.AsyncClient(base_url=url) as client:
                listed = await client.get("/api/admin/backends?limit=500", headers=ADMIN)
                assert name in [i["name"] for i in listed.json()["items"]]
