"""The one dependency of the ``/v1`` handlers.

Litestar resolves sibling dependencies concurrently in an anyio task group; on the
hot path that cost more CPU than authenticating the call (see docs/performance.md).
So ``/v1`` takes a single dependency, built from a closure over the process's
authenticator and gateway service, that resolves the caller and hands both on.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from litestar import Request
from litestar.di import Provide

from app.domain.calls.callers import PROJECT_HEADER, Caller, CallerResolver
from app.domain.gateway.services import GatewayService


@dataclass(frozen=True, slots=True)
class GatewayCall:
    caller: Caller
    gateway: GatewayService


def gateway_dependencies(callers: CallerResolver, gateway: GatewayService) -> dict[str, Provide]:
    async def provide_gateway_call(request: Request[Any, Any, Any]) -> GatewayCall:
        headers = request.headers
        caller = await callers.caller(headers.get("authorization"), headers.get(PROJECT_HEADER))
        return GatewayCall(caller, gateway)

    return {"gateway_call": Provide(provide_gateway_call)}
