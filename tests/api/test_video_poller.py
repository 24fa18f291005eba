"""The video poller across time and replicas: timeouts, restarts, leases, races.

Replicas are full apps on one PostgreSQL database and one Redis, served on loopback
ports in the test's event loop (so a test can cancel one replica's poller task, as a
crash would). ``PollWatch`` around the fake MiniMax counts the polls of each task in
flight at once: with leases working it never exceeds one.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import uuid
from collections.abc import AsyncIterator

import httpx
import pytest
from litestar import Litestar
from sqlalchemy import delete
from sqlalchemy.ext.asyncio import create_async_engine

from app.db.models import VideoJob
from app.domain.video.poller import VideoPoller
from app.domain.video.store import JobStore
from app.lib.clock import utcnow
from app.lib.settings import Settings
from tests.support.api import eventually
from tests.support.helpers import assert_error
from tests.support.live_server import live_server
from tests.support.routing import wait_healthy
from tests.support.settings import AppFactory, with_settings
from tests.support.video import (
    FINAL,
    Minimax,
    add_minimax_backend,
    create_job,
    job_row,
    minimax,
    new_tenant,
    unique_model,
    usage_rows,
    video_pg_settings,
    video_sqlite_settings,
    wait_status,
)

__all__ = ["minimax", "video_pg_settings", "video_sqlite_settings"]


@contextlib.asynccontextmanager
async def replica(app: Litestar) -> AsyncIterator[httpx.AsyncClient]:
    async with live_server(app) as url, httpx.AsyncClient(base_url=url, timeout=30) as client:
        yield client


def poller_of(app: Litestar) -> VideoPoller:
    poller: VideoPoller = app.state.resources.video_poller
    return poller


async def crash_poller(app: Litestar) -> None:
    """Cancel the replica's poller task as a crash would: nothing is released."""
    name = poller_of(app).task_name
    [task] = [t for t in asyncio.all_tasks() if t.get_name() == name]
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


async def test_a_job_past_the_timeout_fails_as_timed_out(
    video_pg_settings: Settings, make_app: AppFactory, minimax: Minimax
) -> None:
    settings = with_settings(video_pg_settings, video_timeout_seconds=1.0)
    async with replica(make_app(settings)) as client:
        model = unique_model()
        await add_minimax_backend(client, minimax, model)
        tenant = await new_tenant(client)
        stuck = await create_job(client, tenant.key, model, "never ends [stuck]")
        # Seen running, or already timed out if the polls were slow to look.
        await wait_status(client, tenant.key, stuck["id"], ("running", *FINAL))
        # A job whose submission keeps failing (retryably) times out as well.
        minimax.fake.control.next_markers = ["[http500]"] * 1000
        unsubmitted = await create_job(client, tenant.key, model, "never starts")
        for job in (stuck, unsubmitted):
            failed = await wait_status(client, tenant.key, job["id"], FINAL)
            assert failed["status"] == "failed", failed
            assert failed["error"] == {"message": "timed out", "code": "video_timeout"}
        assert (await job_row(settings, unsubmitted["id"])).provider_task_id is None
        usages = await usage_rows(settings, tenant.key_id, model)
        assert [(u.status, u.error_code) for u in usages] == [(504, "video_timeout")] * 2


async def test_a_restart_mid_job_resumes_polling_without_resubmitting(
    video_pg_settings: Settings, make_app: AppFactory, minimax: Minimax
) -> None:
    model = unique_model()
    async with replica(make_app(video_pg_settings)) as first:
        await add_minimax_backend(first, minimax, model)
        tenant = await new_tenant(first)
        job = await create_job(first, tenant.key, model, "survives restarts [stuck]")
        await wait_status(first, tenant.key, job["id"], ("running",))
        task = minimax.fake.task_for("survives restarts")
        assert task is not None

        async def polled() -> bool:
            return task.polls >= 3

        await eventually(polled, within=10)
    # A graceful stop gives the lease back at once.
    row = await job_row(video_pg_settings, job["id"])
    assert (row.status, row.lease_owner, row.provider_task_id) == ("running", None, task.task_id)
    polls_before = task.polls
    task.script.stuck = False  # the provider finishes while nobody polls

    async with replica(make_app(video_pg_settings)) as second:
        done = await wait_status(second, tenant.key, job["id"], FINAL)
    assert done["status"] == "done", done
    assert task.polls > polls_before
    assert minimax.fake.stats.creates == 1
    assert len(await usage_rows(video_pg_settings, tenant.key_id, model)) == 1
    assert minimax.watch.most_at_once[task.task_id] == 1


