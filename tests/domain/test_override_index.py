"""``OverrideIndex`` and ``OverrideSync``: which BYO key a request uses, from memory.

The matching and caching rules are driven directly with an in-memory loader; the
sync with the in-memory bus. Then through real apps (PostgreSQL + Redis, and SQLite):
API writes reach the app's own index at once, a warm index sends no SQL statement,
an undecryptable row is skipped without logging its key, and a change on one replica
reaches another replica's index over Redis.

The app under ``AsyncTestClient`` runs in its own thread and loop, so its index is
called there (through the client's blocking portal), never from the test's loop.
"""

from __future__ import annotations

import asyncio
import random
import uuid
from collections.abc import Iterable
from typing import Any
from uuid import UUID

import httpx
import pytest
import structlog
from sqlalchemy import select, update

from app.db.models import OverrideKey
from app.domain.overrides.index import LoadedOverride, MatchedOverride, OverrideIndex
from app.domain.overrides.sync import CHANNEL, OverrideSync
from app.lib.events.memory import MemoryEventBus
from app.lib.settings import Settings
from tests.support.api import Client, db_session, eventually, resources_of, settings_of
from tests.support.auth import http_login, http_register
from tests.support.helpers import bearer, new_project, new_user, unique_email
from tests.support.live_server import live_server
from tests.support.profiles import query_log
from tests.support.settings import AppFactory

PROJECT = uuid.UUID("11111111-1111-4111-8111-111111111111")
OTHER_PROJECT = uuid.UUID("22222222-2222-4222-8222-222222222222")


class FakeStore:
    """The database of the unit tests: overrides per project, reads counted."""

    def __init__(self) -> None:
        self.rows: dict[UUID, list[LoadedOverride]] = {}
        self.reads = 0
        self.gate: asyncio.Event | None = None
        self.fail: Exception | None = None

    def add(self, project_id: UUID, conversation: str, prefix: str) -> LoadedOverride:
        row = LoadedOverride(
            id=uuid.uuid4(),
            conversation_id=conversation,
            model_prefix=prefix,
            api_key=f"sk-{conversation}-{prefix}-{uuid.uuid4().hex[:6]}",
        )
        self.rows.setdefault(project_id, []).append(row)
        return row

    def remove(self, project_id: UUID, row: LoadedOverride) -> None:
        self.rows[project_id].remove(row)

    async def load(self, project_id: UUID) -> Iterable[LoadedOverride]:
        self.reads += 1
        if self.gate is not None:
            await self.gate.wait()
        if self.fail is not None:
            raise self.fail
        return list(self.rows.get(project_id, ()))


def _is(matched: MatchedOverride | None, row: LoadedOverride) -> bool:
    return matched is not None and (
        matched.override_id,
        matched.conversation_id,
        matched.model_prefix,
        matched.api_key,
    ) == (row.id, row.conversation_id, row.model_prefix, row.api_key)


# ------------------------------------------------------------------ matching


async def test_a_prefix_covers_longer_model_ids() -> None:
    store = FakeStore()
    row = store.add(PROJECT, "conv", "qwen-qwq-32b")
    index = OverrideIndex(store.load)
    for model in ("qwen-qwq-32b", "qwen-qwq-32b-high", "qwen-qwq-32b:latest"):
        assert _is(await index.match(PROJECT, "conv", model), row), model
    for model in ("qwen-qwq", "qwen-qwq-3", "Qwen-qwq-32b", "x-qwen-qwq-32b", ""):
        assert await index.match(PROJECT, "conv", model) is None, model
    assert store.reads == 1


async def test_the_longest_matching_prefix_wins() -> None:
    prefixes = ["qwen", "qwen-qwq", "qwen-qwq-32b", "qwen-qwq-32b-high", "llama"]
    for seed in range(5):
        random.Random(seed).shuffle(prefixes)
        store = FakeStore()
        rows = {p: store.add(PROJECT, "conv", p) for p in prefixes}
        index = OverrideIndex(store.load)
        expected = {
            "qwen-qwq-32b-high-x": "qwen-qwq-32b-high",
            "qwen-qwq-32b-high": "qwen-qwq-32b-high",
            "qwen-qwq-32b-low": "qwen-qwq-32b",
            "qwen-qwq-7b": "qwen-qwq",
            "qwen2.5": "qwen",
            "llama3": "llama",
        }
        for model, prefix in expected.items():
            assert _is(await index.match(PROJECT, "conv", model), rows[prefix]), (seed, model)
        assert await index.match(PROJECT, "conv", "mistral") is None


