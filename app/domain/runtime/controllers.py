"""Runtime API (runtime JWT). Chat and the catalog arrive with the runtime step."""

from __future__ import annotations

from uuid import UUID

import msgspec
from litestar import Controller, get

from app.domain.accounts.principals import Principal, RuntimePrincipal
from app.lib.errors import PermissionDeniedError


class RuntimeIdentity(msgspec.Struct, rename="camel"):
    project_id: UUID
    token_id: UUID


class RuntimeController(Controller):
    path = "/api/runtime"
    tags = ["runtime"]

    @get("/me")
    async def whoami(self, principal: Principal) -> RuntimeIdentity:
        """Lets a runtime check that its token is valid and which project it serves."""
        if not isinstance(principal, RuntimePrincipal):
            raise PermissionDeniedError(
                "this endpoint needs a runtime token", code="runtime_token_required"
            )
        return RuntimeIdentity(project_id=principal.project_id, token_id=principal.token_id)
