"""Keep every replica's routing registry and alias table equal to the database.

The database is the source of truth; events on ``routing.config`` only say *what* to
re-read. A replica that writes applies the change to itself at once and publishes
an event carrying its origin id; the others re-read that backend (or the alias
table) from the database. Events are hints: a lost one is repaired by the reload
that follows every (re)subscription.

Event shapes (JSON objects, the bus adds ``channel``)::

    {"kind": "backend", "name": "<backend name>", "origin": "<replica id>"}
    {"kind": "aliases", "origin": "<replica id>"}
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
from collections.abc import Iterable
from typing import Any
from uuid import uuid4

import structlog
from advanced_alchemy.extensions.litestar import SQLAlchemyAsyncConfig

from app.db.models import BackendConfig
from app.domain.backends.services import AliasService, BackendConfigService, backend_spec
from app.lib.errors import AronaError
from app.lib.events.base import Event, EventBus
from app.lib.events.follow import follow
from app.lib.vault import Vault, VaultError
from app.routing.aliases import AliasTable
from app.routing.backends.base import Backend
from app.routing.evernight import (
    BridgeError,
    EvernightTunnels,
    EvernightUrlError,
    is_evernight,
    parse_evernight,
)
from app.routing.health import HealthChecker
from app.routing.registry import BackendRegistry, BackendState
from app.routing.types import BackendSpec

CHANNEL = "routing.config"
KIND_BACKEND = "backend"
KIND_ALIASES = "aliases"
logger = structlog.get_logger()


class EvernightUnreachableError(AronaError):
    """An ``evernight://`` URL could not be resolved by the local bridge agent."""

    status_code = 502
    default_code = "evernight_unreachable"


class UnresolvedError(Exception):
    """A stored backend cannot run on this replica now (the message says why)."""


