"""The prices area's life in the app: the price book the meter prices calls with,
kept current over the ``EventBus``."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence

import structlog
from advanced_alchemy.extensions.litestar import SQLAlchemyAsyncConfig

from app.domain.prices.book import PLATFORM, PriceBook, PriceSync, db_prices_loader
from app.domain.prices.deps import prices_dependencies
from app.lib.components import BackgroundTask, Component
from app.lib.events.base import EventBus

logger = structlog.get_logger()


class PricesWiring(Component):
    name = "prices"

    def __init__(self, *, db_config: SQLAlchemyAsyncConfig, bus: EventBus) -> None:
        self.book = PriceBook(db_prices_loader(db_config))
        self.sync = PriceSync(self.book, bus)

    def provides(self) -> Mapping[str, object]:
        return {**prices_dependencies(), "price_book": self.book, "price_sync": self.sync}

    async def start(self) -> None:
        # The platform's prices before the first call, so no call waits for them.
        try:
            await self.book.table(PLATFORM)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the first priced call reads them again
            logger.warning("could not load the price book at start", error=repr(exc))

    def tasks(self) -> Sequence[BackgroundTask]:
        # Subscribes, then marks every table stale (tables also expire after a minute:
        # the safety net under lost prices.config events).
        return (BackgroundTask("price-sync", self.sync.run),)

    async def resync_after_outage(self) -> None:
        await self.sync.reload()
