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

from app.domain.accounts.authenticator import Authenticator
from app.domain.gateway.services import Caller, GatewayService
from app.lib.errors import AuthenticationError


@dataclass(frozen=True, slots=True)
class GatewayCall:
    caller: Caller
    gateway: GatewayService


def gateway_dependencies(
    authenticator: Authenticator, gateway: GatewayService
) -> dict[str, Provide]:
    async def provide_gateway_call(request: Request[Any, Any, Any]) -> GatewayCall:
        principal = await authenticator.authenticate(request.headers.get("authorization"))
        if principal is None:
            raise AuthenticationError("authentication required", code="missing_credentials")
        return GatewayCall(Caller.of(principal), gateway)

    return {"gateway_call": Provide(provide_gateway_call)}
