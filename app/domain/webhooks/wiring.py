"""The webhooks area's life in the app: the dispatcher's worker and the log's pruning
run as background tasks; at shutdown the dispatcher writes what it still queues and
gives back the rows it holds (``stop``), then its HTTP pool closes (``aclose``)."""

from __future__ import annotations

import ssl
from collections.abc import Callable, Mapping, Sequence

from advanced_alchemy.extensions.litestar import SQLAlchemyAsyncConfig
from aiohttp.abc import AbstractResolver
from prometheus_client import CollectorRegistry

from app.domain.webhooks.deps import webhooks_dependencies
from app.domain.webhooks.dispatcher import PRUNE_SECONDS, WebhookDispatcher
from app.domain.webhooks.setup import build_webhooks
from app.lib.components import BackgroundTask, Component, periodic
from app.lib.settings import Settings
from app.lib.vault import Vault


class WebhooksWiring(Component):
    name = "webhooks"

    def __init__(
        self,
        settings: Settings,
        *,
        db_config: SQLAlchemyAsyncConfig,
        vault: Vault,
        instance_id: str,
        registry: CollectorRegistry | None = None,
        ssl_context: ssl.SSLContext | None = None,
        resolver_factory: Callable[[], AbstractResolver] | None = None,
    ) -> None:
        self.webhooks = build_webhooks(
            settings,
            db_config.get_engine(),
            vault,
            origin=instance_id,
            ssl_context=ssl_context,
            resolver_factory=resolver_factory,
            registry=registry,
        )

    @property
    def dispatcher(self) -> WebhookDispatcher:
        return self.webhooks.dispatcher

    def provides(self) -> Mapping[str, object]:
        return {
            **webhooks_dependencies(),
            "webhooks": self.webhooks,
            "webhook_dispatcher": self.dispatcher,
        }

    def tasks(self) -> Sequence[BackgroundTask]:
        return (
            # Takes the rows a previous process left pending as soon as it starts.
            BackgroundTask("webhook-dispatcher", self.dispatcher.run),
            periodic("webhook-prune", PRUNE_SECONDS, self.dispatcher.prune),
        )

    async def stop(self) -> None:
        await self.dispatcher.stop()

    async def aclose(self) -> None:
        await self.dispatcher.aclose()