async def test_other_conversations_and_projects_do_not_match() -> None:
    store = FakeStore()
    mine = store.add(PROJECT, "conv-a", "gpt-4o")
    theirs = store.add(OTHER_PROJECT, "conv-b", "gpt-4o")
    index = OverrideIndex(store.load)
    assert _is(await index.match(PROJECT, "conv-a", "gpt-4o-mini"), mine)
    assert await index.match(PROJECT, "conv-b", "gpt-4o") is None
    assert await index.match(PROJECT, "conv-A", "gpt-4o") is None
    assert await index.match(PROJECT, "conv-a ", "gpt-4o") is None
    assert await index.match(OTHER_PROJECT, "conv-a", "gpt-4o") is None
    assert _is(await index.match(OTHER_PROJECT, "conv-b", "gpt-4o"), theirs)
    assert await index.match(uuid.uuid4(), "conv-a", "gpt-4o") is None


async def test_no_conversation_never_matches_and_costs_nothing() -> None:
    store = FakeStore()
    store.add(PROJECT, "", "gpt")  # cannot be created through the API; still no match
    index = OverrideIndex(store.load)
    assert await index.match(PROJECT, None, "gpt-4o") is None
    assert await index.match(PROJECT, "", "gpt-4o") is None
    assert store.reads == 0
    assert not index.is_cached(PROJECT)


async def test_a_project_without_overrides_is_cached_too() -> None:
    store = FakeStore()
    index = OverrideIndex(store.load)
    for i in range(100):
        assert await index.match(PROJECT, f"conv-{i}", "gpt-4o") is None
    assert store.reads == 1
    assert index.is_cached(PROJECT)
    assert (len(index), index.cached_overrides) == (1, 1)


async def test_the_key_stays_out_of_reprs() -> None:
    store = FakeStore()
    row = store.add(PROJECT, "conv", "gpt")
    matched = await OverrideIndex(store.load).match(PROJECT, "conv", "gpt-4o")
    assert matched is not None
    assert row.api_key not in repr(matched)
    assert row.api_key not in repr(row)
    assert str(row.id) in repr(matched)


# -------------------------------------------------------------- invalidation


async def test_invalidation_drops_one_project_or_all() -> None:
    store = FakeStore()
    a = store.add(PROJECT, "conv", "gpt")
    b = store.add(OTHER_PROJECT, "conv", "gpt")
    index = OverrideIndex(store.load)
    assert _is(await index.match(PROJECT, "conv", "gpt-4o"), a)
    assert _is(await index.match(OTHER_PROJECT, "conv", "gpt-4o"), b)
    assert store.reads == 2

    store.remove(PROJECT, a)
    longer = store.add(OTHER_PROJECT, "conv", "gpt-4o")
    # Not yet invalidated: both still served from memory.
    assert _is(await index.match(PROJECT, "conv", "gpt-4o"), a)
    index.invalidate_project(PROJECT)
    assert not index.is_cached(PROJECT)
    assert index.is_cached(OTHER_PROJECT)
    assert await index.match(PROJECT, "conv", "gpt-4o") is None
    assert _is(await index.match(OTHER_PROJECT, "conv", "gpt-4o"), b)
    assert store.reads == 3

    index.invalidate_all()
    assert (len(index), index.cached_overrides) == (0, 0)
    assert _is(await index.match(OTHER_PROJECT, "conv", "gpt-4o"), longer)
    assert store.reads == 4


async def test_concurrent_misses_share_one_read_and_a_stale_read_is_not_kept() -> None:
    store = FakeStore()
    first = store.add(PROJECT, "conv", "gpt")
    index = OverrideIndex(store.load)
    store.gate = asyncio.Event()
    waiting = [asyncio.ensure_future(index.match(PROJECT, "conv", "gpt-4o")) for _ in range(20)]
    await asyncio.sleep(0.01)
    store.gate.set()
    assert all(_is(m, first) for m in await asyncio.gather(*waiting))
    assert store.reads == 1

    # A delete lands while a read is in flight: that read's result is not cached.
    index.invalidate_project(PROJECT)
    store.gate = asyncio.Event()
    stale = asyncio.ensure_future(index.match(PROJECT, "conv", "gpt-4o"))
    await asyncio.sleep(0.01)
    store.remove(PROJECT, first)
    index.invalidate_project(PROJECT)
    store.gate.set()
    await stale  # served what it read, but not kept
    store.gate = None
    assert await index.match(PROJECT, "conv", "gpt-4o") is None
    assert store.reads == 3

    # invalidate_all guards in-flight reads the same way.
    again = store.add(PROJECT, "conv", "gpt")
    index.invalidate_all()
    store.gate = asyncio.Event()
    pending = asyncio.ensure_future(index.match(PROJECT, "conv", "gpt-4o"))
    await asyncio.sleep(0.01)
    index.invalidate_all()
    store.gate.set()
    assert _is(await pending, again)
    assert not index.is_cached(PROJECT)