class RoutingConfigSync:
    def __init__(
        self,
        *,
        registry: BackendRegistry,
        aliases: AliasTable,
        bus: EventBus,
        vault: Vault,
        db_config: SQLAlchemyAsyncConfig,
        tunnels: EvernightTunnels,
    ) -> None:
        self._registry = registry
        self.tunnels = tunnels
        self._aliases = aliases
        self._bus = bus
        self._vault = vault
        self._db_config = db_config
        self.origin = uuid4().hex
        """This process's id in events, so it can skip what it published itself."""
        # Serialises reloads: a local write and another replica's event for the same
        # backend must not interleave their read and apply steps out of order.
        self._lock = asyncio.Lock()
        # Rows (by name, version) already reported as unusable: the periodic reload
        # must not repeat the same error every minute.
        self._reported: dict[str, datetime.datetime] = {}
        # Replaced adapters closing in the background: an engine adapter lets the calls
        # it carries finish first, which must not hold the lock meanwhile.
        self._retiring: set[asyncio.Task[None]] = set()

    # ------------------------------------------------------------------ loading

    async def load_all(self) -> None:
        """Make the registry and alias table match the database (start-up, resync)."""
        # Read under the lock too: rows read before a concurrent local write and
        # applied after it would bring the old configuration back.
        async with self._lock:
            async with BackendConfigService.new(config=self._db_config) as service:
                rows = await service.get_many()
            async with AliasService.new(config=self._db_config) as aliases:
                targets = await aliases.targets()
            wanted = {row.name for row in rows}
            for name in self._registry.names():
                if name not in wanted:
                    await _close(self._registry.remove(name))
            for row in rows:
                await self._apply(row.name, row)
            self._aliases.replace_all(targets)
        logger.debug("routing configuration loaded", backends=len(rows), aliases=len(targets))

    async def reload_backend(self, name: str) -> None:
        async with self._lock:
            async with BackendConfigService.new(config=self._db_config) as service:
                row = await service.get_by_name(name)
            await self._apply(name, row)

    async def reload_aliases(self) -> None:
        async with self._lock:
            async with AliasService.new(config=self._db_config) as service:
                targets = await service.targets()
            self._aliases.replace_all(targets)

    async def _apply(self, name: str, row: BackendConfig | None) -> None:
        """Put ``row`` into the registry (or take ``name`` out when it is gone/unusable)."""
        if row is None:
            self._reported.pop(name, None)
            self.tunnels.untrack(name)
            await _close(self._registry.remove(name))
            return
        try:
            spec = await self._runnable_spec(row)
        except UnresolvedError as exc:
            # Fail closed for this backend only; the message names the key id or the
            # bridge's answer, never a secret. Its old adapter must not keep serving.
            if self._first_report(row):
                logger.error("backend skipped", backend=name, reason=str(exc))
            await _close(self._registry.remove(name))
            return
        current = self._registry.get(name)
        if current is not None and current.spec == spec:
            return  # unchanged: keep its health, breaker and discovered models
        same_upstream = (
            current is not None
            and spec.configured_url is not None
            and dataclasses.replace(current.spec, url=spec.url) == spec
        )
        try:
            _, old = self._registry.upsert(spec, same_upstream=same_upstream)
        except Exception as exc:
            if self._first_report(row):
                logger.error(
                    "backend skipped: no adapter could be built",
                    backend=name,
                    kind=row.kind,
                    error_type=type(exc).__name__,
                )
            await _close(self._registry.remove(name))
            return
        self._reported.pop(name, None)
        self._retire(old)

    async def _runnable_spec(self, row: BackendConfig) -> BackendSpec:
        """The spec routing runs: key decrypted, an ``evernight://`` URL resolved to its
        local tunnel port. Raises ``UnresolvedError``."""
        try:
            spec = backend_spec(row, self._vault)
        except VaultError as exc:
            self.tunnels.untrack(row.name)
            raise UnresolvedError(f"its API key cannot be decrypted: {exc}") from exc
        if not is_evernight(spec.url):
            self.tunnels.untrack(row.name)
            return spec
        try:
            address = parse_evernight(spec.url)
        except EvernightUrlError as exc:
            self.tunnels.untrack(row.name)
            raise UnresolvedError(str(exc)) from exc
        # Tracked even when unresolved: the keepalive loads it once the bridge answers.
        self.tunnels.track(row.name, address)
        try:
            port = await self.tunnels.resolve(address)
        except BridgeError as exc:
            raise UnresolvedError(str(exc)) from exc
        return dataclasses.replace(
            spec, url=address.local_url(port, spec.kind), configured_url=spec.url
        )

    def _retire(self, adapter: Backend | None) -> None:
        if adapter is None:
            return
        task = asyncio.get_running_loop().create_task(_close(adapter))
        self._retiring.add(task)
        task.add_done_callback(self._retiring.discard)

    def _first_report(self, row: BackendConfig) -> bool:
        if self._reported.get(row.name) == row.updated_at:
            return False
        self._reported[row.name] = row.updated_at
        return True

    # ------------------------------------------------------------------ tunnels

    async def verify_url(self, url: str) -> None:
        """Before a registration is stored: an ``evernight://`` URL must resolve now
        (502 ``evernight_unreachable`` otherwise). Other URLs pass."""
        if not is_evernight(url):
            return
        try:
            await self.tunnels.resolve(parse_evernight(url), fresh=True)
        except EvernightUrlError:
            return  # refused by the registration's own URL check, with its 400
        except BridgeError as exc:
            raise EvernightUnreachableError(str(exc), param="url") from exc

    async def follow_tunnels(self) -> None:
        """One keepalive round: rebuild every backend whose tunnel moved or came up."""
        for name in await self.tunnels.refresh():
            await self.reload_backend(name)

    # --------------------------------------------------------------- local writes

    async def backend_changed(self, name: str) -> None:
        """Called after this replica wrote (or deleted) backend ``name``."""
        await self.reload_backend(name)
        await self._publish({"kind": KIND_BACKEND, "name": name})

    async def backend_registered(self, name: str, health: HealthChecker) -> BackendState | None:
        """Called after this replica stored a registration of ``name`` (new or not):
        ``backend_changed``, then a probe now. A new or changed backend is probed as it
        loads; one registered again as it was stays in the registry untouched, so it is
        probed here (in the background, its result shared with the other replicas)
        instead of waiting for the next round. Returns its routing state, if loaded."""
        before = self._registry.get(name)
        await self.backend_changed(name)
        return self.probe_if_kept(name, before, health)

    def probe_if_kept(
        self, name: str, before: BackendState | None, health: HealthChecker
    ) -> BackendState | None:
        """After a registration of ``name`` was applied (``BackendConfigService``
        calls ``backend_changed``): schedule a probe if the registry kept ``before``
        (registered again as it was), as ``backend_registered`` does. Returns its
        routing state, if loaded."""
        state = self._registry.get(name)
        if state is not None and state is before:
            health.schedule(state, share=True)
        return state

    async def announce_backends(self, names: Iterable[str]) -> None:
        """Tell the other replicas about backends written before this one loaded
        (start-up seeding): ``load_all`` already applied them here."""
        for name in names:
            await self._publish({"kind": KIND_BACKEND, "name": name})

    async def alias_changed(self) -> None:
        """Called after this replica wrote or deleted an alias."""
        await self.reload_aliases()
        await self._publish({"kind": KIND_ALIASES})

    async def _publish(self, event: Event) -> None:
        try:
            await self._bus.publish(CHANNEL, {**event, "origin": self.origin})
        except Exception as exc:  # a hint channel: the write itself has succeeded
            logger.warning("could not publish a routing change", error=repr(exc))

    # --------------------------------------------------------- other replicas

    async def apply(self, event: Event) -> None:
        """Apply an event from another replica; our own are already applied."""
        if event.get("origin") == self.origin:
            return
        kind = event.get("kind")
        if kind == KIND_BACKEND and isinstance(event.get("name"), str):
            await self.reload_backend(event["name"])
        elif kind == KIND_ALIASES:
            await self.reload_aliases()
        else:
            logger.warning("ignoring malformed routing event", kind=kind)

    async def run(self, ready: asyncio.Event | None = None) -> None:
        """Follow other replicas' changes until cancelled (``app.lib.events.follow``)."""
        await follow(self._bus, CHANNEL, reload=self.load_all, apply=self.apply, ready=ready)

    async def close(self) -> None:
        """Release every adapter (shutdown)."""
        async with self._lock:
            # Together: each engine adapter may wait for its streams to finish.
            adapters = [self._registry.remove(name) for name in self._registry.names()]
            await asyncio.gather(*(_close(adapter) for adapter in adapters))
        await self.retired()

    async def retired(self) -> None:
        """Wait until every replaced adapter has closed."""
        pending: list[asyncio.Task[Any]] = list(self._retiring)
        await asyncio.gather(*pending, return_exceptions=True)


async def _close(adapter: Backend | None) -> None:
    if adapter is None:
        return
    try:
        await adapter.aclose()
    except Exception as exc:
        logger.warning("could not close a backend adapter", backend=adapter.name, error=repr(exc))
