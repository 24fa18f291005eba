"""Start-up and shutdown: check the schema, warm the caches, run background loops."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from typing import Any

import structlog
from litestar import Litestar

from app.db.migrate import ensure_migrated
from app.domain.backends.failover import FailoverControl
from app.domain.backends.seeding import seed_vllm_backends
from app.lib.tasks import every, supervise
from app.server.redis_outage import outage_watcher, restore_revocations
from app.server.resources import Resources

logger = structlog.get_logger()
KEY_INDEX_RELOAD_SECONDS = 60.0
KEY_SYNC_READY_SECONDS = 10.0
# A safety net under the routing.config events (a lost event, a replica that was
# unsubscribed for a moment); unchanged backends keep their adapters and health.
ROUTING_RELOAD_SECONDS = 60.0
# The same safety net under the profiles.config events.
PROFILE_RELOAD_SECONDS = 60.0
FAILOVER_REFRESH_SECONDS = 1.0
# The same safety net under the custom_llms.changed and secrets.changed events.
CUSTOM_LLM_RELOAD_SECONDS = 60.0
# The same safety net under the overrides.changed events (marks every project stale).
OVERRIDE_RELOAD_SECONDS = 60.0
TASK_STOP_SECONDS = 5.0


async def _flush_last_used(resources: Resources) -> None:
    try:
        await resources.last_used.flush()
    except Exception as exc:
        logger.warning("could not record API key use", error=repr(exc))


def _refresh_failover(control: FailoverControl) -> Callable[[], Awaitable[None]]:
    async def refresh() -> None:
        control.policy.refresh()

    return refresh


def build_lifespan(
    resources: Resources,
) -> Callable[[Litestar], AbstractAsyncContextManager[None]]:
    @contextlib.asynccontextmanager
    async def lifespan(_: Litestar) -> AsyncIterator[None]:
        await ensure_migrated(resources.db_config.get_engine())
        # The in-memory store forgets revocations on restart; the database does not.
        await restore_revocations(resources)
        settings = resources.settings
        # config/vllm-backends.json (or ARONA_VLLM_BACKENDS_FILE) into the database,
        # before the load below picks the rows up; a bad file stops start-up.
        seeded = await seed_vllm_backends(settings, resources.db_config, resources.vault)
        # Watch before loading, so every restored backend is probed at once; until
        # its first probe it is not routed to (fail-closed).
        resources.health_checker.watch()
        # Breakers opened and cooldowns started elsewhere apply to backends as they load.
        resources.shared_verdicts.watch()
        # Every backend's request counts, told to the other replicas as they change.
        resources.load_share.watch()
        await resources.routing_sync.load_all()
        await resources.routing_sync.announce_backends(seeded.changed)
        # Model profiles into the routing table before serving (the catalog reads
        # each project's settings on its first request).
        await resources.profile_sync.load_all()
        await resources.failover_control.load()
        # The sync task subscribes first and then loads the key index, so no change
        # made on another replica falls between the load and the subscription.
        keys_ready = asyncio.Event()
        tasks: list[asyncio.Task[Any]] = [
            asyncio.create_task(
                supervise("api-key-sync", lambda: resources.api_key_sync.run(keys_ready))
            ),
            asyncio.create_task(
                supervise(
                    "api-key-last-used",
                    lambda: every(
                        settings.last_used_flush_seconds, lambda: _flush_last_used(resources)
                    ),
                )
            ),
            asyncio.create_task(
                supervise(
                    "api-key-reload",
                    lambda: every(KEY_INDEX_RELOAD_SECONDS, resources.api_key_index.reload),
                )
            ),
            # Subscribes, then reloads: covers changes made since the load above.
            asyncio.create_task(supervise("routing-sync", resources.routing_sync.run)),
            asyncio.create_task(
                supervise(
                    "routing-reload",
                    lambda: every(ROUTING_RELOAD_SECONDS, resources.routing_sync.load_all),
                )
            ),
            # Follows evernight tunnels to new local ports (and loads backends whose
            # tunnel was down at start-up once it comes up).
            asyncio.create_task(
                supervise(
                    "evernight-keepalive",
                    lambda: every(
                        settings.evernight_keepalive_seconds,
                        resources.routing_sync.follow_tunnels,
                    ),
                )
            ),
            # Subscribes, then reloads (and drops cached project settings).
            asyncio.create_task(supervise("profile-sync", resources.profile_sync.run)),
            asyncio.create_task(
                supervise(
                    "profile-reload",
                    lambda: every(PROFILE_RELOAD_SECONDS, resources.profile_sync.load_all),
                )
            ),
            # Subscribes (custom LLM and secret changes), then marks every project stale.
            asyncio.create_task(supervise("custom-llm-sync", resources.custom_llms.sync.run)),
            asyncio.create_task(
                supervise(
                    "custom-llm-reload",
                    lambda: every(CUSTOM_LLM_RELOAD_SECONDS, resources.custom_llms.sync.reload),
                )
            ),
            # Subscribes, then marks every project's cached override keys stale.
            asyncio.create_task(supervise("override-sync", resources.override_sync.run)),
            asyncio.create_task(
                supervise(
                    "override-reload",
                    lambda: every(OVERRIDE_RELOAD_SECONDS, resources.override_sync.reload),
                )
            ),
            # Subscribes, then marks every cached quota stale (entries also expire
            # after a minute: the safety net under lost quotas.config events).
            asyncio.create_task(supervise("quota-sync", resources.quota_sync.run)),
            asyncio.create_task(supervise("health-checker", resources.health_checker.run)),
            # Redis down: seed local state; Redis back: re-sync every cache.
            *(
                [asyncio.create_task(supervise("state-store-outage", watcher))]
                if (watcher := outage_watcher(resources)) is not None
                else []
            ),
            # Applies the probe rounds other replicas claimed (models discovered included).
            asyncio.create_task(supervise("health-follow", resources.health_checker.follow)),
            # Subscribes, then re-reads the stored verdicts of every backend.
            asyncio.create_task(supervise("backend-verdicts", resources.shared_verdicts.run)),
            # The other replicas' request counts per backend (current load estimates).
            asyncio.create_task(supervise("load-follow", resources.load_share.follow)),
            asyncio.create_task(supervise("failover-switch", resources.failover_control.run)),
            # Latency samples to and from the other replicas: one failover verdict.
            asyncio.create_task(
                supervise("latency-publish", resources.shared_latency.run_publisher)
            ),
            asyncio.create_task(supervise("latency-follow", resources.shared_latency.follow)),
            # Samples age out with time, not with requests: a profile nobody is sent
            # to must still be seen recovering.
            asyncio.create_task(
                supervise(
                    "failover-refresh",
                    lambda: every(
                        FAILOVER_REFRESH_SECONDS, _refresh_failover(resources.failover_control)
                    ),
                )
            ),
            asyncio.create_task(supervise("usage-writer", resources.usage_writer.run)),
            # Panel -> agent commands addressed to sockets held here.
            asyncio.create_task(supervise("agent-hub", resources.agents.hub.run)),
            # Claims due video jobs (leases in the database) and drives them.
            asyncio.create_task(
                supervise("video-poller", resources.video_poller.run),
                name=resources.video_poller.task_name,
            ),
        ]
        try:
            try:
                await asyncio.wait_for(keys_ready.wait(), KEY_SYNC_READY_SECONDS)
            except TimeoutError:
                logger.warning("api key events unavailable; serving from a plain load")
                await resources.api_key_index.reload()
            logger.info(
                "arona started",
                api_keys=len(resources.api_key_index),
                backends=len(resources.backend_registry),
            )
            yield
        finally:
            # Before the engine goes: each closing socket marks its agent offline.
            await resources.agents.hub.close()
            for task in tasks:
                task.cancel()
            # Bounded: a loop that does not end on cancellation must not hold the
            # shutdown (and the usage flush below) hostage.
            _finished, stuck = await asyncio.wait(tasks, timeout=TASK_STOP_SECONDS)
            if stuck:
                logger.warning(
                    "background tasks did not stop when cancelled",
                    tasks=sorted(t.get_name() for t in stuck),
                )
            await resources.health_checker.close()
            await resources.shared_verdicts.close()
            await resources.load_share.close()
            # Before the engine goes: the jobs this replica held are due elsewhere at once.
            await resources.video_poller.close()
            # Before the engine is disposed below: nothing metered is lost on a
            # graceful stop.
            await resources.usage_writer.close()
            await resources.failover_control.close()
            await _flush_last_used(resources)
            await resources.routing_sync.close()
            await resources.http_client.aclose()
            await resources.custom_llms.close()
            # The SQLAlchemy plugin disposed the engine before this point (its
            # lifespan exits first); the flush above may have reopened a connection.
            await resources.db_config.get_engine().dispose()
            await resources.event_bus.close()
            await resources.state_store.close()
            if resources.redis is not None:
                await resources.redis.aclose()
            if resources.owns_password_hasher:
                resources.password_hasher.close()

    return lifespan
