"""A request's service, handed the per-process objects it publishes its changes to.

A service that writes cached data tells the cache's sync itself (the sync forgets
the data here and publishes the invalidation to the other replicas), so that no
controller or page can forget to. The request's provider attaches the sync::

    "overrides_service": service_provider(OverrideService, changes="override_sync")

sets ``service.changes`` to the ``override_sync`` dependency. A service built
elsewhere (start-up seeding, a read in a background task) has none and publishes
nothing; such callers re-sync on their own.
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncGenerator
from typing import Any, TypeVar

from advanced_alchemy.extensions.litestar.providers import create_service_provider
from advanced_alchemy.service import SQLAlchemyAsyncRepositoryService
from litestar.di import Provide

S = TypeVar("S", bound=SQLAlchemyAsyncRepositoryService[Any])


def service_provider(service_class: type[S], **attached: str) -> Provide:
    """A provider of ``service_class`` on the request's session, with each attribute
    of ``attached`` set to the dependency of that name."""
    # The session parameter exactly as advanced-alchemy declares it (its name and its
    # dependency marker).
    [session_param] = inspect.signature(create_service_provider(service_class)).parameters.values()
    session = session_param.name

    async def provide(**kwargs: Any) -> AsyncGenerator[S, None]:
        async with service_class.new(session=kwargs[session]) as service:
            for attribute, dependency in attached.items():
                setattr(service, attribute, kwargs[dependency])
            yield service

    params = [session_param] + [
        inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, annotation=Any)
        for name in attached.values()
    ]
    returns = AsyncGenerator[service_class, None]  # type: ignore[valid-type]
    provide.__signature__ = inspect.Signature(params, return_annotation=returns)  # type: ignore[attr-defined]
    provide.__annotations__ = {
        **{p.name: p.annotation for p in params},
        "return": returns,
    }
    return Provide(provide)
