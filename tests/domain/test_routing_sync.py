"""``RoutingConfigSync`` against a real (SQLite) database and the in-memory bus.

The adapters are a recording stand-in built by the registry's factory: these tests
are about which specs reach the registry and which adapters get closed, not HTTP.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from advanced_alchemy.extensions.litestar import SQLAlchemyAsyncConfig

from app.db.config import build_db_config
from app.domain.backends.schemas import ValidRegistration
from app.domain.backends.services import AliasService, BackendConfigService
from app.domain.backends.sync import CHANNEL, RoutingConfigSync
from app.lib.events.memory import MemoryEventBus
from app.lib.vault import Vault
from app.routing.aliases import AliasTable
from app.routing.backends.base import Backend
from app.routing.breaker import CircuitBreaker
from app.routing.evernight import BridgeError, EvernightTunnels
from app.routing.registry import BackendRegistry
from app.routing.types import BackendSpec, ProbeResult
from tests.support.api import eventually
from tests.support.auth import fresh_database
from tests.support.settings import base_settings


class RecordingBackend(Backend):
    kind = "external"

    def __init__(self, spec: BackendSpec, closed: list[str]) -> None:
        super().__init__(spec)
        self._closed = closed

    async def probe(self) -> ProbeResult:
        return ProbeResult(healthy=True, reason="ok")

    async def aclose(self) -> None:
        self._closed.append(self.spec.name)


async def _no_bridge(node: str, service: str) -> int:
    raise BridgeError("these tests register no evernight URLs")


class Replica:
    """One process's routing objects over the shared database and bus."""

    def __init__(self, db_config: SQLAlchemyAsyncConfig, bus: MemoryEventBus, vault: Vault):
        self.closed: list[str] = []
        self.registry = BackendRegistry(factory=self._build, breaker_factory=CircuitBreaker)
        self.aliases = AliasTable()
        self.sync = RoutingConfigSync(
            registry=self.registry,
            aliases=self.aliases,
            bus=bus,
            vault=vault,
            db_config=db_config,
            tunnels=EvernightTunnels(_no_bridge),
        )

    def _build(self, spec: BackendSpec) -> Backend:
        if spec.kind == "broken":
            raise ValueError("no adapter for this kind")
        return RecordingBackend(spec, self.closed)


@pytest.fixture
async def db_config(tmp_path: Path) -> AsyncIterator[SQLAlchemyAsyncConfig]:
    async with fresh_database("sqlite", tmp_path) as settings:
        config = build_db_config(settings)
        yield config
        await config.get_engine().dispose()


@pytest.fixture
def vault() -> Vault:
    return Vault(base_settings().vault_keys)


async def register(
    db_config: SQLAlchemyAsyncConfig,
    vault: Vault,
    name: str,
    *,
    url: str = "http://127.0.0.1:1",
    kind: str = "external",
    api_key: str | None = None,
) -> None:
    registration = ValidRegistration(name=name, kind=kind, url=url, api_key=api_key, models=())
    async with BackendConfigService.new(config=db_config) as service:
        await service.register(registration, vault)


async def test_load_all_mirrors_the_database(db_config: SQLAlchemyAsyncConfig, vault: Vault):
    replica = Replica(db_config, MemoryEventBus(), vault)
    await register(db_config, vault, "a", api_key="key-a")
    await register(db_config, vault, "b")
    await register(db_config, vault, "broken", kind="broken")
    async with AliasService.new(config=db_config) as aliases:
        await aliases.set_alias("fast", "a-model")
    replica.registry.upsert(BackendSpec(name="stale", kind="external", url="http://x"))

    await replica.sync.load_all()
    assert replica.registry.names() == ["a", "b"]  # "broken" skipped, not fatal
    state = replica.registry.get("a")
    assert state is not None
    assert state.spec.api_key == "key-a"
    assert replica.closed == ["stale"]
    assert replica.aliases.resolve("fast") == "a-model"


async def test_an_unchanged_backend_keeps_its_adapter_and_health(
    db_config: SQLAlchemyAsyncConfig, vault: Vault
):
    replica = Replica(db_config, MemoryEventBus(), vault)
    await register(db_config, vault, "a", api_key="k")
    await replica.sync.load_all()
    first = replica.registry.get("a")
    await replica.sync.load_all()
    await replica.sync.reload_backend("a")
    assert replica.registry.get("a") is first
    assert replica.closed == []

    await register(db_config, vault, "a", api_key="k2")  # same name, new key
    await replica.sync.reload_backend("a")
    replaced = replica.registry.get("a")
    assert replaced is not first
    assert replaced is not None
    assert replaced.spec.api_key == "k2"
    await replica.sync.retired()
    assert replica.closed == ["a"]  # the old adapter was closed


async def test_changes_reach_other_replicas_and_not_back(
    db_config: SQLAlchemyAsyncConfig, vault: Vault
):
    bus = MemoryEventBus()
    writer, reader = Replica(db_config, bus, vault), Replica(db_config, bus, vault)
    seen: list[dict[str, object]] = []
    ready_w, ready_r = asyncio.Event(), asyncio.Event()

    async def watch() -> None:
        async with bus.subscribe(CHANNEL) as events:
            async for event in events:
                seen.append(event)

    tasks = [
        asyncio.create_task(writer.sync.run(ready_w)),
        asyncio.create_task(reader.sync.run(ready_r)),
        asyncio.create_task(watch()),
    ]
    try:
        await asyncio.wait_for(asyncio.gather(ready_w.wait(), ready_r.wait()), 5)
        await register(db_config, vault, "shared")
        await writer.sync.backend_changed("shared")
        assert writer.registry.get("shared") is not None  # applied locally at once

        async def on_reader() -> bool:
            return reader.registry.get("shared") is not None

        await eventually(on_reader, within=2)
        async with AliasService.new(config=db_config) as aliases:
            await aliases.set_alias("x", "y")
        await writer.sync.alias_changed()

        async def alias_on_reader() -> bool:
            return reader.aliases.resolve("x") == "y"

        await eventually(alias_on_reader, within=2)
        async with BackendConfigService.new(config=db_config) as service:
            await service.delete_by_name("shared")
        await writer.sync.backend_changed("shared")

        async def gone_on_reader() -> bool:
            return reader.registry.get("shared") is None

        await eventually(gone_on_reader, within=2)
        # The writer ignored its own events: "shared" was built once there and closed
        # once, by the delete.
        assert writer.closed == ["shared"]
        assert [(e["kind"], e.get("name")) for e in seen] == [
            ("backend", "shared"),
            ("aliases", None),
            ("backend", "shared"),
        ]
        assert {e["origin"] for e in seen} == {writer.sync.origin}
        assert writer.sync.origin != reader.sync.origin

        # A malformed event does not stop the subscriber.
        await bus.publish(CHANNEL, {"kind": "nonsense", "origin": "elsewhere"})
        await bus.publish(CHANNEL, {"kind": "backend", "name": 3, "origin": "elsewhere"})
        await register(db_config, vault, "after")
        await bus.publish(CHANNEL, {"kind": "backend", "name": "after", "origin": "elsewhere"})

        async def after_on_both() -> bool:
            return all(r.registry.get("after") is not None for r in (writer, reader))

        await eventually(after_on_both, within=2)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def test_close_releases_every_adapter(db_config: SQLAlchemyAsyncConfig, vault: Vault):
    replica = Replica(db_config, MemoryEventBus(), vault)
    for name in ("a", "b"):
        await register(db_config, vault, name)
    await replica.sync.load_all()
    await replica.sync.close()
    assert sorted(replica.closed) == ["a", "b"]
    assert len(replica.registry) == 0
