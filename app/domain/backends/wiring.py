"""The backends area's per-app objects and their life: the routing pool (registry,
aliases, router, health, verdicts and load shared with the other replicas, the sync
from the database) and latency failover."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from advanced_alchemy.extensions.litestar import SQLAlchemyAsyncConfig

from app.domain.backends.deps import backends_dependencies
from app.domain.backends.failover import FailoverControl
from app.domain.backends.seeding import seed_vllm_backends
from app.domain.backends.sync import RoutingConfigSync
from app.lib.components import BackgroundTask, Component, periodic
from app.lib.events.base import EventBus
from app.lib.http import UpstreamHttp
from app.lib.settings import Settings
from app.lib.state.base import StateStore
from app.lib.vault import Vault
from app.routing.affinity import AffinityStore
from app.routing.aliases import AliasTable
from app.routing.backends.base import Backend
from app.routing.backends.factory import build_backend
from app.routing.breaker import CircuitBreaker
from app.routing.evernight import BridgeClient, EvernightTunnels
from app.routing.failover import FailoverPolicy, ProfileFailoverStatus
from app.routing.health import HealthChecker
from app.routing.latency import LatencyTracker
from app.routing.load_share import LoadShare
from app.routing.profiles import Profile, ProfileTable
from app.routing.registry import BackendRegistry
from app.routing.router import Router
from app.routing.service import RoutingService
from app.routing.shared_latency import SharedLatency
from app.routing.shared_verdicts import SharedVerdicts
from app.routing.types import BackendSpec
from app.routing.vllm_metrics import VllmMetricsCache

# A safety net under the routing.config events (a lost event, a replica that was
# unsubscribed for a moment); unchanged backends keep their adapters and health.
ROUTING_RELOAD_SECONDS = 60.0
FAILOVER_REFRESH_SECONDS = 1.0


def backend_factory(http_client: UpstreamHttp) -> Callable[[BackendSpec], Backend]:
    def build(spec: BackendSpec) -> Backend:
        return build_backend(spec, http_client)

    return build


def breaker_factory(settings: Settings) -> Callable[[], CircuitBreaker]:
    def build() -> CircuitBreaker:
        return CircuitBreaker(
            threshold=settings.breaker_failure_threshold,
            open_seconds=settings.breaker_open_seconds,
        )

    return build


class RoutingWiring(Component):
    """The shared pool every call is routed over, kept in step with the database and
    with the other replicas."""

    name = "routing"

    def __init__(
        self,
        settings: Settings,
        *,
        db_config: SQLAlchemyAsyncConfig,
        state_store: StateStore,
        bus: EventBus,
        vault: Vault,
        http_client: UpstreamHttp,
        instance_id: str,
    ) -> None:
        self._settings = settings
        self._db_config = db_config
        self._vault = vault
        self.registry = BackendRegistry(
            factory=backend_factory(http_client), breaker_factory=breaker_factory(settings)
        )
        self.aliases = AliasTable()
        self.vllm_metrics = VllmMetricsCache(
            fresh_seconds=settings.vllm_metrics_fresh_seconds,
            busy_seconds=settings.vllm_metrics_busy_seconds,
            expire_seconds=settings.vllm_metrics_expire_seconds,
        )
        self.router = Router(
            self.registry,
            self.aliases,
            AffinityStore(state_store),
            metrics=self.vllm_metrics,
            cooldown_seconds=settings.backend_cooldown_seconds,
            score_kind=settings.routing_score,
        )
        self.routing = RoutingService(self.registry, self.router)
        self.routing_sync = RoutingConfigSync(
            registry=self.registry,
            aliases=self.aliases,
            bus=bus,
            vault=vault,
            db_config=db_config,
            tunnels=EvernightTunnels(BridgeClient(settings.evernight_url).connect),
        )
        self.health_checker = HealthChecker(
            self.registry,
            bus,
            interval=settings.health_interval_seconds,
            store=state_store,
            instance=instance_id,
        )
        self.load_share = LoadShare(self.registry, bus, instance=instance_id)
        self.shared_verdicts = SharedVerdicts(
            self.registry, self.router, state_store, bus, instance=instance_id
        )

    def provides(self) -> Mapping[str, object]:
        return {
            **backends_dependencies(),
            "backend_registry": self.registry,
            "alias_table": self.aliases,
            "health_checker": self.health_checker,
            "routing_sync": self.routing_sync,
            "vllm_metrics": self.vllm_metrics,
        }

    async def start(self) -> None:
        # config/vllm-backends.json (or ARONA_VLLM_BACKENDS_FILE) into the database,
        # before the load below picks the rows up; a bad file stops start-up.
        seeded = await seed_vllm_backends(self._settings, self._db_config, self._vault)
        # Watch before loading, so every restored backend is probed at once; until
        # its first probe it is not routed to (fail-closed).
        self.health_checker.watch()
        # Breakers opened and cooldowns started elsewhere apply to backends as they load.
        self.shared_verdicts.watch()
        # Every backend's request counts, told to the other replicas as they change.
        self.load_share.watch()
        await self.routing_sync.load_all()
        await self.routing_sync.announce_backends(seeded.changed)

    def tasks(self) -> Sequence[BackgroundTask]:
        return (
            # Subscribes, then reloads: covers changes made since the load at start-up.
            BackgroundTask("routing-sync", self.routing_sync.run),
            periodic("routing-reload", ROUTING_RELOAD_SECONDS, self.routing_sync.load_all),
            # Follows evernight tunnels to new local ports (and loads backends whose
            # tunnel was down at start-up once it comes up).
            periodic(
                "evernight-keepalive",
                self._settings.evernight_keepalive_seconds,
                self.routing_sync.follow_tunnels,
            ),
            BackgroundTask("health-checker", self.health_checker.run),
            # Applies the probe rounds other replicas claimed (models discovered included).
            BackgroundTask("health-follow", self.health_checker.follow),
            # Subscribes, then re-reads the stored verdicts of every backend.
            BackgroundTask("backend-verdicts", self.shared_verdicts.run),
            # The other replicas' request counts per backend (current load estimates).
            BackgroundTask("load-follow", self.load_share.follow),
        )

    async def resync_after_outage(self) -> None:
        await self.routing_sync.load_all()
        # Breaker verdicts stored in Redis apply again to the backends just loaded.
        await self.shared_verdicts.restore_all()

    async def aclose(self) -> None:
        await self.health_checker.close()
        await self.shared_verdicts.close()
        await self.load_share.close()
        # Retires replaced adapters; before the shared HTTP client closes.
        await self.routing_sync.close()


class FailoverWiring(Component):
    """Latency-based failover along admin-defined chains: the policy routing consults,
    its on/off switch, and latency samples shared with the other replicas."""

    name = "failover"

    def __init__(
        self,
        settings: Settings,
        *,
        db_config: SQLAlchemyAsyncConfig,
        bus: EventBus,
        routing: RoutingWiring,
        profiles: ProfileTable,
        instance_id: str,
    ) -> None:
        router = routing.router

        def on_failover_change(status: ProfileFailoverStatus) -> None:
            self.control.status_changed(status)

        def link_has_backend(profile: Profile) -> bool:
            return router.can_serve(profile.base_model, profile.tags)

        self.policy = FailoverPolicy(
            profiles,
            LatencyTracker(
                window_seconds=settings.failover_window_seconds,
                min_samples=settings.failover_min_samples,
            ),
            on_change=on_failover_change,
            has_backend=link_has_backend,
            in_pool=lambda profile, model, backend: router.in_pool(
                profile.base_model, profile.tags, model, backend
            ),
            default_threshold_ms=settings.failover_slow_threshold_ms,
        )
        routing.routing.on_first_token(self.policy.record_call)
        self.control = FailoverControl(policy=self.policy, bus=bus, db_config=db_config)
        self.shared_latency = SharedLatency(self.policy, bus, instance=instance_id)
        self.shared_latency.watch()

    def provides(self) -> Mapping[str, object]:
        return {"failover_control": self.control}

    async def start(self) -> None:
        # After the profiles are in the routing table: the switch applies to them.
        await self.control.load()

    async def _refresh(self) -> None:
        self.policy.refresh()

    def tasks(self) -> Sequence[BackgroundTask]:
        return (
            BackgroundTask("failover-switch", self.control.run),
            # Latency samples to and from the other replicas: one failover verdict.
            BackgroundTask("latency-publish", self.shared_latency.run_publisher),
            BackgroundTask("latency-follow", self.shared_latency.follow),
            # Samples age out with time, not with requests: a profile nobody is sent
            # to must still be seen recovering.
            periodic("failover-refresh", FAILOVER_REFRESH_SECONDS, self._refresh),
        )

    async def aclose(self) -> None:
        await self.control.close()