async def test_a_cancelled_caller_does_not_cancel_the_shared_read() -> None:
    store = FakeStore()
    row = store.add(PROJECT, "conv", "gpt")
    index = OverrideIndex(store.load)
    store.gate = asyncio.Event()
    caller = asyncio.ensure_future(index.match(PROJECT, "conv", "gpt-4o"))
    await asyncio.sleep(0.01)
    caller.cancel()
    with pytest.raises(asyncio.CancelledError):
        await caller
    store.gate.set()
    await asyncio.sleep(0.01)
    assert index.is_cached(PROJECT)
    assert _is(await index.match(PROJECT, "conv", "gpt-4o"), row)
    assert store.reads == 1


async def test_a_failed_read_raises_and_is_not_cached() -> None:
    store = FakeStore()
    row = store.add(PROJECT, "conv", "gpt")
    index = OverrideIndex(store.load)
    store.fail = ConnectionError("database down")
    with pytest.raises(ConnectionError):
        await index.match(PROJECT, "conv", "gpt-4o")
    assert not index.is_cached(PROJECT)
    store.fail = None
    assert _is(await index.match(PROJECT, "conv", "gpt-4o"), row)
    assert store.reads == 2


async def test_the_cache_is_bounded_by_projects_and_by_overrides() -> None:
    store = FakeStore()
    projects = [uuid.uuid4() for _ in range(5)]
    index = OverrideIndex(store.load, max_projects=3)
    for project_id in projects:
        await index.match(project_id, "conv", "m")
    assert len(index) == 3
    assert [index.is_cached(p) for p in projects] == [False, False, True, True, True]

    store = FakeStore()
    heavy = uuid.uuid4()
    for i in range(6):
        store.add(heavy, f"conv-{i}", "m")
    index = OverrideIndex(store.load, max_overrides=8)
    for project_id in projects[:3]:
        await index.match(project_id, "conv", "m")  # one weight each
    assert index.cached_overrides == 3
    await index.match(heavy, "conv-0", "m")
    # 3 + 6 > 8: the oldest entry made room.
    assert index.cached_overrides == 8
    assert [index.is_cached(p) for p in projects[:3]] == [False, True, True]
    assert index.is_cached(heavy)
    # A project heavier than the whole budget is kept, alone.
    for i in range(6, 12):
        store.add(heavy, f"conv-{i}", "m")
    index.invalidate_project(heavy)
    assert index.cached_overrides == 2
    assert (await index.match(heavy, "conv-11", "m")) is not None
    assert (len(index), index.cached_overrides) == (1, 12)
    with pytest.raises(ValueError, match="at least 1"):
        OverrideIndex(store.load, max_projects=0)


# ---------------------------------------------------------------- the sync


async def test_the_sync_invalidates_here_at_once_and_on_other_replicas() -> None:
    bus = MemoryEventBus()
    store = FakeStore()
    replicas = [OverrideSync(OverrideIndex(store.load), bus) for _ in range(2)]
    a, b = replicas
    ready = [asyncio.Event(), asyncio.Event()]
    tasks = [asyncio.create_task(s.run(r)) for s, r in zip(replicas, ready, strict=True)]
    try:
        await asyncio.wait_for(asyncio.gather(*(r.wait() for r in ready)), 2)
        # Negative entries on both replicas.
        for sync in replicas:
            assert await sync.index.match(PROJECT, "conv", "gpt-4o") is None
            assert await sync.index.match(OTHER_PROJECT, "conv", "gpt-4o") is None
        assert store.reads == 4

        row = store.add(PROJECT, "conv", "gpt")
        await a.changed(PROJECT)
        # At once on the writer, without waiting for any event.
        assert not a.index.is_cached(PROJECT)
        assert _is(await a.index.match(PROJECT, "conv", "gpt-4o"), row)

        async def dropped_on_b() -> bool:
            return not b.index.is_cached(PROJECT)

        await eventually(dropped_on_b, within=5.0)
        assert _is(await b.index.match(PROJECT, "conv", "gpt-4o"), row)
        # Only that project; and A ignored its own event (its fresh entry stayed).
        assert b.index.is_cached(OTHER_PROJECT)
        await asyncio.sleep(0.05)
        assert a.index.is_cached(PROJECT)
        assert store.reads == 6

        # Malformed events are ignored and do not end the follower.
        for event in (
            {"kind": "override"},
            {"kind": "override", "projectId": "not-a-uuid"},
            {"kind": "other", "projectId": str(PROJECT)},
            {"kind": "override", "projectId": 7},
        ):
            await bus.publish(CHANNEL, event)
        store.remove(PROJECT, row)
        await a.changed(PROJECT)
        await eventually(dropped_on_b, within=5.0)
        assert await b.index.match(PROJECT, "conv", "gpt-4o") is None
        assert all(not t.done() for t in tasks)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await bus.close()


