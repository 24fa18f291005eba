"""The failover page: the global latency-failover switch (``FailoverControl``), each
watched profile's live status, and the sticky fallback pins with a clear button."""

from __future__ import annotations

from uuid import UUID

from litestar import delete, get, post
from litestar.response import Redirect, Response, Template

from app.domain.backends.failover import FailoverControl
from app.domain.conversations.pins import FallbackPinService, pin_not_found
from app.domain.dashboard.common import (
    AdminRequest,
    DashboardController,
    notice,
    notify,
    text,
)
from app.domain.dashboard.failover_views import pin_views, status_views
from app.domain.web.pages import WebUser
from app.routing.profiles import ProfileTable


class FailoverPages(DashboardController):
    @get("/failover")
    async def failover_page(
        self, admin: AdminRequest, failover_control: FailoverControl, profile_table: ProfileTable
    ) -> Template:
        enabled, statuses = status_views(failover_control, profile_table)
        pins, total = await pin_views(admin.db_config)
        return admin.page(
            "dashboard/failover.html",
            "failover",
            enabled=enabled,
            statuses=statuses,
            pins=pins,
            total=total,
        )

    @post("/failover/switch", status_code=200)
    async def set_switch(
        self, admin: AdminRequest, failover_control: FailoverControl
    ) -> Template | Redirect:
        enabled = text(await admin.form(), "enabled") == "on"
        await failover_control.set_enabled(enabled)
        message = "Latency failover is on." if enabled else "Latency failover is off."
        return admin.saved(
            "/admin/failover",
            "dashboard/partials/failover_switch.html",
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
        return notice(message)