async def test_two_replicas_poll_each_job_one_at_a_time_and_meter_it_once(
    video_pg_settings: Settings, make_app: AppFactory, minimax: Minimax
) -> None:
    app_a, app_b = make_app(video_pg_settings), make_app(video_pg_settings)
    async with replica(app_a) as a, replica(app_b) as b:
        model = unique_model()
        name = await add_minimax_backend(a, minimax, model)
        await wait_healthy(b, name)
        tenant = await new_tenant(a)
        jobs = [
            await create_job(client, tenant.key, model, f"shared {i} [slow:4]")
            for i, client in enumerate((a, b, a, b, a, b))
        ]
        for job in jobs:
            done = await wait_status(b, tenant.key, job["id"], FINAL)
            assert done["status"] == "done", done
    assert minimax.fake.stats.creates == len(jobs)
    for i in range(len(jobs)):
        task = minimax.fake.task_for(f"shared {i} ")
        assert task is not None
        assert minimax.watch.most_at_once[task.task_id] == 1, task.task_id
        # Preparing, Queueing, 4 x Processing, Success: no poll was repeated by a second
        # replica that thought the job was its own.
        assert task.polls == 7
    usages = await usage_rows(video_pg_settings, tenant.key_id, model)
    assert [u.status for u in usages] == [200] * len(jobs)


async def test_a_dead_replicas_job_is_taken_over_when_its_lease_runs_out(
    video_pg_settings: Settings, make_app: AppFactory, minimax: Minimax
) -> None:
    app_a, app_b = make_app(video_pg_settings), make_app(video_pg_settings)
    async with replica(app_a) as a:
        model = unique_model()
        name = await add_minimax_backend(a, minimax, model)
        tenant = await new_tenant(a)
        job = await create_job(a, tenant.key, model, "orphaned [stuck]")
        await wait_status(a, tenant.key, job["id"], ("running",))
        task = minimax.fake.task_for("orphaned")
        assert task is not None
        # A is in the middle of a poll, holding the lease, when B starts.
        minimax.watch.hold()
        await asyncio.wait_for(minimax.watch.held.wait(), 10)
        async with replica(app_b) as b:
            await wait_healthy(b, name)
            await crash_poller(app_a)
            minimax.watch.release()
            row = await job_row(video_pg_settings, job["id"])
            assert row.lease_owner == poller_of(app_a).replica_id
            polls_at_crash = task.polls
            task.script.stuck = False
            done = await wait_status(b, tenant.key, job["id"], FINAL)
            assert done["status"] == "done", done
    assert task.polls > polls_at_crash
    assert minimax.fake.stats.creates == 1
    assert minimax.watch.most_at_once[task.task_id] == 1
    [usage] = await usage_rows(video_pg_settings, tenant.key_id, model)
    assert usage.status == 200


async def test_a_cancel_racing_a_step_wins(
    video_pg_settings: Settings, make_app: AppFactory, minimax: Minimax
) -> None:
    app = make_app(video_pg_settings)
    async with replica(app) as client:
        model = unique_model()
        await add_minimax_backend(client, minimax, model)
        tenant = await new_tenant(client)
        job = await create_job(client, tenant.key, model, "raced [stuck]")
        await wait_status(client, tenant.key, job["id"], ("running",))
        task = minimax.fake.task_for("raced")
        assert task is not None
        minimax.watch.hold()
        await asyncio.wait_for(minimax.watch.held.wait(), 10)
        # The step is waiting on the provider; the client cancels meanwhile.
        response = await client.post(
            f"/v1/video/generations/{job['id']}/cancel", headers=tenant.key
        )
        assert response.status_code == 200, response.text
        cancelled = response.json()
        # The provider then says the video is done, and the step goes on to fetch it.
        task.script.stuck = False
        task.step = 100  # the next answer is Success
        minimax.watch.release()

        async def step_over() -> bool:
            return minimax.fake.stats.retrieves == 1 and poller_of(app).stepping == 0

        await eventually(step_over, within=10)
        polls_after = task.polls
        row = await job_row(video_pg_settings, job["id"])
        assert (row.status, row.result_url, row.cost) == ("cancelled", None, None)
        assert row.progress == cancelled["progress"]
        shown = (await client.get(f"/v1/video/generations/{job['id']}", headers=tenant.key)).json()
        assert shown == cancelled | {"updated_at": shown["updated_at"]}
        # The poller goes on with other jobs; the cancelled one is never polled again.
        other = await create_job(client, tenant.key, model, "after the race")
        assert (await wait_status(client, tenant.key, other["id"], FINAL))["status"] == "done"
        assert task.polls == polls_after
        assert_error(
            await client.post(f"/v1/video/generations/{job['id']}/cancel", headers=tenant.key),
            409,
            "video_job_finished",
        )
    usages = await usage_rows(video_pg_settings, tenant.key_id, model)
    assert sorted(u.status for u in usages) == [200, 499]