async def test_subscribing_marks_everything_cached_stale() -> None:
    bus = MemoryEventBus()
    store = FakeStore()
    sync = OverrideSync(OverrideIndex(store.load), bus)
    await sync.index.match(PROJECT, "conv", "m")
    await sync.index.match(OTHER_PROJECT, "conv", "m")
    assert len(sync.index) == 2
    ready = asyncio.Event()
    task = asyncio.create_task(sync.run(ready))
    try:
        await asyncio.wait_for(ready.wait(), 2)
        # Not current any more: the next match reads the project again...
        assert not sync.index.is_cached(PROJECT)
        assert not sync.index.is_cached(OTHER_PROJECT)
        row = store.add(PROJECT, "conv", "m")
        assert _is(await sync.index.match(PROJECT, "conv", "m"), row)
        assert sync.index.is_cached(PROJECT)
        assert store.reads == 3
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await bus.close()


# ------------------------------------------------------------ the real app


async def app_match(
    client: Client, project_id: str, conversation: str | None, model: str
) -> MatchedOverride | None:
    """``override_index.match`` run on the app's own loop."""
    index = resources_of(client).override_index
    result: MatchedOverride | None = await asyncio.to_thread(
        client.blocking_portal.call, index.match, UUID(project_id), conversation, model
    )
    return result


async def owner_and_project(client: Client) -> tuple[dict[str, str], str]:
    _, owner = await new_user(client, "owner")
    return owner, (await new_project(client, owner))["id"]


async def post_override(
    client: Any, project_id: str, headers: dict[str, str], conversation: str, model: str, key: str
) -> dict[str, Any]:
    response = await client.post(
        f"/api/projects/{project_id}/overrides",
        json={"conversationId": conversation, "modelId": model, "apiKey": key},
        headers=headers,
    )
    assert response.status_code == 201, response.text
    body: dict[str, Any] = response.json()
    return body


async def test_api_writes_reach_the_index_at_once(any_client: Client) -> None:
    client = any_client
    owner, project_id = await owner_and_project(client)
    assert await app_match(client, project_id, "conv", "qwen-qwq-32b-high") is None

    short = await post_override(client, project_id, owner, "conv", "qwen", "sk-short-0001")
    matched = await app_match(client, project_id, "conv", "qwen-qwq-32b-high")
    assert matched is not None
    assert (str(matched.override_id), matched.model_prefix, matched.api_key) == (
        short["id"],
        "qwen",
        "sk-short-0001",
    )
    assert matched.conversation_id == "conv"

    long = await post_override(client, project_id, owner, "conv", "qwen-qwq-32b", "sk-long-0002")
    matched = await app_match(client, project_id, "conv", "qwen-qwq-32b-high")
    assert matched is not None
    assert (str(matched.override_id), matched.api_key) == (long["id"], "sk-long-0002")
    assert await app_match(client, project_id, "other", "qwen-qwq-32b-high") is None
    assert await app_match(client, project_id, None, "qwen-qwq-32b-high") is None

    response = await client.delete(
        f"/api/projects/{project_id}/overrides/{long['id']}", headers=owner
    )
    assert response.status_code == 204
    matched = await app_match(client, project_id, "conv", "qwen-qwq-32b-high")
    assert matched is not None
    assert matched.api_key == "sk-short-0001"
    response = await client.delete(
        f"/api/projects/{project_id}/overrides/{short['id']}", headers=owner
    )
    assert response.status_code == 204
    assert await app_match(client, project_id, "conv", "qwen-qwq-32b-high") is None


async def test_a_warm_index_sends_no_sql(client: Client) -> None:
    owner, with_keys = await owner_and_project(client)
    _, without_keys = await owner_and_project(client)
    await post_override(client, with_keys, owner, "conv", "gpt-4o", "sk-warm-0001")

    # The app's background tasks (the video poller, the key last-used flush) share
    # the engine and may query in any window: only what reads overrides is counted.
    for project_id in (with_keys, without_keys):
        with query_log(client) as first:
            await app_match(client, project_id, "conv", "gpt-4o-mini")
        # One query, of this project's overrides only.
        assert len(first.touching("override_keys")) == 1, first.statements

    with query_log(client) as log:
        for _ in range(20):
            matched = await app_match(client, with_keys, "conv", "gpt-4o-mini")
            assert matched is not None
            assert matched.api_key == "sk-warm-0001"
            assert await app_match(client, with_keys, "other-conv", "gpt-4o") is None
            assert await app_match(client, with_keys, "conv", "llama3") is None
            assert await app_match(client, without_keys, "conv", "gpt-4o") is None
            assert await app_match(client, without_keys, None, "gpt-4o") is None
    assert log.touching("override_keys") == [], log.statements


