"""The failover page: the global latency-failover switch (``FailoverControl``), each
watched profile's live status, and the sticky fallback pins with a clear button."""

from __future__ import annotations

from typing import Any
from uuid import UUID

from litestar import Request, delete, get, post
from litestar.response import Redirect, Response, Template
from litestar.status_codes import HTTP_303_SEE_OTHER

from app.domain.backends.failover import FailoverControl
from app.domain.conversations.pins import FallbackPinService, pin_not_found
from app.domain.dashboard.common import (
    DashboardController,
    admin_page,
    db_config_of,
    fragment,
    notify,
    text,
)
from app.domain.dashboard.failover_views import pin_views, status_views
from app.domain.web.pages import WebUser, is_htmx
from app.routing.profiles import ProfileTable


class FailoverPages(DashboardController):
    @get("/failover")
    async def failover_page(
        self,
        request: Request[Any, Any, Any],
        web_admin: WebUser,
        failover_control: FailoverControl,
        profile_table: ProfileTable,
    ) -> Template:
        enabled, statuses = status_views(failover_control, profile_table)
        pins, total = await pin_views(db_config_of(request))
        return admin_page(
            "dashboard/failover.html",
            web_admin,
            "failover",
            enabled=enabled,
            statuses=statuses,
            pins=pins,
            total=total,
        )

    @post("/failover/switch", status_code=200)
    async def set_switch(
        self,
        request: Request[Any, Any, Any],
        web_admin: WebUser,
        failover_control: FailoverControl,
        profile_table: ProfileTable,
    ) -> Template | Redirect:
        form = await request.form()
        enabled = text(form, "enabled") == "on"
        await failover_control.set_enabled(enabled)
        if not is_htmx(request):
            return Redirect("/admin/failover", status_code=HTTP_303_SEE_OTHER)
        message = "Latency failover is on." if enabled else "Latency failover is off."
        return fragment(
            "dashboard/partials/failover_switch.html",
            web_admin,
            headers=notify(message),
            enabled=failover_control.policy.enabled,
        )

    @delete("/pins/{conversation_id:uuid}", status_code=200)
    async def clear_pin(
        self, conversation_id: UUID, web_admin: WebUser, pins_service: FallbackPinService
    ) -> Response[str]:
        if not await pins_service.clear_pin(conversation_id):
            raise pin_not_found()
        message = f"Conversation {conversation_id} follows its own profile again."
        return Response("", headers=notify(message))
