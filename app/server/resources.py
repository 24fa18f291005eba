"""The per-process objects the app is built from, created once from settings.

Nothing here is a module global: ``build_resources`` returns a fresh set each call,
so tests can run several apps side by side. Each area builds its own objects in its
``wiring.py``; this module builds the shared core and lists the areas in order.
"""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from advanced_alchemy.extensions.litestar import SQLAlchemyAsyncConfig
from redis.asyncio import Redis

from app.db.config import build_db_config, install_sqlite_pragmas
from app.db.outage import unavailable_on_outage
from app.domain.accounts.authenticator import Authenticator
from app.domain.accounts.keyring import ApiKeyIndex
from app.domain.accounts.last_used import LastUsedRecorder
from app.domain.accounts.revocations import RevocationList
from app.domain.accounts.sync import ApiKeySync
from app.domain.accounts.wiring import AccountsWiring
from app.domain.agents.setup import Agents
from app.domain.agents.wiring import AgentsWiring
from app.domain.backends.failover import FailoverControl
from app.domain.backends.sync import RoutingConfigSync
from app.domain.backends.wiring import (
    FailoverWiring,
    RoutingWiring,
    backend_factory,
    breaker_factory,
)
from app.domain.calls.admission import CallAdmission
from app.domain.calls.callers import CallerResolver
from app.domain.calls.deps import calls_dependencies
from app.domain.calls.estimate import CallEstimator
from app.domain.conversations.deps import conversations_dependencies
from app.domain.custom_llms.setup import CustomLlms
from app.domain.custom_llms.wiring import CustomLlmsWiring
from app.domain.dashboard.budget_alerts import AlertHistory
from app.domain.dashboard.wiring import DashboardWiring
from app.domain.gateway.deps import gateway_dependencies
from app.domain.gateway.services import GatewayService
from app.domain.overrides.index import OverrideIndex
from app.domain.overrides.sync import OverrideSync
from app.domain.overrides.wiring import OverridesWiring
from app.domain.prices.book import PriceBook
from app.domain.prices.wiring import PricesWiring
from app.domain.profiles.catalog import ProfileCatalog
from app.domain.profiles.sync import ProfileSync
from app.domain.profiles.wiring import ProfilesWiring
from app.domain.projects.deps import projects_dependencies
from app.domain.projects.memberships import ProjectMemberships, db_membership_loader
from app.domain.quotas.alerts import AlertSink
from app.domain.quotas.gate import QuotaGate
from app.domain.quotas.limits import QuotaSync
from app.domain.quotas.wiring import QuotasWiring
from app.domain.records import field_names
from app.domain.runtime.chat import RuntimeChatService
from app.domain.runtime.conversation_store import ConversationStore
from app.domain.secrets.deps import secrets_dependencies
from app.domain.usage.recorder import UsageRecorder
from app.domain.usage.wiring import UsageWiring
from app.domain.video.facade import VideoJobs
from app.domain.video.poller import VideoPoller
from app.domain.video.prices import VideoPrices
from app.domain.video.wiring import VideoWiring
from app.domain.web.sessions import WebSessions
from app.domain.web.wiring import WebWiring
from app.domain.webhooks.dispatcher import WebhookDispatcher
from app.domain.webhooks.wiring import WebhooksWiring
from app.lib.components import Component, Provides
from app.lib.events.base import EventBus
from app.lib.http import UpstreamHttp, UpstreamLimits, build_http_client
from app.lib.passwords import PasswordHasher
from app.lib.settings import Settings
from app.lib.state.base import StateStore
from app.lib.state.script_pipe import StoreScripts
from app.lib.tokens import TokenService
from app.lib.vault import Vault
from app.routing.aliases import AliasTable
from app.routing.direct_targets import DirectTargets
from app.routing.health import HealthChecker
from app.routing.load_share import LoadShare
from app.routing.profiles import ProfileTable
from app.routing.registry import BackendRegistry
from app.routing.service import RoutingService
from app.routing.shared_latency import SharedLatency
from app.routing.shared_verdicts import SharedVerdicts
from app.routing.vllm_metrics import VllmMetricsCache
from app.server.metrics import HttpMetrics
from app.server.shared_state import build_shared_state


