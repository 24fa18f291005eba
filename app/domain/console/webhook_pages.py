"""The Webhooks tab: the project's receivers of threshold events and their delivery
log. Owners and platform admins only (a webhook URL may carry the receiver's token),
as in the REST API. A new or rotated signing secret is shown once, in the answer that
made it; a test event is attempted while the page waits and its outcome is the toast;
a failed delivery can be retried from the log."""

from __future__ import annotations

from typing import Any
from uuid import UUID

from litestar import post
from litestar.response import Template

from app.domain.console.tab_support import Tab, TabPages, TabScope, compact, parse, plain
from app.domain.webhooks.schemas import DEFAULT_GRACE_SECONDS, WebhookCreate, WebhookUpdate
from app.domain.webhooks.services import WebhookService
from app.domain.webhooks.setup import Webhooks
from app.lib.errors import AronaError, ConflictError
from app.lib.vault import Vault

KEY = "webhooks"
SHOWN_DELIVERIES = 50
FIELDS = ("url", "description")


async def _context(scope: TabScope, service: WebhookService, webhooks: Webhooks) -> dict[str, Any]:
    if not scope.access.can_manage_project:
        return {"webhooks": [], "deliveries": [], "deliveries_total": 0}
    project_id = scope.project.id
    hooks, _ = await service.page(project_id, 100, 0)
    log, total = await service.project_deliveries(project_id, SHOWN_DELIVERIES, 0)
    return {
        "webhooks": [
            plain(
                w,
                "id",
                "url",
                "description",
                "enabled",
                "events",
                "secret_hint",
                "previous_secret_expires_at",
                "created_at",
            )
            for w in hooks
        ],
        "deliveries": [
            {
                **plain(
                    d,
                    "id",
                    "webhook_id",
                    "event",
                    "status",
                    "attempts",
                    "last_status_code",
                    "last_error",
                    "next_attempt_at",
                    "delivered_at",
                    "created_at",
                ),
                "url": url,
            }
            for d, url in log
        ],
        "deliveries_total": total,
        "allow_http": webhooks.allow_http,
    }


def _tab(tab_scope: TabScope, webhooks_service: WebhookService, webhooks: Webhooks) -> Tab:
    return tab_scope.tab(KEY, lambda: _context(tab_scope, webhooks_service, webhooks))


async def _shown_once(tab: Tab, what: str, secret: str) -> Template:
    return await tab.show(
        f"{what}: copy the signing secret now, it is shown only once.",
        new_secret={"kind": "signing secret", "name": None, "value": secret},
    )


class WebhooksTab(TabPages, tab=_tab, key=KEY):
    @post("/webhooks")
    async def add(
        self,
        tab: Tab,
        project_id: UUID,
        webhooks_service: WebhookService,
        webhooks: Webhooks,
        vault: Vault,
    ) -> Template:
        tab.scope.require_project("add webhooks")
        values = (await tab.scope.form()).texts(*FIELDS)
        try:
            data = parse(WebhookCreate, compact(values))
            _, secret = await webhooks_service.create_webhook(
                project_id, data, vault=vault, webhooks=webhooks
            )
        except AronaError as exc:
            return await tab.refuse("add-webhook", exc, FIELDS, values)
        return await _shown_once(tab, "Webhook added", secret)

    @post("/webhooks/{webhook_id:uuid}/edit")
    async def edit(
        self,
        tab: Tab,
        project_id: UUID,
        webhook_id: UUID,
        webhooks_service: WebhookService,
        webhooks: Webhooks,
    ) -> Template:
        tab.scope.require_project("change webhooks")
        form = await tab.scope.form()
        values = {**form.texts(*FIELDS), "enabled": "on" if form.flag("enabled") else ""}
        try:
            data = parse(WebhookUpdate, {**values, "enabled": form.flag("enabled")})
            await webhooks_service.update_webhook(project_id, webhook_id, data, webhooks)
        except AronaError as exc:
            return await tab.refuse(f"edit-{webhook_id}", exc, FIELDS, values)
        return await tab.show("Webhook saved.")

    @post("/webhooks/{webhook_id:uuid}/rotate")
    async def rotate(
        self,
        tab: Tab,
        project_id: UUID,
        webhook_id: UUID,
        webhooks_service: WebhookService,
        vault: Vault,
    ) -> Template:
        tab.scope.require_project("rotate webhook secrets")
        _, secret = await webhooks_service.rotate_secret(
            project_id, webhook_id, vault, DEFAULT_GRACE_SECONDS
        )
        return await _shown_once(tab, "New secret (the old one signs too for 24 hours)", secret)

    @post("/webhooks/{webhook_id:uuid}/test")
    async def test(
        self,
        tab: Tab,
        project_id: UUID,
        webhook_id: UUID,
        webhooks_service: WebhookService,
        webhooks: Webhooks,
    ) -> Template:
        tab.scope.require_project("send test events")
        row = await webhooks_service.send_test(project_id, webhook_id, webhooks)
        if row.status == "delivered":
            return await tab.show(f"Test event delivered ({row.last_status_code}).")
        return await tab.scope.render(
            KEY, message=f"Test event failed: {row.last_error}.", level="error", **await tab.load()
        )

    @post("/webhooks/{webhook_id:uuid}/delete")
    async def delete(
        self, tab: Tab, project_id: UUID, webhook_id: UUID, webhooks_service: WebhookService
    ) -> Template:
        tab.scope.require_project("delete webhooks")
        await webhooks_service.delete_webhook(project_id, webhook_id)
        return await tab.show("Webhook deleted, with its delivery log.")

    @post("/webhook-deliveries/{delivery_id:uuid}/retry")
    async def retry(
        self,
        tab: Tab,
        project_id: UUID,
        delivery_id: UUID,
        webhooks_service: WebhookService,
        webhooks: Webhooks,
    ) -> Template:
        tab.scope.require_project("retry deliveries")
        if not await webhooks_service.retry_delivery(project_id, delivery_id, webhooks):
            exc = ConflictError("only a failed delivery can be retried")
            return await tab.refuse(f"retry-{delivery_id}", exc)
        row = await webhooks_service.require_delivery(project_id, delivery_id)
        if row.status == "delivered":
            return await tab.show(f"Delivered on retry ({row.last_status_code}).")
        return await tab.scope.render(
            KEY, message=f"Retry failed: {row.last_error}.", level="error", **await tab.load()
        )
