"""Replicas' handles onto one shared state, for the ``StateStore`` / ``EventBus``
contract run against each implementation."""

from __future__ import annotations

import asyncio
import os
from uuid import uuid4

from redis.asyncio import Redis

from app.lib.events.base import EventBus
from app.lib.events.memory import MemoryEventBus
from app.lib.events.redis import RedisEventBus
from app.lib.redis_client import build_redis
from app.lib.state.base import StateStore
from app.lib.state.memory import MemoryStateStore
from app.lib.state.redis import RedisStateStore

REDIS_URL = os.environ.get("ARONA_TEST_REDIS_URL", "redis://127.0.0.1:6379/15")

BACKENDS = ["memory", "redis"]


class Harness:
    """Hands out "replicas": handles onto the same shared state, as separate
    processes would hold. In memory that is one object; on Redis each replica gets
    its own client (own connection pool), like a separate process would."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.prefix = f"test:{uuid4().hex}:"
        self._clients: list[Redis] = []
        self._memory_store = MemoryStateStore()
        self._memory_bus = MemoryEventBus(max_queue=100)

    def redis_client(self) -> Redis:
        # The production client configuration (RESP2, blocking pool), with a smaller
        # pool: the atomicity tests race 300 commands over three clients, and opening
        # ~200 sockets at once late in the suite has stalled a connection handshake
        # past the read timeout. Commands still interleave across the three clients.
        client = build_redis(REDIS_URL, max_connections=16)
        self._clients.append(client)
        return client

    def state(self) -> StateStore:
        if self.kind == "memory":
            return self._memory_store
        return RedisStateStore(self.redis_client(), prefix=self.prefix)

    def bus(self) -> EventBus:
        if self.kind == "memory":
            return self._memory_bus
        return RedisEventBus(self.redis_client(), prefix=self.prefix)

    async def cleanup(self) -> None:
        await self._memory_bus.close()
        if self.kind == "redis":
            client = self.redis_client()
            keys = [k async for k in client.scan_iter(match=self.prefix + "*")]
            if keys:
                await client.delete(*keys)
        for client in self._clients:
            await client.aclose()


class Clocked:
    """Replicas of one shared state plus a way to let time pass: a fake clock on the
    memory store (instant), real waiting on Redis, whose server clock judges expiry."""

    def __init__(self, harness: Harness) -> None:
        self.kind = harness.kind
        self._harness = harness
        self._now = 0.0
        self._memory = MemoryStateStore(clock=lambda: self._now)

    def replica(self) -> StateStore:
        if self.kind == "memory":
            return self._memory
        return self._harness.state()

    async def advance(self, seconds: float) -> None:
        if self.kind == "memory":
            self._now += seconds
        else:
            await asyncio.sleep(seconds)
