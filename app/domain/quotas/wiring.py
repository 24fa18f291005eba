"""The quotas area's life in the app: the admission gate, the per-project limits
cache (kept current over the ``EventBus``) and the budget threshold alerts."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from advanced_alchemy.extensions.litestar import SQLAlchemyAsyncConfig
from prometheus_client import CollectorRegistry

from app.domain.quotas.alerts import AlertSink, BudgetAlerts
from app.domain.quotas.deps import quotas_dependencies
from app.domain.quotas.gate import DEFAULT_HOLD_TTL, QuotaGate
from app.domain.quotas.limits import QuotaLimitsCache, QuotaSync, db_limits_loader
from app.lib.components import BackgroundTask, Component
from app.lib.events.base import EventBus
from app.lib.state.base import StateStore


class QuotasWiring(Component):
    name = "quotas"

    def __init__(
        self,
        *,
        db_config: SQLAlchemyAsyncConfig,
        state_store: StateStore,
        bus: EventBus,
        registry: CollectorRegistry,
        instance_id: str,
        hold_seconds: float = DEFAULT_HOLD_TTL,
        alert_sinks: Sequence[AlertSink] = (),
    ) -> None:
        self.sync = QuotaSync(QuotaLimitsCache(db_limits_loader(db_config)), bus)
        # The local receivers (project webhooks) hear each alert this replica raises.
        self.alerts = BudgetAlerts(state_store, bus, origin=instance_id, sinks=alert_sinks)
        self.gate = QuotaGate(
            state_store,
            self.sync.cache,
            registry=registry,
            hold_ttl=hold_seconds,
            alerts=self.alerts,
        )

    def provides(self) -> Mapping[str, object]:
        return {**quotas_dependencies(), "quota_gate": self.gate, "quota_sync": self.sync}

    def tasks(self) -> Sequence[BackgroundTask]:
        # Subscribes, then marks every cached quota stale (entries also expire after a
        # minute: the safety net under lost quotas.config events).
        return (BackgroundTask("quota-sync", self.sync.run),)

    async def resync_after_outage(self) -> None:
        await self.sync.reload()

    async def stop(self) -> None:
        # The last calls' settles go out before the store closes.
        await self.gate.drain()

    async def aclose(self) -> None:
        await self.alerts.aclose()