@dataclass(slots=True)
class Resources:
    settings: Settings
    db_config: SQLAlchemyAsyncConfig
    state_store: StateStore
    event_bus: EventBus
    redis: Redis | None
    redis_scripts: StoreScripts | None
    """The pipelined script connection the state store and the usage stream share."""
    vault: Vault
    token_service: TokenService
    password_hasher: PasswordHasher
    revocations: RevocationList
    api_key_index: ApiKeyIndex
    api_key_sync: ApiKeySync
    last_used: LastUsedRecorder
    authenticator: Authenticator
    callers: CallerResolver
    """Who pays for a ``/v1`` or JSON-RPC call (``app.domain.calls.callers``)."""
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
    configured, the in-memory buffer otherwise; see ``app.domain.usage.recorder``."""
    quota_gate: QuotaGate
    """``await quota_gate.check(project_id)`` before an upstream call; see its module."""
    quota_sync: QuotaSync
    price_book: PriceBook
    """What calls cost, from memory (``app.domain.prices.book``); the meter's pricer."""
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
    budget_alert_log: AlertHistory
    """The newest budget threshold alerts (``app.domain.dashboard.budget_alerts``)."""
    webhook_dispatcher: WebhookDispatcher
    """Delivers threshold alerts to project webhooks (``app.domain.webhooks``)."""
    alert_sinks: list[AlertSink]
    """This replica's local receivers of the alerts it emits (``webhook_dispatcher``)."""
    instance_id: str
    """This process among the replicas (probe rounds, shared verdicts)."""
    metrics: HttpMetrics = field(default_factory=HttpMetrics)
    owns_password_hasher: bool = True
    components: tuple[Component, ...] = ()
    """Every area's wiring, in dependency order (see ``app.lib.components``); the app's
    dependencies, background tasks, outage re-sync and shutdown loop over them. The
    fields above are the same objects, named for direct use (tests, ``app.state``)."""


class CoreWiring(Component):
    """What every area is built on; first in the list, so it closes last."""

    name = "core"

    def __init__(self, resources: Resources) -> None:
        self._resources = resources

    def provides(self) -> Mapping[str, object]:
        r = self._resources
        return {
            "settings": r.settings,
            "state_store": r.state_store,
            "event_bus": r.event_bus,
            "vault": r.vault,
            "token_service": r.token_service,
            "password_hasher": r.password_hasher,
        }

    async def aclose(self) -> None:
        r = self._resources
        await r.http_client.aclose()
        # The SQLAlchemy plugin disposed the engine before this point (its lifespan
        # exits first); a flush at shutdown may have reopened a connection.
        await r.db_config.get_engine().dispose()
        await r.event_bus.close()
        await r.state_store.close()
        if r.redis_scripts is not None:
            await r.redis_scripts.close()
        if r.redis is not None:
            await r.redis.aclose()
        if r.owns_password_hasher:
            r.password_hasher.close()