@pytest.fixture(params=["postgres", "sqlite"])
def claim_settings(
    request: pytest.FixtureRequest, video_pg_settings: Settings, video_sqlite_settings: Settings
) -> Settings:
    return video_pg_settings if request.param == "postgres" else video_sqlite_settings


def _job(now: datetime.datetime, **fields: object) -> VideoJob:
    values: dict[str, object] = {
        "id": uuid.uuid4(),
        "model": "claim-test",
        "stream_id": uuid.uuid4().hex,
        "prompt": "p",
        "duration_seconds": 6.0,
        "status": "queued",
        "progress": 0,
        "polls": 0,
        "extra": {},
        "next_poll_at": now - datetime.timedelta(seconds=1),
        "created_at": now,
        "updated_at": now,
    }
    values.update(fields)
    return VideoJob(**values)


async def test_concurrent_claims_take_each_due_job_exactly_once(claim_settings: Settings) -> None:
    """The claim query alone, on both databases: several claimers at once (each with
    connections of its own) never take the same job, and they take only what is due
    and free."""
    connect_args = {"timeout": 30} if claim_settings.is_sqlite else {}
    engines = [
        create_async_engine(claim_settings.database_url, connect_args=connect_args)
        for _ in range(4)
    ]
    stores = [JobStore(engine) for engine in engines]
    now = utcnow()
    later = now + datetime.timedelta(seconds=30)
    past = now - datetime.timedelta(seconds=5)
    due = [_job(now) for _ in range(24)]
    held = _job(now, status="running", lease_owner="alive", lease_expires_at=later)
    expired = _job(now, status="running", lease_owner="dead", lease_expires_at=past)
    not_yet = _job(now, next_poll_at=later)
    finished = [_job(now, status=s) for s in ("done", "failed", "cancelled")]
    everything = [*due, held, expired, not_yet, *finished]
    try:
        for row in everything:
            await stores[0].insert(row)
        claimed: dict[uuid.UUID, list[str]] = {}
        # As the poller does: what a claimer is stepping is busy, not claimed again.
        busy: list[set[uuid.UUID]] = [set() for _ in stores]
        for _ in range(4):
            rounds = await asyncio.gather(
                *(s.claim(f"r{i}", now, later, 5, busy=busy[i]) for i, s in enumerate(stores))
            )
            for i, rows in enumerate(rounds):
                for row in rows:
                    claimed.setdefault(row.id, []).append(f"r{i}")
                    busy[i].add(row.id)
                    assert row.lease_owner == f"r{i}"
        assert set(claimed) == {row.id for row in [*due, expired]}
        assert all(len(owners) == 1 for owners in claimed.values()), claimed
        # Once an owner's lease has run out, another one may claim the job.
        stale = await stores[1].claim("late", later + datetime.timedelta(seconds=1), later, 100)
        assert {row.id for row in stale} >= {row.id for row in [*due, held, expired, not_yet]}
        assert not {row.id for row in stale} & {row.id for row in finished}
    finally:
        ids = [row.id for row in everything]
        async with engines[0].begin() as connection:
            await connection.execute(delete(VideoJob).where(VideoJob.id.in_(ids)))
        for engine in engines:
            await engine.dispose()


async def test_a_job_stays_with_its_poller_between_steps(claim_settings: Settings) -> None:
    """A rescheduled job keeps its lease past its next poll: its holder claims it again
    when it falls due, nobody else can, and once the holder is gone long enough the
    job moves on."""
    engine = create_async_engine(claim_settings.database_url)
    store = JobStore(engine)
    now = utcnow()
    lease = datetime.timedelta(seconds=30)
    job = _job(now, status="running", lease_owner="a", lease_expires_at=now + lease)
    try:
        await store.insert(job)
        assert await store.claim("b", now, now + lease, 10) == []
        assert [row.id for row in await store.claim("a", now, now + lease, 10)] == [job.id]
        # ... unless it is stepping it right now.
        assert await store.claim("a", now, now + lease, 10, busy=[job.id]) == []
        after = now + lease + datetime.timedelta(seconds=1)
        taken = await store.claim("b", after, after + lease, 10)
        assert [(row.id, row.lease_owner) for row in taken] == [(job.id, "b")]
    finally:
        async with engine.begin() as connection:
            await connection.execute(delete(VideoJob).where(VideoJob.id == job.id))
        await engine.dispose()
