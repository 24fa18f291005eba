"""The hot path's caches through a database outage, driven directly.

Each per-project cache of the request path (override keys, custom LLMs, the runtime
catalog) and the API key index is given a loader that fails the way the database
does when it is down (a real SQLAlchemy ``OperationalError`` from a refused connect,
through the app's own ``unavailable_on_outage`` wrapper). What must hold:

- a warm entry keeps being served, also after the periodic safety net marked it
  stale (that is only a suspicion of lost events); the failed re-read is retried
  only after a back-off, not on every request;
- an entry dropped by a real change, or never read, has nothing to fall back on: a
  503 ``database_unavailable``, never an internal error;
- an API key the index does not hold is a 503 while the database cannot be asked
  (after one failed lookup, without a query per attempt), a 401 again once it can.

The end-to-end behaviour (real processes, PostgreSQL stopped under load) is in
``test_database_down.py``; these pin the rules it relies on.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Sequence
from uuid import UUID

import pytest
from sqlalchemy import text
from sqlalchemy.exc import IntegrityError, OperationalError

from app.db.config import build_db_config
from app.db.outage import DatabaseUnavailableError, is_database_outage, unavailable_on_outage
from app.domain.accounts.keyring import ActiveApiKey, ApiKeyIndex
from app.domain.custom_llms.directory import CustomLlmDirectory
from app.domain.custom_llms.stored import StoredLlm
from app.domain.overrides.index import LoadedOverride, OverrideIndex
from app.domain.profiles.catalog import ProfileCatalog, ProjectModels
from app.lib.keyed_cache import STALE_RETRY_SECONDS
from app.lib.ports import free_port
from app.routing.profiles import Profile, ProfileTable
from tests.support.settings import base_settings

pytestmark = pytest.mark.faults

PROJECT = uuid.UUID("33333333-3333-4333-8333-333333333333")
OTHER = uuid.UUID("44444444-4444-4444-8444-444444444444")


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def refused_connect_error() -> OperationalError:
    """What the app's engine raises with nobody listening on the database port."""
    engine = build_db_config(
        base_settings(database_url=f"postgresql+asyncpg://postgres@127.0.0.1:{free_port()}/x")
    ).get_engine()
    try:
        async with engine.connect() as connection:
            await connection.execute(text("SELECT 1"))
    except OperationalError as exc:
        return exc
    finally:
        await engine.dispose()
    raise AssertionError("a connect to a closed port succeeded")


class Database:
    """A loader's backing store that can be taken down; reads counted."""

    def __init__(self, down_error: OperationalError) -> None:
        self.down = False
        self.reads = 0
        self._error = down_error

    def read(self) -> None:
        self.reads += 1
        if self.down:
            raise self._error


# ------------------------------------------------------------------ the classifier


async def test_a_refused_connect_is_an_operational_error_and_an_outage() -> None:
    error = await refused_connect_error()
    assert isinstance(error, OperationalError)
    assert is_database_outage(error)
    # Wrapped by a repository layer, still recognised through the cause chain.
    wrapped = RuntimeError("repository failed")
    wrapped.__cause__ = error
    assert is_database_outage(wrapped)


async def test_other_errors_are_not_outages() -> None:
    assert not is_database_outage(IntegrityError("INSERT", None, Exception("duplicate key")))
    assert not is_database_outage(ValueError("bad input"))
    # A socket error from anything but the database driver (an upstream, say).
    assert not is_database_outage(ConnectionRefusedError(111, "refused"))


async def test_the_wrapper_turns_an_outage_into_a_503_and_leaves_the_rest() -> None:
    database = Database(await refused_connect_error())

    async def load(project_id: UUID) -> str:
        database.read()
        if project_id == OTHER:
            raise ValueError("a bug, not an outage")
        return "ok"

    wrapped = unavailable_on_outage(load, "cannot read it now")
    assert await wrapped(PROJECT) == "ok"
    database.down = True
    with pytest.raises(DatabaseUnavailableError) as raised:
        await wrapped(PROJECT)
    assert raised.value.status_code == 503
    assert raised.value.code == "database_unavailable"
    assert raised.value.headers["Retry-After"] == "5"
    database.down = False
    with pytest.raises(ValueError, match="a bug"):
        await wrapped(OTHER)


