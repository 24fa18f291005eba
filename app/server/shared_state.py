"""Where replicas share state: Redis when ``ARONA_REDIS_URL`` is set, else this
process's memory (the embedded first run)."""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry
from redis.asyncio import Redis

from app.lib.events.base import EventBus
from app.lib.events.memory import MemoryEventBus
from app.lib.events.redis import RedisEventBus
from app.lib.redis_client import build_redis
from app.lib.settings import Settings
from app.lib.state.base import StateStore
from app.lib.state.fallback import FallbackStateStore
from app.lib.state.memory import MemoryStateStore
from app.lib.state.redis import RedisStateStore
from app.lib.state.script_pipe import PipeMetrics, StoreScripts


@dataclass(frozen=True, slots=True)
class SharedState:
    state_store: StateStore
    event_bus: EventBus
    redis: Redis | None = None
    redis_scripts: StoreScripts | None = None
    """The pipelined script connection the state store and the usage stream share."""


def build_shared_state(settings: Settings, registry: CollectorRegistry) -> SharedState:
    if not settings.redis_url:
        return SharedState(MemoryStateStore(), MemoryEventBus())
    redis = build_redis(settings.redis_url)
    # One pipelined connection carries the hot scripts of the state store and of the
    # usage stream, so a call's settle and its usage entry share one write.
    scripts = StoreScripts(redis)
    if scripts.pipe is not None:
        registry.register(PipeMetrics(scripts.pipe.stats))
    # Redis down: pins, verdicts and sessions go on per replica (see fallback.py).
    state_store = FallbackStateStore(
        RedisStateStore(redis, prefix=settings.redis_prefix, scripts=scripts), registry=registry
    )
    event_bus = RedisEventBus(redis, prefix=f"{settings.redis_prefix}events:")
    return SharedState(state_store, event_bus, redis, scripts)
