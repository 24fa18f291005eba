"""What the backends page shows of each backend: the admin API's ``backend_out`` (the
stored row and this replica's live state, keys never included), the vLLM load routing
reads, the score routing computes, and health changes other replicas reported."""

from __future__ import annotations

import asyncio
import datetime
from collections.abc import Sequence
from dataclasses import dataclass

import msgspec
from advanced_alchemy.extensions.litestar import SQLAlchemyAsyncConfig

from app.db.models import BackendConfig
from app.domain.backends.controllers import backend_out
from app.domain.backends.schemas import BackendOut, HealthOut
from app.domain.backends.services import BackendConfigService
from app.lib.events.base import Event
from app.routing.load import seed_score
from app.routing.registry import BackendRegistry
from app.routing.vllm_metrics import VllmLoad, VllmMetricsCache

HEALTH_STATUSES = frozenset({"healthy", "unhealthy", "unknown"})


@dataclass(frozen=True, slots=True)
class BackendView:
    out: BackendOut
    measured: bool
    """The backend publishes its load (vLLM): ``load`` and ``score`` apply."""
    load: VllmLoad | None = None
    load_error: str = ""
    score: float | None = None

    @property
    def name(self) -> str:
        return self.out.name

    @property
    def tone(self) -> str:
        """``ok`` (routable), ``bad`` (down or breaker open) or ``warn`` (in between)."""
        health, breaker = self.out.health.status, self.out.breaker.state
        if health == "unhealthy" or breaker == "open":
            return "bad"
        if health == "healthy" and breaker == "closed":
            return "ok"
        return "warn"

    @property
    def kv_cache_percent(self) -> float | None:
        if self.load is None or self.load.cache_usage is None:
            return None
        return round(self.load.cache_usage * 100, 1)


def _utc(epoch: float) -> datetime.datetime:
    return datetime.datetime.fromtimestamp(epoch, datetime.UTC)


class HealthOverlay:
    """Health changes published on ``routing.health`` by any replica; when one is newer
    than this replica's own last probe of the backend, it is what the page shows."""

    def __init__(self) -> None:
        self._seen: dict[str, HealthOut] = {}

    def note(self, event: Event) -> str | None:
        """Remember the change an event reports; returns the backend's name."""
        name, status = event.get("backend"), event.get("status")
        checked_at = event.get("checked_at")
        if not isinstance(name, str) or status not in HEALTH_STATUSES:
            return None
        if not isinstance(checked_at, int | float):
            return name
        reason = event.get("reason")
        self._seen[name] = HealthOut(
            status=str(status),
            reason=reason if isinstance(reason, str) else "",
            checked_at=_utc(float(checked_at)),
        )
        return name

    def apply(self, out: BackendOut) -> BackendOut:
        seen = self._seen.get(out.name)
        if seen is None or seen.checked_at is None:
            return out
        local = out.health.checked_at
        if local is not None and local >= seen.checked_at:
            return out
        return msgspec.structs.replace(out, health=seen)

    def forget_others(self, names: set[str]) -> None:
        for name in [n for n in self._seen if n not in names]:
            del self._seen[name]


async def stored_backends(db_config: SQLAlchemyAsyncConfig) -> list[BackendConfig]:
    """Every registered backend, by name (a short session: streams live for minutes)."""
    async with BackendConfigService.new(config=db_config) as service:
        rows = await service.get_many()
    return sorted(rows, key=lambda row: row.name)


async def backend_view(
    row: BackendConfig,
    registry: BackendRegistry,
    metrics: VllmMetricsCache,
    overlay: HealthOverlay | None = None,
) -> BackendView:
    state = registry.get(row.name)
    out = backend_out(row, state)
    if overlay is not None:
        out = overlay.apply(out)
    source = None if state is None else state.adapter.metrics_source()
    if state is None or source is None:
        return BackendView(out=out, measured=row.kind == "vllm")
    load = await metrics.load(state.name, source, state.load)
    estimate = state.load.estimate() if load is not None else None
    return BackendView(
        out=out,
        measured=True,
        load=load,
        load_error="" if load is not None else metrics.last_error(state.name) or "no reading yet",
        # The seed's score on current inputs: the reading corrected by what the
        # cluster sent and saw end since (what routing sees, whatever score it uses).
        score=seed_score(estimate) if estimate is not None else seed_score(None),
    )


async def backend_views(
    rows: Sequence[BackendConfig],
    registry: BackendRegistry,
    metrics: VllmMetricsCache,
    overlay: HealthOverlay | None = None,
) -> list[BackendView]:
    return list(
        await asyncio.gather(*(backend_view(row, registry, metrics, overlay) for row in rows))
    )