# ------------------------------------------------------------------ override keys


async def test_override_keys_survive_the_safety_net_while_the_database_is_down() -> None:
    database = Database(await refused_connect_error())
    row = LoadedOverride(
        id=uuid.uuid4(), conversation_id="conv", model_prefix="gpt", api_key="sk-own"
    )

    async def load(project_id: UUID) -> Iterable[LoadedOverride]:
        database.read()
        return [row] if project_id == PROJECT else []

    clock = Clock()
    index = OverrideIndex(unavailable_on_outage(load, "not cached"), clock=clock)
    assert (await index.match(PROJECT, "conv", "gpt-4o")) is not None
    assert await index.match(OTHER, "conv", "gpt-4o") is None
    assert database.reads == 2

    database.down = True
    index.mark_all_stale()  # the periodic safety net fires during the outage
    matched = await index.match(PROJECT, "conv", "gpt-4o")
    assert matched is not None
    assert matched.api_key == "sk-own"
    assert await index.match(OTHER, "conv", "gpt-4o") is None
    # One failed re-read, then the back-off: no query per request.
    assert database.reads == 3
    for _ in range(20):
        assert await index.match(PROJECT, "conv", "gpt-4o") is not None
    assert database.reads == 3

    clock.now += STALE_RETRY_SECONDS + 0.1
    assert await index.match(PROJECT, "conv", "gpt-4o") is not None
    assert database.reads == 4  # retried once after the back-off, still down

    # A real change drops the entry: nothing to fall back on, a clear 503.
    index.invalidate_project(PROJECT)
    with pytest.raises(DatabaseUnavailableError):
        await index.match(PROJECT, "conv", "gpt-4o")

    database.down = False
    clock.now += STALE_RETRY_SECONDS + 0.1
    assert await index.match(PROJECT, "conv", "gpt-4o") is not None
    assert index.is_cached(PROJECT)


async def test_a_never_read_project_is_a_503_not_an_internal_error() -> None:
    database = Database(await refused_connect_error())
    database.down = True

    async def load(project_id: UUID) -> Iterable[LoadedOverride]:
        database.read()
        return []

    index = OverrideIndex(unavailable_on_outage(load, "not cached"))
    with pytest.raises(DatabaseUnavailableError):
        await index.match(PROJECT, "conv", "gpt-4o")
    assert not index.is_cached(PROJECT)


# ------------------------------------------------------------------ custom LLMs


def _stored(project_id: UUID, name: str) -> StoredLlm:
    return StoredLlm(
        id=uuid.uuid4(),
        project_id=project_id,
        name=name,
        template="custom",
        base_url="http://127.0.0.1:9/v1",
        model="upstream-model",
        auth_scheme="bearer",
        provider="custom",
        max_input_tokens=1000,
        max_output_tokens=100,
        enabled=True,
        secret_id=uuid.uuid4(),
        api_key_encrypted=None,
    )


