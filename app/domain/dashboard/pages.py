"""The dashboard's entry points: the overview at ``/admin``, the live pages' SSE
streams, and ``DASHBOARD_ROUTES`` (every dashboard controller, for ``create_app``).

Every page, fragment and stream takes ``web_admin`` (itself, or through ``admin``, the
``AdminRequest`` built on it): not logged in is a redirect to
the login page, a user who is not a platform admin gets 403 (both rendered by
``app.server.errors`` for pages). Unsafe methods pass ``csrf_guard``.

Routes::

    GET  /admin                                   overview
    GET  /admin/backends | /admin/backend-rows | /admin/backend-form?type=
    POST /admin/backends                          register (a form per type)
    GET  /admin/backends/{name}/edit              POST /admin/backends/{name} (save)
    DELETE /admin/backends/{name}                 POST /admin/backends/{name}/probe
    GET  /admin/aliases     POST /admin/aliases   DELETE /admin/aliases/{alias}
    GET  /admin/profiles | /admin/profile-rows | /admin/profile-form
    POST /admin/profiles    GET /admin/profiles/{id}/edit    POST|DELETE /admin/profiles/{id}
    GET  /admin/failover    POST /admin/failover/switch      DELETE /admin/pins/{conversation}
    GET  /admin/projects?page=    GET /admin/projects/{id}/row | /admin/projects/{id}/quota
    POST /admin/projects/{id}/quota
    GET  /admin/usage?period=24h|7d|30d
    GET  /admin/prices | /admin/price-rows        POST /admin/prices    DELETE /admin/prices/{id}
    GET  /admin/stream/backends   GET /admin/stream/failover     (text/event-stream)
    GET  /admin/agents      POST /admin/agents      DELETE /admin/agents/{id}
    POST /admin/agent-deployments                 POST /admin/agent-deployments/{id}/stop
    GET  /admin/stream/agents                     (text/event-stream; ``FEEDS`` below)
    GET  /admin/video       GET /admin/video/rows      POST /admin/video/{job_id}/cancel
    GET  /admin/stream/video                      (text/event-stream; ``FEEDS`` below)
    GET  /admin/budgets?project=                  GET /admin/stream/budgets?project=
"""

from __future__ import annotations

import datetime
from collections.abc import Callable
from typing import Any
from uuid import UUID

from litestar import Request, Router, get
from litestar.di import Provide
from litestar.handlers import HTTPRouteHandler
from litestar.response import Template
from litestar.types import ControllerRouterHandler

from app.domain.agents.setup import Agents
from app.domain.backends.failover import FailoverControl
from app.domain.backends.services import BackendConfigService
from app.domain.conversations.pins import FallbackPinService
from app.domain.dashboard.agent_pages import AgentPages
from app.domain.dashboard.agent_views import AgentsFeed
from app.domain.dashboard.backend_pages import AliasPages, BackendPages
from app.domain.dashboard.budget_alerts import AlertHistory
from app.domain.dashboard.budget_pages import BudgetPages
from app.domain.dashboard.budget_views import BudgetsFeed
from app.domain.dashboard.common import (
    DashboardController,
    admin_page,
    db_config_of,
    template_renderer,
)
from app.domain.dashboard.failover_pages import FailoverPages
from app.domain.dashboard.failover_views import status_views
from app.domain.dashboard.feeds import BackendsFeed, FailoverFeed
from app.domain.dashboard.price_pages import PricePages
from app.domain.dashboard.profile_pages import ProfilePages
from app.domain.dashboard.project_pages import ProjectQuotaPages, UsagePages
from app.domain.dashboard.stream import EventStreamResponse, Feed, feed_events
from app.domain.dashboard.usage import usage_totals
from app.domain.dashboard.video_pages import VideoPages
from app.domain.dashboard.video_views import VideoFeed
from app.domain.projects.services import ProjectService
from app.domain.video.facade import VideoJobs
from app.domain.web.pages import WebUser
from app.lib.clock import utcnow
from app.lib.events.base import EventBus
from app.routing.profiles import ProfileTable
from app.routing.registry import BackendRegistry
from app.routing.vllm_metrics import VllmMetricsCache


