"""Projects REST API: a project's webhooks (``/api/projects/{projectId}/webhooks``).

Owners and platform admins only, reads included: a webhook URL may carry the
receiver's own token in its query string, and the delivery log shows what was sent.
Members and the project's API keys get 403 ``insufficient_role``; another project's
webhook or delivery is a 404 like a missing one.

- ``POST /`` (201, the signing secret shown once), ``GET /`` (paged), ``GET``,
  ``PATCH`` and ``DELETE /{webhookId}``;
- ``POST /{webhookId}/rotate-secret?graceSeconds=86400``: a new secret, shown once;
  the previous one keeps signing beside it for the grace period;
- ``POST /{webhookId}/test`` (201): a ``webhook.test`` delivery, attempted now (one
  attempt), answered with its outcome;
- ``GET /{webhookId}/deliveries`` (paged, newest first), ``GET .../{deliveryId}``,
  ``POST .../{deliveryId}/retry``: one more attempt of a failed delivery, now (409
  ``delivery_not_failed`` otherwise).
"""

from __future__ import annotations

from typing import Annotated
from uuid import UUID

import msgspec
from litestar import delete, get, patch, post
from litestar.params import QueryParameter
from litestar.status_codes import HTTP_200_OK, HTTP_201_CREATED, HTTP_204_NO_CONTENT

from app.db.models import WebhookDelivery
from app.domain.paging import Page, Paging, from_row
from app.domain.projects.services import ProjectAccess
from app.domain.rest import ProjectApiController
from app.domain.webhooks.schemas import (
    DEFAULT_GRACE_SECONDS,
    MAX_GRACE_SECONDS,
    DeliveryAttempt,
    DeliveryOut,
    WebhookCreate,
    WebhookOut,
    WebhookUpdate,
    WebhookWithSecret,
)
from app.domain.webhooks.services import WebhookService
from app.domain.webhooks.setup import Webhooks
from app.lib.errors import ConflictError
from app.lib.vault import Vault

GraceQuery = Annotated[int, QueryParameter(name="graceSeconds", ge=0, le=MAX_GRACE_SECONDS)]

webhook_out = from_row(WebhookOut)
webhook_with_secret = from_row(WebhookWithSecret)


def _attempts(row: WebhookDelivery) -> list[DeliveryAttempt]:
    return msgspec.convert(row.attempt_log or [], list[DeliveryAttempt])


delivery_out = from_row(DeliveryOut, attempt_log=_attempts)


def _require_owner(access: ProjectAccess) -> None:
    access.require(access.can_manage_project, "manage webhooks")


class WebhookController(ProjectApiController):
    path = "/api/projects/{project_id:uuid}/webhooks"

    @post("/", status_code=HTTP_201_CREATED)
    async def create_webhook(
        self,
        data: WebhookCreate,
        access: ProjectAccess,
        webhooks_service: WebhookService,
        webhooks: Webhooks,
        vault: Vault,
    ) -> WebhookWithSecret:
        _require_owner(access)
        row, secret = await webhooks_service.create_webhook(
            access.project.id, data, vault=vault, webhooks=webhooks
        )
        return webhook_with_secret(row, secret=secret)

    @get("/")
    async def list_webhooks(
        self, access: ProjectAccess, webhooks_service: WebhookService, paging: Paging
    ) -> Page[WebhookOut]:
        _require_owner(access)
        rows, total = await webhooks_service.page(access.project.id, paging.limit, paging.offset)
        return paging.page(rows, total, webhook_out)

    @get("/{webhook_id:uuid}")
    async def get_webhook(
        self, webhook_id: UUID, access: ProjectAccess, webhooks_service: WebhookService
    ) -> WebhookOut:
        _require_owner(access)
        return webhook_out(await webhooks_service.require(access.project.id, webhook_id))

    @patch("/{webhook_id:uuid}")
    async def update_webhook(
        self,
        webhook_id: UUID,
        data: WebhookUpdate,
        access: ProjectAccess,
        webhooks_service: WebhookService,
        webhooks: Webhooks,
    ) -> WebhookOut:
        _require_owner(access)
        row = await webhooks_service.update_webhook(access.project.id, webhook_id, data, webhooks)
        return webhook_out(row)

    @delete("/{webhook_id:uuid}", status_code=HTTP_204_NO_CONTENT)
    async def delete_webhook(
        self, webhook_id: UUID, access: ProjectAccess, webhooks_service: WebhookService
    ) -> None:
        _require_owner(access)
        await webhooks_service.delete_webhook(access.project.id, webhook_id)

    @post("/{webhook_id:uuid}/rotate-secret", status_code=HTTP_200_OK)
    async def rotate_secret(
        self,
        webhook_id: UUID,
        access: ProjectAccess,
        webhooks_service: WebhookService,
        vault: Vault,
        grace_seconds: GraceQuery = DEFAULT_GRACE_SECONDS,
    ) -> WebhookWithSecret:
        _require_owner(access)
        row, secret = await webhooks_service.rotate_secret(
            access.project.id, webhook_id, vault, grace_seconds
        )
        return webhook_with_secret(row, secret=secret)

    @post("/{webhook_id:uuid}/test", status_code=HTTP_201_CREATED)
    async def send_test(
        self,
        webhook_id: UUID,
        access: ProjectAccess,
        webhooks_service: WebhookService,
        webhooks: Webhooks,
    ) -> DeliveryOut:
        _require_owner(access)
        project_id = access.project.id
        return delivery_out(await webhooks_service.send_test(project_id, webhook_id, webhooks))

    @get("/{webhook_id:uuid}/deliveries")
    async def list_deliveries(
        self,
        webhook_id: UUID,
        access: ProjectAccess,
        webhooks_service: WebhookService,
        paging: Paging,
    ) -> Page[DeliveryOut]:
        _require_owner(access)
        rows, total = await webhooks_service.deliveries(
            access.project.id, webhook_id, paging.limit, paging.offset
        )
        return paging.page(rows, total, delivery_out)

    @get("/{webhook_id:uuid}/deliveries/{delivery_id:uuid}")
    async def get_delivery(
        self,
        webhook_id: UUID,
        delivery_id: UUID,
        access: ProjectAccess,
        webhooks_service: WebhookService,
    ) -> DeliveryOut:
        _require_owner(access)
        row = await webhooks_service.require_delivery(access.project.id, delivery_id, webhook_id)
        return delivery_out(row)

    @post("/{webhook_id:uuid}/deliveries/{delivery_id:uuid}/retry", status_code=HTTP_200_OK)
    async def retry_delivery(
        self,
        webhook_id: UUID,
        delivery_id: UUID,
        access: ProjectAccess,
        webhooks_service: WebhookService,
        webhooks: Webhooks,
    ) -> DeliveryOut:
        _require_owner(access)
        project_id = access.project.id
        if not await webhooks_service.retry_delivery(project_id, delivery_id, webhooks, webhook_id):
            raise ConflictError(
                "only a failed delivery can be retried (this one is pending or delivered)",
                code="delivery_not_failed",
            )
        return delivery_out(await webhooks_service.require_delivery(project_id, delivery_id))
