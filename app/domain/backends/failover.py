"""Latency failover, the operator side: the global switch and the live status.

The switch is a row in ``platform_settings`` (every replica reads it at start-up and
again whenever another replica announces a change on the ``failover`` channel). The
policy itself lives in ``app.routing.failover``; its status changes are published on
the same channel for the dashboard. Latency samples are per replica (each replica
judges the upstreams it talks to); the switch is cluster-wide.

Event shapes (the bus adds ``channel``)::

    {"kind": "switch", "enabled": bool, "origin": "<replica id>"}
    {"kind": "status", "profileId", "state", "target", "since", "origin"}
"""

from __future__ import annotations

import asyncio
import datetime
from uuid import uuid4

import structlog
from advanced_alchemy.extensions.litestar import SQLAlchemyAsyncConfig
from advanced_alchemy.repository import SQLAlchemyAsyncRepository
from advanced_alchemy.service import SQLAlchemyAsyncRepositoryService
from litestar import Controller, get, put

from app.db.models import PlatformSetting
from app.domain.accounts.principals import Principal
from app.domain.backends.deps import platform_admin
from app.domain.bodies import Camel, Strict
from app.domain.races import retry_raced
from app.lib.events.base import Event, EventBus
from app.lib.events.follow import follow
from app.routing.failover import FailoverPolicy, ProfileFailoverStatus
from app.routing.profiles import Profile, ProfileTable

CHANNEL = "failover"
SWITCH_KEY = "failover.latency.enabled"
logger = structlog.get_logger()


class PlatformSettingService(SQLAlchemyAsyncRepositoryService[PlatformSetting]):
    class Repo(SQLAlchemyAsyncRepository[PlatformSetting]):
        model_type = PlatformSetting

    repository_type = Repo

    async def read(self, key: str) -> object | None:
        row = await self.get_one_or_none(PlatformSetting.key == key)
        return None if row is None else row.value

    async def write(self, key: str, value: object) -> None:
        # Another replica can create the key between our read and insert.
        await retry_raced(self.repository.session, lambda: self._write(key, value))

    async def _write(self, key: str, value: object) -> None:
        row = await self.get_one_or_none(PlatformSetting.key == key)
        if row is None:
            await self.create(PlatformSetting(key=key, value=value), auto_commit=True)
            return
        row.value = value
        await self.update(row, auto_commit=True)


class FailoverControl:
    def __init__(
        self, *, policy: FailoverPolicy, bus: EventBus, db_config: SQLAlchemyAsyncConfig
    ) -> None:
        self.policy = policy
        self._bus = bus
        self._db_config = db_config
        self.origin = uuid4().hex
        self._publishing: set[asyncio.Task[None]] = set()

    async def load(self) -> None:
        async with PlatformSettingService.new(config=self._db_config) as service:
            stored = await service.read(SWITCH_KEY)
        self.policy.enabled = stored is not False  # on unless an admin turned it off

    async def set_enabled(self, enabled: bool) -> None:
        async with PlatformSettingService.new(config=self._db_config) as service:
            await service.write(SWITCH_KEY, enabled)
        self.policy.enabled = enabled
        self.policy.refresh()
        await self._publish({"kind": "switch", "enabled": enabled})

    def status_changed(self, status: ProfileFailoverStatus) -> None:
        """The policy's ``on_change`` hook: called from request handling, so the
        publish runs as a task instead of delaying the request."""
        event: Event = {
            "kind": "status",
            "profileId": status.profile_id,
            "state": status.state,
            "target": status.target,
            "since": status.since,
        }
        logger.info("latency failover status changed", **event)
        task = asyncio.get_running_loop().create_task(self._publish(event))
        self._publishing.add(task)
        task.add_done_callback(self._publishing.discard)

    async def _publish(self, event: Event) -> None:
        try:
            await self._bus.publish(CHANNEL, {**event, "origin": self.origin})
        except Exception as exc:  # a hint channel: the change itself has happened
            logger.warning("could not publish a failover change", error=repr(exc))

    async def run(self) -> None:
        """Follow other replicas' switch changes until cancelled."""
        await follow(self._bus, CHANNEL, reload=self.load, apply=self._apply)

    async def _apply(self, event: Event) -> None:
        if event.get("kind") == "switch" and event.get("origin") != self.origin:
            await self.load()

    async def close(self) -> None:
        for task in list(self._publishing):
            task.cancel()
        await asyncio.gather(*self._publishing, return_exceptions=True)


class FailoverSwitch(Strict):
    enabled: bool


class ProfileFailoverOut(Camel):
    profile_id: str
    state: str
    """``ok``, ``slow`` (no usable link to redirect to) or ``redirecting``."""
    target: str | None
    since: datetime.datetime
    typical_ttft_ms: float | None
    samples: int
    slow_threshold_ms: int | None
    """The threshold in force: the profile's own, else the platform default."""
    failover_chain: list[str]


class FailoverOut(Camel):
    enabled: bool
    profiles: list[ProfileFailoverOut]


def failover_out(policy: FailoverPolicy, profiles: ProfileTable) -> FailoverOut:
    items = []
    for status in policy.statuses():
        profile = profiles.get(status.profile_id)
        items.append(
            ProfileFailoverOut(
                profile_id=status.profile_id,
                state=status.state,
                target=status.target,
                since=datetime.datetime.fromtimestamp(status.since, datetime.UTC),
                typical_ttft_ms=status.typical_ttft_ms,
                samples=status.samples,
                slow_threshold_ms=_threshold(policy, profile),
                failover_chain=[] if profile is None else list(profile.failover_chain),
            )
        )
    return FailoverOut(enabled=policy.enabled, profiles=items)


def _threshold(policy: FailoverPolicy, profile: Profile | None) -> int | None:
    """The threshold in force: the profile's own or the platform default."""
    threshold = None if profile is None else policy.threshold_ms(profile)
    return None if threshold is None else int(threshold)


class FailoverAdminController(Controller):
    path = "/api/admin/failover"
    tags = ["admin: failover"]
    dependencies = {"platform_admin": platform_admin}

    @get("/")
    async def failover_status(
        self,
        platform_admin: Principal,
        failover_control: FailoverControl,
        profile_table: ProfileTable,
    ) -> FailoverOut:
        """The switch and, per profile with a slow threshold, ok / slow / redirecting."""
        failover_control.policy.refresh()
        return failover_out(failover_control.policy, profile_table)

    @put("/")
    async def set_failover(
        self,
        data: FailoverSwitch,
        platform_admin: Principal,
        failover_control: FailoverControl,
        profile_table: ProfileTable,
    ) -> FailoverOut:
        await failover_control.set_enabled(data.enabled)
        return failover_out(failover_control.policy, profile_table)
