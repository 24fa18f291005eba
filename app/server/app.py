"""``create_app``: assemble Litestar from settings. The only place routes and DI meet."""

from __future__ import annotations

from pathlib import Path

from advanced_alchemy.extensions.litestar import SQLAlchemyPlugin
from litestar import Litestar, asgi
from litestar.config.cors import CORSConfig
from litestar.contrib.jinja import JinjaTemplateEngine
from litestar.di import Provide
from litestar.handlers import ASGIRouteHandler, WebsocketRouteHandler
from litestar.openapi.config import OpenAPIConfig
from litestar.static_files import create_static_files_router
from litestar.template.config import TemplateConfig

from app import __version__
from app.domain.accounts.controllers import AuthController
from app.domain.agents.controllers import AgentAdminController, AgentDeploymentController
from app.domain.agents.socket import agent_socket
from app.domain.backends.controllers import AliasAdminController, BackendAdminController
from app.domain.backends.failover import FailoverAdminController
from app.domain.console.auth_pages import ConsoleAuthPages
from app.domain.console.project_pages import ProjectPages
from app.domain.console.tab_pages import TAB_CONTROLLERS
from app.domain.conversations.controllers import (
    PinAdminController,
    ProjectConversationController,
    RuntimeConversationController,
)
from app.domain.custom_llms.controllers import CustomLlmController
from app.domain.dashboard.pages import DASHBOARD_ROUTES
from app.domain.gateway.asgi import gateway_asgi_handlers
from app.domain.gateway.controllers import GatewayController
from app.domain.overrides.controllers import OverrideController
from app.domain.prices.controllers import PriceAdminController, ProjectPriceController
from app.domain.profiles.controllers import (
    ModelProfileAdminController,
    ProjectModelsController,
    RuntimeCatalogController,
)
from app.domain.projects.controllers import ProjectController
from app.domain.projects.credential_controllers import ApiKeyController, RuntimeTokenController
from app.domain.quotas.controllers import ProjectQuotaController, QuotaAdminController
from app.domain.rpc.routes import rpc_routes
from app.domain.runtime.controllers import RuntimeController
from app.domain.secrets.controllers import ProjectSecretController
from app.domain.usage.controllers import AdminUsageController, ProjectUsageController
from app.domain.video.controllers import VideoGenerationController, VideoPriceAdminController
from app.domain.webhooks.controllers import WebhookController
from app.lib.components import provided
from app.lib.logging import configure_logging
from app.lib.passwords import PasswordHasher
from app.lib.settings import Settings, load_settings
from app.server.errors import exception_handlers
from app.server.input import CheckedRequest, refuse_unstorable_parameters
from app.server.lifespan import build_lifespan
from app.server.middleware import request_context_middleware
from app.server.openapi import document_errors
from app.server.ops import ops_controller
from app.server.resources import Resources, build_resources

TEMPLATES_DIR = Path(__file__).resolve().parent.parent / "templates"
STATIC_DIR = Path(__file__).resolve().parent.parent.parent / "static"


def _constant(value: object) -> Provide:
    def provide() -> object:
        return value

    return Provide(provide, use_cache=True, sync_to_thread=False)


def _dependencies(resources: Resources) -> dict[str, Provide]:
    """What every area provides: its own providers as they are, objects as constants."""
    return {
        name: value if isinstance(value, Provide) else _constant(value)
        for name, value in provided(resources.components).items()
    }


def _gateway_routes(resources: Resources) -> list[ASGIRouteHandler]:
    chat, embeddings = gateway_asgi_handlers(
        resources.callers,
        resources.gateway,
        max_body_bytes=resources.settings.max_body_bytes,
    )
    return [
        asgi("/v1/chat/completions", copy_scope=False, name="chat_completions")(chat),
        asgi("/v1/embeddings", copy_scope=False, name="embeddings")(embeddings),
    ]


def _rpc_routes(resources: Resources) -> list[ASGIRouteHandler | WebsocketRouteHandler]:
    """JSON-RPC at ``/api/rpc`` (HTTP), ``/api/rpc/ws`` and ``/api/rpc/events`` (SSE)."""
    return rpc_routes(
        resources.callers,
        resources.video_jobs,
        resources.event_bus,
        max_body_bytes=resources.settings.max_body_bytes,
    )


def create_app(
    settings: Settings | None = None, *, password_hasher: PasswordHasher | None = None
) -> Litestar:
    settings = settings or load_settings()
    configure_logging(settings)
    resources = build_resources(settings, password_hasher=password_hasher)
    cors = CORSConfig(allow_origins=list(settings.cors_origins)) if settings.cors_origins else None
    app = Litestar(
        route_handlers=[
            ops_controller(resources),
            AuthController,
            ProjectController,
            ApiKeyController,
            RuntimeTokenController,
            RuntimeController,
            RuntimeCatalogController,
            ModelProfileAdminController,
            ProjectModelsController,
            CustomLlmController,
            BackendAdminController,
            AliasAdminController,
            FailoverAdminController,
            AgentAdminController,
            AgentDeploymentController,
            agent_socket,
            PinAdminController,
            RuntimeConversationController,
            ProjectConversationController,
            QuotaAdminController,
            ProjectQuotaController,
            ProjectUsageController,
            AdminUsageController,
            PriceAdminController,
            ProjectPriceController,
            ProjectSecretController,
            OverrideController,
            GatewayController,
            VideoGenerationController,
            VideoPriceAdminController,
            WebhookController,
            *_gateway_routes(resources),
            *_rpc_routes(resources),
            ConsoleAuthPages,
            ProjectPages,
            *TAB_CONTROLLERS,
            *DASHBOARD_ROUTES,
            create_static_files_router(path="/static", directories=[STATIC_DIR]),
        ],
        dependencies=_dependencies(resources),
        plugins=[SQLAlchemyPlugin(config=resources.db_config)],
        template_config=TemplateConfig(directory=TEMPLATES_DIR, engine=JinjaTemplateEngine),
        lifespan=[build_lifespan(resources)],
        on_startup=[document_errors],
        exception_handlers=exception_handlers(),
        request_class=CheckedRequest,
        before_request=refuse_unstorable_parameters,
        request_max_body_size=settings.max_body_bytes,
        cors_config=cors,
        openapi_config=OpenAPIConfig(title="Arona", version=__version__, path="/schema"),
        logging_config=None,
        debug=False,
    )
    app.state.resources = resources
    # Wrap the whole ASGI handler, not each route: unmatched routes and framework
    # errors must get a request id and be counted too.
    app.asgi_handler = request_context_middleware(resources.metrics)(app.asgi_handler)
    return app
