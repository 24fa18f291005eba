"""Video jobs on a cluster of real replicas: a fake MiniMax that knows who polls it.

``PollLog`` wraps the fake MiniMax's ASGI app (it is part of the server the replicas
call over real HTTP, not a patched client). For every poll of a task it records when
the poll started and ended, which replica process sent it (the connection's client
port, looked up in ``/proc``) and which process the job's lease named in the
database while the poll ran (the poller writes ``host:pid:random`` as lease owner).
It can also slow polls down, so other replicas' claim ticks fall inside every step,
and hold the polls of one task, so a test can act while a replica is mid-step.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
import uuid
from collections import defaultdict
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg
import openai

from app.fakes.asgi_io import Receive, Scope, Send
from app.fakes.minimax_scripts import FakeTask
from app.fakes.minimax_upstream import FakeMinimax
from app.fakes.serve import serve_asgi
from tests.support.cluster import Cluster, register_backend, unique, wait_healthy_everywhere
from tests.support.video import polled_task

MINIMAX_KEY = "mm-cluster-" + "k" * 24
FINAL = ("done", "failed", "cancelled")
LOOPBACK_HEX = "0100007F"
"""127.0.0.1 as ``/proc/net/tcp`` prints it (little-endian)."""


@dataclass(frozen=True, slots=True)
class Poll:
    task_id: str
    started: float
    """Wall-clock seconds (``time.time``), comparable with the database's timestamps."""
    ended: float
    pid: int | None
    """The replica process that sent the poll (None: not one of the cluster's)."""
    lease_pid: int | None
    """The process the job's lease named while the poll was in flight."""


def lease_pid(owner: str | None) -> int | None:
    """The process id in a lease owner ``host:pid:random``."""
    if owner is None:
        return None
    parts = owner.split(":")
    return int(parts[-2]) if len(parts) >= 3 and parts[-2].isdigit() else None


def _socket_inode(local_port: int, remote_port: int) -> str | None:
    local, remote = f"{LOOPBACK_HEX}:{local_port:04X}", f"{LOOPBACK_HEX}:{remote_port:04X}"
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if len(fields) > 9 and fields[1] == local and fields[2] == remote:
            return fields[9]
    return None


def process_of_connection(client_port: int, server_port: int, pids: Iterable[int]) -> int | None:
    """Which of ``pids`` owns the loopback connection ``client_port -> server_port``."""
    inode = _socket_inode(client_port, server_port)
    if inode is None:
        return None
    target = f"socket:[{inode}]"
    for pid in pids:
        with contextlib.suppress(OSError):  # a process that just died
            for fd in Path(f"/proc/{pid}/fd").iterdir():
                with contextlib.suppress(OSError):
                    if os.readlink(fd) == target:
                        return pid
    return None


@dataclass(slots=True)
class PollLog:
    """The ASGI wrapper around the fake MiniMax (see the module docstring)."""

    app: FakeMinimax
    pool: asyncpg.Pool | None = None
    pids: list[int] = field(default_factory=list)
    """The replicas' process ids."""
    delay_seconds: float = 0.0
    """Each poll of a task waits this long before the fake answers."""
    polls: list[Poll] = field(default_factory=list)
    in_flight: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    most_at_once: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    held: asyncio.Event = field(default_factory=asyncio.Event)
    held_pid: int | None = None
    """The process whose poll is being held."""
    _holding: str | None = None
    _gate: asyncio.Event = field(default_factory=asyncio.Event)

    def hold(self, task_id: str) -> None:
        """Polls of ``task_id`` arriving from now on wait until ``release``."""
        self._holding = task_id
        self.held.clear()
        self._gate.clear()

    def release(self) -> None:
        self._holding = None
        self._gate.set()

    def polls_of(self, task_id: str) -> list[Poll]:
        return sorted((p for p in self.polls if p.task_id == task_id), key=lambda p: p.started)

    async def _lease_owner(self, task_id: str) -> str | None:
        if self.pool is None:
            return None
        try:
            owner: str | None = await self.pool.fetchval(
                "SELECT lease_owner FROM video_jobs WHERE provider_task_id = $1", task_id
            )
        except (OSError, asyncpg.PostgresError):
            return None  # recorded as no owner: the test's assertion says so
        return owner

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        task_id = polled_task(scope)
        if task_id not in self.app.tasks:  # not a poll of a task (health probes are not)
            await self.app(scope, receive, send)
            return
        started = time.time()
        self.in_flight[task_id] += 1
        self.most_at_once[task_id] = max(self.most_at_once[task_id], self.in_flight[task_id])
        pid: int | None = None
        owner: str | None = None
        try:
            client, server = scope.get("client"), scope.get("server")
            if client and server:
                pid = process_of_connection(int(client[1]), int(server[1]), self.pids)
            owner = await self._lease_owner(task_id)
            if self._holding == task_id:
                self.held_pid = pid
                self.held.set()
                await self._gate.wait()
            if self.delay_seconds:
                await asyncio.sleep(self.delay_seconds)
            await self.app(scope, receive, send)
        finally:
            self.in_flight[task_id] -= 1
            self.polls.append(Poll(task_id, started, time.time(), pid, lease_pid(owner)))


