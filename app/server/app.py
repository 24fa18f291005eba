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
from app.domain.accounts.deps import accounts_dependencies
from app.domain.agents.controllers import AgentAdminController, AgentDeploymentController
from app.domain.agents.deps import agents_dependencies
from app.domain.agents.socket import agent_socket
from app.domain.backends.controllers import AliasAdminController, BackendAdminController
from app.domain.backends.deps import backends_dependencies
from app.domain.backends.failover import FailoverAdminController
from app.domain.calls.deps import calls_dependencies
from app.domain.console.auth_pages import ConsoleAuthPages
from app.domain.console.project_pages import ProjectPages
from app.domain.console.tab_pages import TAB_CONTROLLERS
from app.domain.conversations.controllers import (
    PinAdminController,
    ProjectConversationController,
    RuntimeConversationController,
)
from app.domain.conversations.deps import conversations_dependencies
from app.domain.custom_llms.controllers import CustomLlmController
from app.domain.custom_llms.deps import custom_llms_dependencies
from app.domain.dashboard.pages import DASHBOARD_ROUTES
from app.domain.gateway.asgi import gateway_asgi_handlers
from app.domain.gateway.controllers import GatewayController
from app.domain.gateway.deps import gateway_dependencies
from app.domain.overrides.controllers import OverrideController
from app.domain.overrides.deps import overrides_dependencies
from app.domain.profiles.controllers import (
    ModelProfileAdminController,
    ProjectModelsController,
    RuntimeCatalogController,
)
from app.domain.profiles.deps import profiles_dependencies
from app.domain.projects.controllers import ProjectController
from app.domain.projects.credential_controllers import ApiKeyController, RuntimeTokenController
from app.domain.projects.deps import projects_dependencies
from app.domain.quotas.controllers import ProjectQuotaController, QuotaAdminController
from app.domain.quotas.deps import quotas_dependencies
from app.domain.rpc.routes import rpc_routes
from app.domain.runtime.controllers import RuntimeController
from app.domain.secrets.controllers import ProjectSecretController
from app.domain.secrets.deps import secrets_dependencies
from app.domain.video.controllers import VideoGenerationController, VideoPriceAdminController
from app.domain.web.deps import web_dependencies
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


def _resource_dependencies(resources: Resources) -> dict[str, Provide]:
    return {
        "settings": _constant(resources.settings),
        "state_store": _constant(resources.state_store),
        "event_bus": _constant(resources.event_bus),
        "vault": _constant(resources.vault),
        "token_service": _constant(resources.token_service),
        "password_hasher": _constant(resources.password_hasher),
        "revocations": _constant(resources.revocations),
        "authenticator": _constant(resources.authenticator),
        "api_key_sync": _constant(resources.api_key_sync),
        "backend_registry": _constant(resources.backend_registry),
        "alias_table": _constant(resources.alias_table),
        "profile_table": _constant(resources.profile_table),
        "profile_catalog": _constant(resources.profile_catalog),
        "profile_sync": _constant(resources.profile_sync),
        "custom_llms": _constant(resources.custom_llms),
        "override_index": _constant(resources.override_index),
        "override_sync": _constant(resources.override_sync),
        "health_checker": _constant(resources.health_checker),
        "routing_sync": _constant(resources.routing_sync),
        "usage_writer": _constant(resources.usage_writer),
        "quota_gate": _constant(resources.quota_gate),
        "quota_sync": _constant(resources.quota_sync),
        "failover_control": _constant(resources.failover_control),
        "web_sessions": _constant(resources.web_sessions),
        "runtime_chat": _constant(resources.runtime_chat),
        "vllm_metrics": _constant(resources.vllm_metrics),
        "agents": _constant(resources.agents),
        "video_jobs": _constant(resources.video_jobs),
        "video_prices": _constant(resources.video_prices),
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
            ProjectSecretController,
            OverrideController,
            GatewayController,
            VideoGenerationController,
            VideoPriceAdminController,
            *_gateway_routes(resources),
            *_rpc_routes(resources),
            ConsoleAuthPages,
            ProjectPages,
            *TAB_CONTROLLERS,
            *DASHBOARD_ROUTES,
            create_static_files_router(path="/static", directories=[STATIC_DIR]),
        ],
        dependencies={
            **_resource_dependencies(resources),
            **accounts_dependencies(),
            **projects_dependencies(),
            **backends_dependencies(),
            **agents_dependencies(),
            **conversations_dependencies(),
            **quotas_dependencies(),
            **secrets_dependencies(),
            **profiles_dependencies(),
            **custom_llms_dependencies(),
            **overrides_dependencies(),
            **gateway_dependencies(resources.callers, resources.gateway),
            **calls_dependencies(resources.callers),
            **web_dependencies(),
        },
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