def build_resources(settings: Settings, password_hasher: PasswordHasher | None = None) -> Resources:
    settings.validate()
    db_config = build_db_config(settings)
    # Foreign keys (ON DELETE CASCADE of a project's keys, tokens and members) are off
    # in SQLite unless every connection turns them on.
    install_sqlite_pragmas(db_config.get_engine())
    engine = db_config.get_engine()
    metrics = HttpMetrics()
    shared = build_shared_state(settings, metrics.registry)
    state_store, event_bus = shared.state_store, shared.event_bus
    redis, redis_scripts = shared.redis, shared.redis_scripts
    bus = event_bus
    tokens = TokenService(settings.jwt_secret)
    vault = Vault(settings.vault_keys)
    http_client = build_http_client(
        connect_timeout=settings.upstream_connect_timeout_seconds,
        read_timeout=settings.upstream_read_timeout_seconds,
        limits=UpstreamLimits.of(settings),
    )
    instance_id = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
    accounts = AccountsWiring(
        settings, db_config=db_config, state_store=state_store, bus=bus, tokens=tokens
    )
    routing = RoutingWiring(
        settings,
        db_config=db_config,
        state_store=state_store,
        bus=bus,
        vault=vault,
        http_client=http_client,
        instance_id=instance_id,
    )
    usage = UsageWiring(
        settings, engine=engine, redis=redis, registry=metrics.registry, scripts=redis_scripts
    )
    # Before quotas: the alert emitter hands each threshold alert to these sinks.
    webhooks = WebhooksWiring(
        settings,
        db_config=db_config,
        vault=vault,
        instance_id=instance_id,
        registry=metrics.registry,
    )
    alert_sinks: list[AlertSink] = [webhooks.dispatcher]
    quotas = QuotasWiring(
        db_config=db_config,
        state_store=state_store,
        bus=bus,
        registry=metrics.registry,
        instance_id=instance_id,
        hold_seconds=settings.quota_hold_seconds,
        alert_sinks=alert_sinks,
    )
    profiles = ProfilesWiring(db_config=db_config, bus=bus)
    prices = PricesWiring(db_config=db_config, bus=bus)
    custom = CustomLlmsWiring(
        settings, db_config=db_config, vault=vault, bus=bus, catalog=profiles.catalog
    )
    overrides = OverridesWiring(db_config=db_config, vault=vault, bus=bus)
    failover = FailoverWiring(
        settings,
        db_config=db_config,
        bus=bus,
        routing=routing,
        profiles=profiles.table,
        instance_id=instance_id,
    )
    web = WebWiring(settings, state_store=state_store)
    agents = AgentsWiring(
        settings, db_config=db_config, bus=bus, vault=vault, routing_sync=routing.routing_sync
    )
    # One call lifecycle for every surface: who pays (admission), then route and meter.
    admission = CallAdmission(
        overrides=overrides.index,
        quotas=quotas.gate,
        custom=custom.custom_llms.directory,
        custom_targets=DirectTargets(
            backend_factory(custom.custom_llms.http), breaker_factory(settings)
        ),
        estimator=CallEstimator(
            prices.book, default_output_tokens=settings.quota_default_output_tokens
        ),
    )
    video = VideoWiring(
        settings,
        engine=engine,
        routing=routing.routing,
        admission=admission,
        usage=usage.writer,
        bus=bus,
    )
    callers = CallerResolver(
        accounts.authenticator,
        ProjectMemberships(
            unavailable_on_outage(
                db_membership_loader(db_config), "project memberships cannot be read"
            )
        ),
    )
    runtime_chat = RuntimeChatService(
        routing=routing.routing,
        profiles=profiles.table,
        catalog=profiles.catalog,
        failover=failover.policy,
        conversations=ConversationStore(db_config),
        usage=usage.writer,
        admission=admission,
        prices=prices.book,
    )
    # Start-up and tasks in this order, stop and close in reverse (docs/architecture.md,
    # "Wiring"): the core closes last, after usage has drained into the database.
    areas = (
        accounts,
        routing,
        profiles,
        failover,
        custom,
        overrides,
        webhooks,  # before quotas, whose alerts it delivers: it stops after them
        quotas,
        prices,
        usage,
        web,
        agents,
        video,
        DashboardWiring(bus=bus, redis=redis, redis_prefix=settings.redis_prefix),
    )
    # What an area provides by a name ``Resources`` has is the object that field holds:
    # taken from the area, not named a second time here.
    fields = field_names(Resources)
    provided: dict[str, Any] = {
        name: value for area in areas for name, value in area.provides().items() if name in fields
    }
    resources = Resources(
        **provided,
        settings=settings,
        db_config=db_config,
        state_store=state_store,
        event_bus=event_bus,
        redis=redis,
        redis_scripts=redis_scripts,
        vault=vault,
        token_service=tokens,
        password_hasher=password_hasher or PasswordHasher(),
        owns_password_hasher=password_hasher is None,
        api_key_index=accounts.api_key_index,
        last_used=accounts.last_used,
        callers=callers,
        http_client=http_client,
        load_share=routing.load_share,
        shared_verdicts=routing.shared_verdicts,
        shared_latency=failover.shared_latency,
        instance_id=instance_id,
        metrics=metrics,
        routing=routing.routing,
        gateway=GatewayService(routing.routing, usage.writer, admission, prices.book),
        runtime_chat=runtime_chat,
        video_poller=video.poller,
        alert_sinks=alert_sinks,
    )
    resources.components = (
        CoreWiring(resources),
        *areas,
        Provides(
            "calls",
            {
                "runtime_chat": runtime_chat,
                **gateway_dependencies(callers, resources.gateway),
                **calls_dependencies(callers),
            },
        ),
        # Areas that provide only request-scoped services.
        Provides("projects", projects_dependencies()),
        Provides("conversations", conversations_dependencies()),
        Provides("secrets", secrets_dependencies()),
    )
    return resources
