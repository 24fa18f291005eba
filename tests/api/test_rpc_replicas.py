"""Notifications across replicas: two apps on one PostgreSQL and one Redis, served on
loopback ports. Replica B's poller is stopped, so replica A polls every job; clients
connected to B must still hear each change (the ``video.jobs`` channel on Redis)."""

from __future__ import annotations

import asyncio

from app.lib.settings import Settings
from tests.support.routing import wait_healthy
from tests.support.rpc import (
    PRICE,
    Replica,
    assert_forward_only,
    call,
    read_sse,
    result,
    rpc_socket,
    serve,
    video_setup,
)
from tests.support.settings import AppFactory
from tests.support.video import Minimax, job_row, minimax, video_pg_settings

__all__ = ["minimax", "video_pg_settings"]


async def _stop_poller(replica: Replica) -> None:
    name = replica.resources.video_poller.task_name
    tasks = [t for t in asyncio.all_tasks() if t.get_name() == name]
    assert len(tasks) == 1, "the poller task of the replica was not found"
    tasks[0].cancel()
    await asyncio.gather(tasks[0], return_exceptions=True)


async def test_a_job_polled_on_one_replica_notifies_clients_of_the_other(
    video_pg_settings: Settings, make_app: AppFactory, minimax: Minimax
) -> None:
    async with (
        serve(make_app(video_pg_settings)) as a,
        serve(make_app(video_pg_settings)) as b,
    ):
        setup = await video_setup(a, minimax)
        await wait_healthy(b.http, setup.backend, within=5.0)
        await _stop_poller(b)
        headers = setup.tenant.key
        async with rpc_socket(b, headers) as on_b, rpc_socket(a, headers) as on_a:
            # Created through B (its own socket follows it), driven by A.
            params = {"model": setup.model, "prompt": "[slow:3] across replicas"}
            created = result(await on_b.call("video.create", params))
            stream_id = created["stream_id"]
            sidecar = asyncio.create_task(read_sse(b.http, headers, stream_id))
            result(await on_a.call("video.subscribe", {"stream_id": stream_id}))
            from_b = await on_b.stream(stream_id)
            from_a = await on_a.stream(stream_id)
        assert_forward_only(from_b)
        assert from_b[-1][0] == "video.done"
        assert from_b[-1][1]["cost"] == PRICE
        assert from_b[-1] == from_a[-1]
        # More than the replay: B relayed live progress that A published.
        assert len(from_b) >= 3, from_b
        streamed = await sidecar
        assert streamed.ended
        assert streamed.events[-1] == from_b[-1]
        row = await job_row(video_pg_settings, created["job_id"])
        assert row.status == "done"
        assert row.polls > 1
        # B never polled: its poller is gone, and B's answers come from the database.
        job = result(await call(b.http, headers, "video.get", {"job_id": created["job_id"]}))
        assert job["status"] == "done"
