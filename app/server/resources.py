"""The per-process objects the app is built from, created once from settings.

Nothing here is a module global: ``build_resources`` returns a fresh set each call,
so tests can run several apps side by side.
"""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

from advanced_alchemy.extensions.litestar import SQLAlchemyAsyncConfig
from redis.asyncio import Redis

from app.db.config import build_db_config, install_sqlite_pragmas
from app.db.outage import unavailable_on_outage
from app.domain.accounts.authenticator import Authenticator
from app.domain.accounts.keyring import ApiKeyIndex, db_key_loaders
from app.domain.accounts.last_used import LastUsedRecorder
from app.domain.accounts.revocations import RevocationList
from app.domain.accounts.sync import ApiKeySync
from app.domain.agents.setup import Agents, build_agents
from app.domain.backends.failover import FailoverControl
from app.domain.backends.sync import RoutingConfigSync
from app.domain.custom_llms.setup import CustomLlms, build_custom_llms
from app.domain.gateway.admission import CallAdmission
from app.domain.gateway.callers import CallerResolver
from app.domain.gateway.services import GatewayService
from app.domain.overrides.index import OverrideIndex
from app.domain.overrides.sync import OverrideSync, build_override_sync
from app.domain.profiles.catalog import ProfileCatalog
from app.domain.profiles.sync import ProfileSync, build_profile_sync
from app.domain.projects.memberships import ProjectMemberships, db_membership_loader
from app.domain.quotas.gate import QuotaGate
from app.domain.quotas.limits import QuotaLimitsCache, QuotaSync, db_limits_loader
from app.domain.quotas.usage_recorder import UsageRecorder, build_usage_recorder
from app.domain.runtime.chat import RuntimeChatService
from app.domain.runtime.conversation_store import ConversationStore
from app.domain.video.facade import VideoJobs
from app.domain.video.poller import VideoPoller
from app.domain.video.prices import VideoPrices
from app.domain.video.setup import build_video
from app.domain.web.sessions import WebSessions
from app.lib.events.base import EventBus
from app.lib.events.memory import MemoryEventBus
from app.lib.events.redis import RedisEventBus
from app.lib.http import UpstreamHttp, UpstreamLimits, build_http_client
from app.lib.passwords import PasswordHasher
from app.lib.redis_client import build_redis
from app.lib.settings import Settings
from app.lib.state.base import StateStore
from app.lib.state.fallback import FallbackStateStore
from app.lib.state.memory import MemoryStateStore
from app.lib.state.redis import RedisStateStore
from app.lib.tokens import TokenService
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
from app.server.metrics import HttpMetrics


@dataclass(slots=True)
class Resources:
    settings: Settings
    db_config: SQLAlchemyAsyncConfig
    state_store: StateStore
    event_bus: EventBus
    redis: Redis | None
    vault: Vault
    token_service: TokenService
    password_hasher: PasswordHasher
    revocations: RevocationList
    api_key_index: ApiKeyIndex
    api_key_sync: ApiKeySync
    last_used: LastUsedRecorder
    authenticator: Authenticator
    callers: CallerResolver
    """Who pays for a ``/v1`` or JSON-RPC call (``app.domain.gateway.callers``)."""
    http_client: UpstreamHttp
    backend_registry: BackendRegistry
    alias_table: AliasTable
    profile_table: ProfileTable
    profile_catalog: ProfileCatalog
    """The runtime catalog and resolver (``resolve``, ``is_enabled_for``)."""
    profile_sync: ProfileSync
    custom_llms: CustomLlms
    """Project custom LLMs: ``directory`` (``target``, ``listing``), the SSRF-guarded
    ``http`` pool for their calls; see ``app.domain.custom_llms.directory``."""
    override_index: OverrideIndex
    """BYO override keys from memory (``match``); see ``app.domain.overrides.index``."""
    override_sync: OverrideSync
    health_checker: HealthChecker
    shared_verdicts: SharedVerdicts
    load_share: LoadShare
    """Requests sent to and ended at each backend, told to the other replicas."""
    shared_latency: SharedLatency
    """Latency samples sent to and taken from the other replicas (latency failover)."""
    """Breaker/cooldown transitions shared with the other replicas."""
    routing_sync: RoutingConfigSync
    usage_writer: UsageRecorder
    """``await usage_writer.record(entry)``: the Redis write-ahead stream when Redis is
    configured, the in-memory buffer otherwise; see ``app.domain.quotas.usage_recorder``."""
    quota_gate: QuotaGate
    """``await quota_gate.check(project_id)`` before an upstream call; see its module."""
    quota_sync: QuotaSync
    routing: RoutingService
    gateway: GatewayService
    failover_control: FailoverControl
    runtime_chat: RuntimeChatService
    web_sessions: WebSessions
    vllm_metrics: VllmMetricsCache
    """vLLM load as routing reads it (the dashboard shows the same readings)."""
    agents: Agents
    """GPU agents: this replica's sockets (``hub``), deploy/stop (``deployer``)."""
    video_jobs: VideoJobs
    """Video generation jobs (REST, JSON-RPC, dashboard); see ``app.domain.video.facade``."""
    video_poller: VideoPoller
    """Drives the jobs (run in the lifespan, ``close`` at shutdown)."""
    video_prices: VideoPrices
    instance_id: str
    """This process among the replicas (probe rounds, shared verdicts)."""
    metrics: HttpMetrics = field(default_factory=HttpMetrics)
    owns_password_hasher: bool = True


