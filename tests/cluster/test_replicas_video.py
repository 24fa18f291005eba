"""Video job polling across three real replicas: one replica polls each job, from
submission to file; every job completes and is metered exactly once; and a job whose
poller is killed (SIGKILL, nothing released) is taken over once its lease runs out.

The fake MiniMax is served in the test process behind ``PollLog``, which records for
every poll of a task its time span, the replica process that sent it and the process
the job's lease named in the database meanwhile (see ``video_support.py``).
"""

from __future__ import annotations

import asyncio
import datetime
import time
import uuid
from collections import Counter
from pathlib import Path

import openai
import pytest

from tests.support.cluster import Cluster, Tenant, eventually, new_tenant, running_cluster, unique
from tests.support.cluster_video import (
    FINAL,
    Poll,
    WatchedMinimax,
    add_minimax_backend,
    create_job,
    get_job,
    lease_pid,
    overlapping,
    task_of,
    watched_minimax,
)

pytestmark = pytest.mark.cluster

POLL_SECONDS = 0.1
LEASE_SECONDS = 3.0
CLUSTER_ENV = {
    # Fast polls keep the module short (the claim tick follows: min(0.5 s, poll));
    # the lease is long enough that a live replica, renewing every second, never
    # loses it, and short enough that a dead one's job moves on within a test.
    "ARONA_VIDEO_POLL_SECONDS": str(POLL_SECONDS),
    "ARONA_VIDEO_LEASE_SECONDS": str(LEASE_SECONDS),
    "ARONA_VIDEO_TIMEOUT_SECONDS": "300",
}
JOBS = 6
PROCESSING_POLLS = 4
POLLS_PER_JOB = 2 + PROCESSING_POLLS + 1
"""Preparing, Queueing, the Processing polls, Success: what one poller sends."""
POLL_DELAY_SECONDS = 0.25
"""Each poll takes this long at the fake: every other replica's claim tick (0.1 s)
falls inside every step, so a lease that did not hold would show as a double poll."""


async def wait_final(sdk_jobs: list[tuple[openai.AsyncOpenAI, str]], within: float = 60.0) -> None:
    """Wait until every ``(sdk, job_id)`` reads as final through its own replica."""

    async def all_final() -> bool:
        for sdk, job_id in sdk_jobs:
            if (await get_job(sdk, job_id))["status"] not in FINAL:
                return False
        return True

    await eventually(all_final, within)


async def test_each_job_is_polled_by_exactly_one_replica_and_completes_once(
    cluster: Cluster, tenant: Tenant
) -> None:
    async with watched_minimax(cluster) as minimax:
        minimax.log.delay_seconds = POLL_DELAY_SECONDS
        # One model per job: each usage row names its job's model.
        models = [unique("video") for _ in range(JOBS)]
        await add_minimax_backend(cluster, minimax, models)
        sdks = [cluster.sdk(i, tenant.api_key) for i in range(len(cluster.replicas))]
        jobs = [
            await create_job(
                sdks[i % len(sdks)], model, f"cluster job {i} [slow:{PROCESSING_POLLS}]"
            )
            for i, model in enumerate(models)
        ]
        # Each job read through a replica other than the one that created it.
        await wait_final([(sdks[(i + 1) % len(sdks)], job["id"]) for i, job in enumerate(jobs)])
        finished = [await get_job(sdks[(i + 2) % len(sdks)], j["id"]) for i, j in enumerate(jobs)]
        assert [j["status"] for j in finished] == ["done"] * JOBS, finished

        fake, log = minimax.fake, minimax.log
        assert fake.stats.creates == JOBS  # submitted once each
        assert fake.stats.retrieves == JOBS  # one finish (file lookup) per job
        pids = {r.process.pid for r in cluster.replicas}
        pollers_per_job: list[int] = []
        for i in range(JOBS):
            task = fake.task_for(f"cluster job {i} ")
            assert task is not None
            polls = log.polls_of(task.task_id)
            # One poller's worth of polls: not repeated by replicas that thought the
            # job was theirs.
            assert task.polls == POLLS_PER_JOB, (i, task.polls)
            assert len(polls) == POLLS_PER_JOB, polls
            assert log.most_at_once[task.task_id] == 1, task.task_id
            assert overlapping(polls) == [], overlapping(polls)
            # Each poll came from a replica of the cluster, and that replica held the
            # job's lease in the database while it polled: one owner at a time.
            for poll in polls:
                assert poll.pid in pids, poll
                assert poll.lease_pid == poll.pid, poll
            pollers_per_job.append(len({p.pid for p in polls}))
        # A job stays with the replica that first claimed it, from submission to file.
        assert pollers_per_job == [1] * JOBS, pollers_per_job
        # The jobs were spread: more than one replica did the polling.
        polls_by_replica = Counter(p.pid for p in log.polls)
        assert len(polls_by_replica) >= 2, polls_by_replica
        print(
            f"polls per replica: {sorted(polls_by_replica.values())}; "
            f"replicas that polled each job: {pollers_per_job}"
        )

    rows = await cluster.fetch(
        "SELECT model_requested, status, cost, endpoint FROM usage_records"
        " WHERE api_key_id = $1 AND endpoint = 'video.generations'",
        uuid.UUID(tenant.api_key_id),
    )
    assert sorted(r["model_requested"] for r in rows) == sorted(models), rows
    assert {r["status"] for r in rows} == {200}, rows
    stored = await cluster.fetch(
        "SELECT status, progress, lease_owner, lease_expires_at, polls FROM video_jobs"
        " WHERE model = ANY($1::text[])",
        models,
    )
    assert len(stored) == JOBS
    for row in stored:
        assert (row["status"], row["progress"], row["lease_owner"]) == ("done", 100, None), row
        # polls counts the steps that rescheduled the job: every answer but the last.
        assert row["polls"] == POLLS_PER_JOB - 1, row