class DashboardPages(DashboardController):
    @get("/")
    async def overview(
        self,
        web_admin: WebUser,
        backend_configs_service: BackendConfigService,
        backend_registry: BackendRegistry,
        failover_control: FailoverControl,
        profile_table: ProfileTable,
        pins_service: FallbackPinService,
        projects_service: ProjectService,
    ) -> Template:
        stored = await backend_configs_service.count()
        healthy = sum(1 for state in backend_registry if state.health.healthy)
        enabled, statuses = status_views(failover_control, profile_table)
        _, pins = await pins_service.page(1, 0)
        _, projects = await projects_service.visible_page(web_admin.principal, 1, 0)
        since = utcnow() - datetime.timedelta(hours=24)
        return admin_page(
            "dashboard/overview.html",
            web_admin,
            "overview",
            backends=stored,
            healthy=healthy,
            failover_enabled=enabled,
            redirecting=sum(1 for s in statuses if s.status.state == "redirecting"),
            slow=sum(1 for s in statuses if s.status.state == "slow"),
            pins=pins,
            projects=projects,
            day=await usage_totals(projects_service.repository.session, since),
        )


def _backends_feed(
    request: Request[Any, Any, Any],
    backend_registry: BackendRegistry,
    vllm_metrics: VllmMetricsCache,
) -> BackendsFeed:
    return BackendsFeed(
        db_config=db_config_of(request),
        registry=backend_registry,
        metrics=vllm_metrics,
        render=template_renderer(request),
    )


def _failover_feed(
    request: Request[Any, Any, Any], failover_control: FailoverControl, profile_table: ProfileTable
) -> FailoverFeed:
    return FailoverFeed(
        db_config=db_config_of(request),
        control=failover_control,
        profiles=profile_table,
        render=template_renderer(request),
    )


def _agents_feed(request: Request[Any, Any, Any], agents: Agents) -> AgentsFeed:
    return AgentsFeed(
        db_config=db_config_of(request),
        offline_seconds=agents.offline_seconds,
        render=template_renderer(request),
    )


def _video_feed(request: Request[Any, Any, Any], video_jobs: VideoJobs) -> VideoFeed:
    return VideoFeed(jobs=video_jobs, render=template_renderer(request))


def _budgets_feed(
    request: Request[Any, Any, Any], budget_alert_log: AlertHistory, project: UUID | None = None
) -> BudgetsFeed:
    return BudgetsFeed(
        history=budget_alert_log,
        db_config=db_config_of(request),
        render=template_renderer(request),
        project_id=project,
    )


# Each live page's feed, built per request from the app's dependencies.
FEEDS: dict[str, Callable[..., Feed]] = {
    "backends": _backends_feed,
    "failover": _failover_feed,
    "agents": _agents_feed,
    "video": _video_feed,
    "budgets": _budgets_feed,
}


def _stream_handler(page: str, build: Callable[..., Feed]) -> HTTPRouteHandler:
    """``GET /admin/stream/<page>``: the page's feed as an SSE stream (see
    ``app.domain.dashboard.stream``); ``web_admin`` turns away anyone else."""

    @get(
        f"/{page}",
        name=f"{page}_stream",
        dependencies={"feed": Provide(build, sync_to_thread=False)},
    )
    async def stream(web_admin: WebUser, event_bus: EventBus, feed: Feed) -> EventStreamResponse:
        return EventStreamResponse(feed_events(event_bus, feed))

    return stream


def dashboard_streams() -> Router:
    """One SSE stream per live page."""
    handlers = [_stream_handler(page, build) for page, build in FEEDS.items()]
    return Router("/admin/stream", route_handlers=handlers, include_in_schema=False)


DASHBOARD_ROUTES: tuple[ControllerRouterHandler, ...] = (
    DashboardPages,
    dashboard_streams(),
    BackendPages,
    AliasPages,
    ProfilePages,
    FailoverPages,
    ProjectQuotaPages,
    UsagePages,
    PricePages,
    AgentPages,
    VideoPages,
    BudgetPages,
)