@dataclass(slots=True)
class WatchedMinimax:
    fake: FakeMinimax
    log: PollLog
    url: str


@contextlib.asynccontextmanager
async def watched_minimax(cluster: Cluster) -> AsyncIterator[WatchedMinimax]:
    """A fake MiniMax (any model, 2 Processing polls) behind a ``PollLog`` that knows
    the cluster's processes and reads its database."""
    fake = FakeMinimax(unique("minimax"), models=[], api_key=MINIMAX_KEY, processing_polls=2)
    pool = await asyncpg.create_pool(cluster.dsn, min_size=1, max_size=4)
    try:
        log = PollLog(fake, pool=pool, pids=[r.process.pid for r in cluster.replicas])
        async with serve_asgi(log) as url:
            yield WatchedMinimax(fake, log, url)
    finally:
        await pool.close()


async def add_minimax_backend(cluster: Cluster, minimax: WatchedMinimax, models: list[str]) -> str:
    """A ``minimax-cloud`` backend for ``models``, healthy on every replica."""
    name = f"mm-{uuid.uuid4().hex[:10]}"
    await register_backend(
        cluster.a,
        name,
        minimax.url,
        type="minimax-cloud",
        api_key=MINIMAX_KEY,
        models=models,
    )
    await wait_healthy_everywhere(cluster, name, within=20.0)
    return name


async def create_job(sdk: openai.AsyncOpenAI, model: str, prompt: str) -> dict[str, Any]:
    """``POST /v1/video/generations`` through the SDK's low-level client."""
    body = await sdk.post(
        "/video/generations", body={"model": model, "prompt": prompt}, cast_to=object
    )
    assert isinstance(body, dict), body
    assert body["status"] == "queued", body
    return body


async def get_job(sdk: openai.AsyncOpenAI, job_id: str) -> dict[str, Any]:
    body = await sdk.get(f"/video/generations/{job_id}", cast_to=object)
    assert isinstance(body, dict), body
    return body


async def task_of(fake: FakeMinimax, prompt_part: str, within: float = 20.0) -> FakeTask:
    """The fake's task for the job whose prompt contains ``prompt_part``, once created."""
    deadline = time.monotonic() + within
    while (task := fake.task_for(prompt_part)) is None:
        assert time.monotonic() < deadline, f"no task for {prompt_part!r} within {within}s"
        await asyncio.sleep(0.05)
    return task


def overlapping(polls: list[Poll]) -> list[tuple[Poll, Poll]]:
    """Polls (of one task) that started while an earlier one was still in flight, each
    with the earlier poll that ended last."""
    found: list[tuple[Poll, Poll]] = []
    latest: Poll | None = None
    for poll in sorted(polls, key=lambda p: p.started):
        if latest is not None and poll.started < latest.ended:
            found.append((latest, poll))
        if latest is None or poll.ended > latest.ended:
            latest = poll
    return found