def _backend_factory(http_client: UpstreamHttp) -> Callable[[BackendSpec], Backend]:
    def build(spec: BackendSpec) -> Backend:
        return build_backend(spec, http_client)

    return build


def _breaker_factory(settings: Settings) -> Callable[[], CircuitBreaker]:
    def build() -> CircuitBreaker:
        return CircuitBreaker(
            threshold=settings.breaker_failure_threshold,
            open_seconds=settings.breaker_open_seconds,
        )

    return build


def build_resources(settings: Settings, password_hasher: PasswordHasher | None = None) -> Resources:
    settings.validate()
    db_config = build_db_config(settings)
    # Foreign keys (ON DELETE CASCADE of a project's keys, tokens and members) are off
    # in SQLite unless every connection turns them on.
    install_sqlite_pragmas(db_config.get_engine())
    redis: Redis | None = None
    metrics = HttpMetrics()
    state_store: StateStore
    event_bus: EventBus
    if settings.redis_url:
        redis = build_redis(settings.redis_url)
        # Redis down: pins, verdicts and sessions go on per replica (see fallback.py).
        state_store = FallbackStateStore(
            RedisStateStore(redis, prefix=settings.redis_prefix), registry=metrics.registry
        )
        event_bus = RedisEventBus(redis, prefix=f"{settings.redis_prefix}events:")
    else:
        state_store = MemoryStateStore()
        event_bus = MemoryEventBus()
    tokens = TokenService(settings.jwt_secret)
    revocations = RevocationList(state_store)
    load_all, lookup_one = db_key_loaders(db_config)
    index = ApiKeyIndex(
        load_all,
        lookup_one,
        negative_ttl=settings.negative_key_cache_ttl_seconds,
    )
    last_used = LastUsedRecorder(db_config.get_engine())
    vault = Vault(settings.vault_keys)
    http_client = build_http_client(
        connect_timeout=settings.upstream_connect_timeout_seconds,
        read_timeout=settings.upstream_read_timeout_seconds,
        limits=UpstreamLimits.of(settings),
    )
    registry = BackendRegistry(
        factory=_backend_factory(http_client), breaker_factory=_breaker_factory(settings)
    )
    aliases = AliasTable()
    vllm_metrics = VllmMetricsCache(
        fresh_seconds=settings.vllm_metrics_fresh_seconds,
        busy_seconds=settings.vllm_metrics_busy_seconds,
        expire_seconds=settings.vllm_metrics_expire_seconds,
    )
    router = Router(
        registry,
        aliases,
        AffinityStore(state_store),
        metrics=vllm_metrics,
        cooldown_seconds=settings.backend_cooldown_seconds,
        score_kind=settings.routing_score,
    )
    routing = RoutingService(registry, router)
    instance_id = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
    usage_writer = build_usage_recorder(
        settings, db_config.get_engine(), redis, registry=metrics.registry
    )
    quota_sync = QuotaSync(QuotaLimitsCache(db_limits_loader(db_config)), event_bus)
    quota_gate = QuotaGate(state_store, quota_sync.cache, registry=metrics.registry)
    profiles = ProfileTable()
    profile_sync = build_profile_sync(profiles, event_bus, db_config)
    custom_llms = build_custom_llms(settings, db_config, vault, event_bus, profile_sync.catalog)
    override_sync = build_override_sync(vault, event_bus, db_config)
    admission = CallAdmission(
        overrides=override_sync.index,
        quotas=quota_gate,
        custom=custom_llms.directory,
        custom_http=custom_llms.http,
        breaker_threshold=settings.breaker_failure_threshold,
        breaker_open_seconds=settings.breaker_open_seconds,
    )

    def on_failover_change(status: ProfileFailoverStatus) -> None:
        failover_control.status_changed(status)

    def link_has_backend(profile: Profile) -> bool:
        return router.can_serve(profile.base_model, profile.tags)

    failover_policy = FailoverPolicy(
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
    routing.on_first_token(failover_policy.record_call)
    failover_control = FailoverControl(policy=failover_policy, bus=event_bus, db_config=db_config)
    shared_latency = SharedLatency(failover_policy, event_bus, instance=instance_id)
    shared_latency.watch()
    routing_sync = RoutingConfigSync(
        registry=registry,
        aliases=aliases,
        bus=event_bus,
        vault=vault,
        db_config=db_config,
        tunnels=EvernightTunnels(BridgeClient(settings.evernight_url).connect),
    )
    authenticator = Authenticator(
        tokens=tokens,
        revocations=revocations,
        api_keys=index,
        last_used=last_used,
        admin_token=settings.admin_token,
    )
    video_jobs, video_poller, video_prices = build_video(
        settings, engine=db_config.get_engine(), routing=routing, quotas=quota_gate, bus=event_bus
    )
    return Resources(
        settings=settings,
        db_config=db_config,
        state_store=state_store,
        event_bus=event_bus,
        redis=redis,
        vault=vault,
        token_service=tokens,
        password_hasher=password_hasher or PasswordHasher(),
        owns_password_hasher=password_hasher is None,
        revocations=revocations,
        api_key_index=index,
        api_key_sync=ApiKeySync(index, event_bus),
        last_used=last_used,
        authenticator=authenticator,
        callers=CallerResolver(
            authenticator,
            ProjectMemberships(
                unavailable_on_outage(
                    db_membership_loader(db_config), "project memberships cannot be read"
                )
            ),
        ),
        http_client=http_client,
        backend_registry=registry,
        alias_table=aliases,
        profile_table=profiles,
        profile_catalog=profile_sync.catalog,
        profile_sync=profile_sync,
        custom_llms=custom_llms,
        override_index=override_sync.index,
        override_sync=override_sync,
        health_checker=HealthChecker(
            registry,
            event_bus,
            interval=settings.health_interval_seconds,
            store=state_store,
            instance=instance_id,
        ),
        load_share=LoadShare(registry, event_bus, instance=instance_id),
        shared_verdicts=SharedVerdicts(
            registry, router, state_store, event_bus, instance=instance_id
        ),
        shared_latency=shared_latency,
        instance_id=instance_id,
        routing_sync=routing_sync,
        agents=build_agents(
            settings, db_config=db_config, bus=event_bus, vault=vault, routing_sync=routing_sync
        ),
        usage_writer=usage_writer,
        quota_gate=quota_gate,
        quota_sync=quota_sync,
        metrics=metrics,
        routing=routing,
        gateway=GatewayService(routing, usage_writer, admission),
        failover_control=failover_control,
        runtime_chat=RuntimeChatService(
            routing=routing,
            profiles=profiles,
            catalog=profile_sync.catalog,
            failover=failover_policy,
            conversations=ConversationStore(db_config),
            usage=usage_writer,
            admission=admission,
        ),
        web_sessions=WebSessions(state_store, idle_seconds=settings.session_idle_seconds),
        vllm_metrics=vllm_metrics,
        video_jobs=video_jobs,
        video_poller=video_poller,
        video_prices=video_prices,
    )