async def test_an_undecryptable_row_is_skipped_without_logging_its_key(client: Client) -> None:
    owner, project_id = await owner_and_project(client)
    good = await post_override(client, project_id, owner, "conv", "gpt", "sk-good-key-0001")
    bad = await post_override(client, project_id, owner, "conv", "gpt-4o", "sk-moved-key-0002")
    # Copy the good row's ciphertext into the other row: bound to its own row, it
    # must not open there (and the good key must not be served for the wrong row).
    async with db_session(settings_of(client)) as session:
        sealed = await session.scalar(
            select(OverrideKey.key_encrypted).where(OverrideKey.id == UUID(good["id"]))
        )
        await session.execute(
            update(OverrideKey)
            .where(OverrideKey.id == UUID(bad["id"]))
            .values(key_encrypted=sealed)
        )
        await session.commit()
    index = resources_of(client).override_index
    await asyncio.to_thread(client.blocking_portal.call, _invalidate, index, UUID(project_id))

    with structlog.testing.capture_logs() as logs:
        matched = await app_match(client, project_id, "conv", "gpt-4o-mini")
    # The broken longer prefix is skipped; the shorter one still serves.
    assert matched is not None
    assert (str(matched.override_id), matched.api_key) == (good["id"], "sk-good-key-0001")
    [warning] = [entry for entry in logs if entry.get("override_id") == bad["id"]]
    assert warning["log_level"] == "warning"
    assert "sk-good-key-0001" not in repr(logs)
    assert "sk-moved-key-0002" not in repr(logs)


async def _invalidate(index: OverrideIndex, project_id: UUID) -> None:
    index.invalidate_project(project_id)


async def test_changes_on_one_replica_reach_the_others_index(
    pg_settings: Settings, make_app: AppFactory
) -> None:
    app_a, app_b = make_app(pg_settings), make_app(pg_settings)
    async with (
        live_server(app_a) as url_a,
        live_server(app_b) as url_b,
        httpx.AsyncClient(base_url=url_a) as a,
        httpx.AsyncClient(base_url=url_b) as b,
    ):
        email = unique_email("owner")
        assert (await http_register(a, email)).status_code == 201
        headers = bearer((await http_login(a, email)).json()["accessToken"])
        slug = f"o-{uuid.uuid4().hex[:8]}"
        project = await a.post("/api/projects", json={"name": "O", "slug": slug}, headers=headers)
        assert project.status_code == 201, project.text
        project_id = UUID(project.json()["id"])
        index_b = app_b.state.resources.override_index

        async def b_matches(key: str | None) -> None:
            async def holds() -> bool:
                matched = await index_b.match(project_id, "conv", "gpt-4o-mini")
                return (None if matched is None else matched.api_key) == key

            await eventually(holds, within=5.0)

        # B caches "no overrides" first; A's create must reach it.
        assert await index_b.match(project_id, "conv", "gpt-4o-mini") is None
        assert index_b.is_cached(project_id)
        created = await post_override(a, str(project_id), headers, "conv", "gpt", "sk-a-0001")
        await b_matches("sk-a-0001")

        # A longer prefix created on A wins on B too.
        longer = await post_override(a, str(project_id), headers, "conv", "gpt-4o", "sk-a-0002")
        await b_matches("sk-a-0002")

        # Deletions made on B reach A, and on A reach B.
        index_a = app_a.state.resources.override_index
        assert (await index_a.match(project_id, "conv", "gpt-4o")) is not None
        response = await b.delete(
            f"/api/projects/{project_id}/overrides/{longer['id']}", headers=headers
        )
        assert response.status_code == 204

        async def a_falls_back() -> bool:
            matched = await index_a.match(project_id, "conv", "gpt-4o")
            return matched is not None and matched.api_key == "sk-a-0001"

        await eventually(a_falls_back, within=5.0)
        await b_matches("sk-a-0001")
        response = await a.delete(
            f"/api/projects/{project_id}/overrides/{created['id']}", headers=headers
        )
        assert response.status_code == 204
        await b_matches(None)