async def test_a_killed_pollers_job_is_taken_over_when_its_lease_runs_out(
    tmp_path: Path,
) -> None:
    # A cluster of its own: this test kills one of its replicas.
    async with (
        running_cluster(tmp_path, extra_env=CLUSTER_ENV) as cluster,
        watched_minimax(cluster) as minimax,
    ):
        await _kill_the_poller(cluster, minimax)


async def _kill_the_poller(cluster: Cluster, minimax: WatchedMinimax) -> None:
    tenant = await new_tenant(cluster.a)
    model = unique("video")
    await add_minimax_backend(cluster, minimax, [model])
    fake, log = minimax.fake, minimax.log
    job = await create_job(cluster.sdk(0, tenant.api_key), model, "orphaned [stuck]")
    task = await task_of(fake, "orphaned")

    async def polled_a_few_times() -> bool:
        return task.polls >= 3

    await eventually(polled_a_few_times, within=20)
    # The next poll of the job is held at the fake: its replica is mid-step, holding
    # the lease (and renewing it), when it is killed.
    log.hold(task.task_id)
    await asyncio.wait_for(log.held.wait(), 30)
    [row] = await cluster.fetch(
        "SELECT lease_owner FROM video_jobs WHERE provider_task_id = $1", task.task_id
    )
    assert log.held_pid is not None
    assert lease_pid(row["lease_owner"]) == log.held_pid, (row["lease_owner"], log.held_pid)
    [victim] = [r for r in cluster.replicas if r.process.pid == log.held_pid]
    survivors = [i for i, r in enumerate(cluster.replicas) if r is not victim]
    victim.process.kill()
    await asyncio.to_thread(victim.process.wait, 10)
    killed_at = time.time()
    # Nobody renews the lease now; the provider finishes the video meanwhile.
    [row] = await cluster.fetch(
        "SELECT lease_owner, lease_expires_at, status FROM video_jobs WHERE provider_task_id = $1",
        task.task_id,
    )
    assert row["status"] == "running"
    assert lease_pid(row["lease_owner"]) == victim.process.pid
    expires_at: datetime.datetime = row["lease_expires_at"]
    assert expires_at.tzinfo is not None
    task.script.stuck = False
    log.release()  # the dead replica's poll is answered into a closed socket

    survivor_pids = {cluster.replicas[i].process.pid for i in survivors}

    def after_kill() -> list[Poll]:
        return [p for p in log.polls_of(task.task_id) if p.started > killed_at]

    async def taken_over() -> bool:
        return any(p.pid in survivor_pids for p in after_kill())

    # At most a lease (renewed every third of it until the kill) plus a claim tick;
    # the slack is for a loaded machine.
    waited = await eventually(taken_over, within=LEASE_SECONDS + POLL_SECONDS + 5.0)
    sdk = cluster.sdk(survivors[0], tenant.api_key)
    await wait_final([(sdk, job["id"])], within=30)
    done = await get_job(cluster.sdk(survivors[-1], tenant.api_key), job["id"])
    assert done["status"] == "done", done
    assert done["result"]["url"].endswith(".mp4"), done

    polls = log.polls_of(task.task_id)
    first_after = after_kill()[0]
    # The job was not taken while the dead replica's lease was still valid...
    assert first_after.started > expires_at.timestamp(), (first_after, expires_at)
    # (How soon after is bounded by the wait above, and reported below.)
    late = first_after.started - expires_at.timestamp()
    assert overlapping(polls) == [], overlapping(polls)
    assert log.most_at_once[task.task_id] == 1
    for poll in polls:
        assert poll.lease_pid == poll.pid, poll
    # Once the victim is dead, only the survivors poll.
    assert all(p.pid in survivor_pids for p in after_kill()), polls
    assert fake.stats.creates == 1  # resumed, not resubmitted
    assert fake.stats.retrieves == 1  # finished once
    rows = await cluster.fetch(
        "SELECT status, cost FROM usage_records WHERE api_key_id = $1 AND model_requested = $2",
        uuid.UUID(tenant.api_key_id),
        model,
    )
    assert [r["status"] for r in rows] == [200], rows
    [row] = await cluster.fetch(
        "SELECT status, lease_owner FROM video_jobs WHERE provider_task_id = $1", task.task_id
    )
    assert (row["status"], row["lease_owner"]) == ("done", None)
    print(
        f"taken over {waited:.2f} s after the kill, {late:.2f} s after the lease ran out"
        f" (lease {LEASE_SECONDS} s, poll {POLL_SECONDS} s); {len(polls)} polls in all"
    )