async def test_custom_llms_and_their_opened_keys_survive_the_safety_net() -> None:
    database = Database(await refused_connect_error())
    rows = [_stored(PROJECT, "bob"), _stored(PROJECT, "carol")]

    async def load(project_id: UUID) -> Sequence[StoredLlm]:
        database.read()
        return rows if project_id == PROJECT else []

    async def reveal(project_id: UUID, secret_id: UUID) -> str:
        database.read()
        return f"key-{secret_id}"

    clock = Clock()
    directory = CustomLlmDirectory(
        unavailable_on_outage(load, "not cached"),
        reveal=unavailable_on_outage(reveal, "not cached"),
        open_key=lambda llm: "typed",
        clock=clock,
    )
    bob = await directory.target(PROJECT, "bob")
    assert bob is not None
    assert [e.llm_id for e in await directory.listing(PROJECT)] == ["custom:bob", "custom:carol"]

    database.down = True
    directory.mark_all_stale()
    again = await directory.target(PROJECT, "bob")
    assert again is not None
    assert again.api_key == bob.api_key
    assert [e.name for e in await directory.listing(PROJECT)] == ["bob", "carol"]
    # A key never opened needs the database: a 503, not an internal error.
    with pytest.raises(DatabaseUnavailableError):
        await directory.target(PROJECT, "carol")
    # A project never read: the same.
    with pytest.raises(DatabaseUnavailableError):
        await directory.listing(OTHER)
    # A real change (a rotated secret) drops the project: no stale key is used.
    directory.invalidate_project(PROJECT)
    with pytest.raises(DatabaseUnavailableError):
        await directory.target(PROJECT, "bob")


# ------------------------------------------------------------------ runtime catalog


async def test_the_runtime_catalog_survives_the_safety_net() -> None:
    database = Database(await refused_connect_error())

    async def load(project_id: UUID) -> ProjectModels:
        database.read()
        return ProjectModels(default_profile_id="b")

    table = ProfileTable([Profile(id="a", name="A", base_model="m"), Profile("b", "B", "m")])
    catalog = ProfileCatalog(table, unavailable_on_outage(load, "not cached"))
    assert (await catalog.resolve(PROJECT, None)).id == "b"

    database.down = True
    catalog.mark_all_stale()
    assert (await catalog.resolve(PROJECT, None)).id == "b"
    assert await catalog.is_enabled_for(PROJECT, "a")
    # A profile change meanwhile is applied on top of the stale settings (no query).
    table.put(Profile(id="c", name="C", base_model="m"))
    assert [llm.id for llm in (await catalog.catalog(PROJECT)).llms] == ["a", "b", "c"]
    with pytest.raises(DatabaseUnavailableError):
        await catalog.catalog(OTHER)
    catalog.invalidate_project(PROJECT)
    with pytest.raises(DatabaseUnavailableError):
        await catalog.resolve(PROJECT, None)


# ------------------------------------------------------------------ API keys


async def test_an_unknown_api_key_is_a_503_while_the_database_cannot_be_asked() -> None:
    database = Database(await refused_connect_error())
    known = ActiveApiKey(key_id=uuid.uuid4(), project_id=PROJECT)
    rows = {"known": known}

    async def load_all() -> Iterable[tuple[str, ActiveApiKey]]:
        database.read()
        return list(rows.items())

    async def lookup_one(key_hash: str) -> ActiveApiKey | None:
        database.read()
        return rows.get(key_hash)

    clock = Clock()
    index = ApiKeyIndex(load_all, lookup_one, outage_backoff=1.0, clock=clock)
    await index.reload()
    assert await index.resolve("random-before") is None  # a 401: the database said so

    database.down = True
    reads = database.reads
    assert await index.resolve("known") == known  # from memory
    with pytest.raises(DatabaseUnavailableError) as raised:
        await index.resolve("never-seen")
    assert raised.value.code == "database_unavailable"
    # A flood of unknown keys during the outage costs no further query.
    for attempt in range(50):
        with pytest.raises(DatabaseUnavailableError):
            await index.resolve(f"flood-{attempt}")
    assert database.reads == reads + 1
    # A key the database already answered "absent" stays a 401 (negative cache).
    assert await index.resolve("random-before") is None
    # The periodic reload fails without touching what is held.
    with pytest.raises(OperationalError):
        await index.reload()
    assert await index.resolve("known") == known

    database.down = False
    clock.now += 1.1
    assert await index.resolve("never-seen-2") is None  # a plain 401 again
