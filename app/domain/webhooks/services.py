"""Project webhooks and their delivery log, as the REST API and the console write and
read them; every statement is filtered by project (another project's webhook or
delivery is a 404 like a missing one).

The signing secret is generated here (never chosen by the caller), sealed by the vault
with associated data bound to the row (``app.domain.secrets.aad``), and returned once.
A rotation keeps the previous secret signing for a grace period, so a receiver can
switch to the new one without refusing deliveries meanwhile.
"""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from uuid import UUID, uuid4

import msgspec
import structlog
from advanced_alchemy.repository import SQLAlchemyAsyncRepository
from advanced_alchemy.service import SQLAlchemyAsyncRepositoryService
from sqlalchemy import func, select

from app.db.models import ProjectWebhook, WebhookDelivery
from app.domain.queries import count_and_page, delete_in_project, project_page
from app.domain.secrets.aad import webhook_previous_aad, webhook_secret_aad
from app.domain.webhooks.schemas import (
    MAX_WEBHOOKS_PER_PROJECT,
    WebhookCreate,
    WebhookUpdate,
)
from app.domain.webhooks.setup import Webhooks
from app.domain.webhooks.signing import new_secret
from app.lib.clock import utcnow
from app.lib.errors import BadRequestError, ConflictError, NotFoundError
from app.lib.ssrf import UnsafeUrlError
from app.lib.vault import Vault, VaultError, mask

logger = structlog.get_logger()

_URL_CODES = {
    "invalid_base_url": "invalid_url",
    "base_url_not_allowed": "url_not_allowed",
    "base_url_unresolvable": "url_unresolvable",
}


def webhook_not_found() -> NotFoundError:
    return NotFoundError("webhook not found", code="webhook_not_found")


def delivery_not_found() -> NotFoundError:
    return NotFoundError("delivery not found", code="delivery_not_found")


def _url_error(code: str, message: str) -> BadRequestError:
    return BadRequestError(f"url: {message}", code=code, param="url")


async def check_url(url: str, webhooks: Webhooks) -> str:
    """The receiver URL if it may be used; else a 400 naming ``url``.

    ``https://`` only, unless private addresses are allowed (then ``http://`` too);
    no credentials or fragment; a query string is kept (some receivers authenticate
    with one). The host passes the SSRF guard's write-time check.
    """
    if not url.isascii() or any(c.isspace() or not c.isprintable() for c in url):
        raise _url_error("invalid_url", "the URL must be ASCII without spaces")
    scheme, sep, rest = url.partition("://")
    scheme = scheme.lower()
    if not sep or scheme not in ("http", "https"):
        raise _url_error("invalid_url", "the URL must start with https://")
    if scheme == "http" and not webhooks.allow_http:
        raise _url_error("url_not_https", "webhooks are sent over HTTPS only: use https://")
    if "#" in rest:
        raise _url_error("invalid_url", "a webhook URL has no fragment")
    # The guard checks the address; the query plays no part in where it connects.
    base = f"{scheme}://{rest.split('?', 1)[0]}"
    try:
        await webhooks.guard.check(base)
    except UnsafeUrlError as exc:
        raise _url_error(_URL_CODES.get(exc.code, "invalid_url"), exc.message) from None
    return url


class WebhookService(SQLAlchemyAsyncRepositoryService[ProjectWebhook]):
    class Repo(SQLAlchemyAsyncRepository[ProjectWebhook]):
        model_type = ProjectWebhook

    repository_type = Repo

    # ------------------------------------------------------------ webhooks

    async def create_webhook(
        self, project_id: UUID, data: WebhookCreate, *, vault: Vault, webhooks: Webhooks
    ) -> tuple[ProjectWebhook, str]:
        """The new webhook and its signing secret (to show once)."""
        url = await check_url(data.url, webhooks)
        count = await self.count(ProjectWebhook.project_id == project_id)
        if count >= MAX_WEBHOOKS_PER_PROJECT:
            raise ConflictError(
                f"a project has at most {MAX_WEBHOOKS_PER_PROJECT} webhooks: delete one first",
                code="webhook_limit_reached",
            )
        secret = new_secret()
        # The id exists before the row does: the ciphertext is bound to it.
        webhook_id = uuid4()
        row = ProjectWebhook(
            id=webhook_id,
            project_id=project_id,
            url=url,
            description=data.description,
            enabled=data.enabled,
            events=list(dict.fromkeys(data.events)),
            secret_encrypted=vault.encrypt(secret, webhook_secret_aad(project_id, webhook_id)),
            secret_hint=mask(secret),
        )
        self.repository.session.add(row)
        await self.repository.session.commit()
        logger.info("webhook created", project_id=str(project_id), webhook_id=str(webhook_id))
        return row, secret

    async def page(
        self, project_id: UUID, limit: int, offset: int
    ) -> tuple[Sequence[ProjectWebhook], int]:
        """Oldest first (the order they were added in)."""
        order = [ProjectWebhook.created_at, ProjectWebhook.id]
        session = self.repository.session
        return await project_page(session, ProjectWebhook, project_id, order, limit, offset)

    async def require(self, project_id: UUID, webhook_id: UUID) -> ProjectWebhook:
        row = await self.get_one_or_none(
            ProjectWebhook.id == webhook_id, ProjectWebhook.project_id == project_id
        )
        if row is None:
            raise webhook_not_found()
        return row

    async def update_webhook(
        self, project_id: UUID, webhook_id: UUID, data: WebhookUpdate, webhooks: Webhooks
    ) -> ProjectWebhook:
        row = await self.require(project_id, webhook_id)
        if data.url is not msgspec.UNSET:
            row.url = await check_url(data.url, webhooks)
        if data.description is not msgspec.UNSET:
            row.description = data.description
        if data.enabled is not msgspec.UNSET:
            row.enabled = data.enabled
        if data.events is not msgspec.UNSET:
            row.events = list(dict.fromkeys(data.events))
        await self.repository.session.commit()
        return row

    async def delete_webhook(self, project_id: UUID, webhook_id: UUID) -> None:
        """The webhook and its delivery log (pending deliveries are never sent)."""
        session = self.repository.session
        if not await delete_in_project(session, ProjectWebhook, project_id, webhook_id):
            raise webhook_not_found()
        logger.info("webhook deleted", project_id=str(project_id), webhook_id=str(webhook_id))

    async def rotate_secret(
        self, project_id: UUID, webhook_id: UUID, vault: Vault, grace_seconds: int
    ) -> tuple[ProjectWebhook, str]:
        """A new signing secret (to show once); the current one keeps signing beside
        it for ``grace_seconds`` (0: stops at once)."""
        row = await self.require(project_id, webhook_id)
        now = utcnow()
        row.previous_secret_encrypted = None
        row.previous_secret_expires_at = None
        if grace_seconds > 0:
            try:
                current = vault.decrypt(
                    row.secret_encrypted, webhook_secret_aad(project_id, row.id)
                )
            except VaultError as exc:  # unreadable anyway: nothing to keep signing with
                logger.warning("webhook secret unreadable at rotation", error=str(exc))
            else:
                row.previous_secret_encrypted = vault.encrypt(
                    current, webhook_previous_aad(project_id, row.id)
                )
                row.previous_secret_expires_at = now + datetime.timedelta(seconds=grace_seconds)
        secret = new_secret()
        row.secret_encrypted = vault.encrypt(secret, webhook_secret_aad(project_id, row.id))
        row.secret_hint = mask(secret)
        await self.repository.session.commit()
        logger.info("webhook secret rotated", project_id=str(project_id), webhook_id=str(row.id))
        return row, secret

    # ------------------------------------------------------------ the delivery log

    async def deliveries(
        self, project_id: UUID, webhook_id: UUID, limit: int, offset: int
    ) -> tuple[Sequence[WebhookDelivery], int]:
        """One webhook's deliveries, newest first."""
        await self.require(project_id, webhook_id)
        return await count_and_page(
            self.repository.session,
            WebhookDelivery,
            [WebhookDelivery.webhook_id == webhook_id],
            [WebhookDelivery.created_at.desc(), WebhookDelivery.id.desc()],
            limit,
            offset,
        )

    async def project_deliveries(
        self, project_id: UUID, limit: int, offset: int
    ) -> tuple[list[tuple[WebhookDelivery, str]], int]:
        """Every webhook's deliveries in the project, newest first, with the URL each
        went to (the console's log)."""
        session = self.repository.session
        owned = ProjectWebhook.project_id == project_id
        joined = WebhookDelivery.webhook_id == ProjectWebhook.id
        total = await session.scalar(
            select(func.count())
            .select_from(WebhookDelivery)
            .join(ProjectWebhook, joined)
            .where(owned)
        )
        rows = await session.execute(
            select(WebhookDelivery, ProjectWebhook.url)
            .join(ProjectWebhook, joined)
            .where(owned)
            .order_by(WebhookDelivery.created_at.desc(), WebhookDelivery.id.desc())
            .limit(limit)
            .offset(offset)
        )
        return [(delivery, url) for delivery, url in rows], int(total or 0)

    async def require_delivery(
        self, project_id: UUID, delivery_id: UUID, webhook_id: UUID | None = None
    ) -> WebhookDelivery:
        """A delivery of one of the project's webhooks (of ``webhook_id`` if given),
        read afresh (the dispatcher writes it on its own connections)."""
        query = (
            select(WebhookDelivery)
            .join(ProjectWebhook, WebhookDelivery.webhook_id == ProjectWebhook.id)
            .where(WebhookDelivery.id == delivery_id, ProjectWebhook.project_id == project_id)
            .execution_options(populate_existing=True)
        )
        if webhook_id is not None:
            query = query.where(WebhookDelivery.webhook_id == webhook_id)
        row: WebhookDelivery | None = await self.repository.session.scalar(query)
        if row is None:
            raise delivery_not_found()
        return row

    async def send_test(
        self, project_id: UUID, webhook_id: UUID, webhooks: Webhooks
    ) -> WebhookDelivery:
        """One test attempt now (the read session ends first: the attempt may take
        the whole timeout); the delivery row it left."""
        await self.require(project_id, webhook_id)
        await self.end_read()
        delivery_id = await webhooks.dispatcher.send_test(webhook_id, project_id)
        return await self.require_delivery(project_id, delivery_id)

    async def retry_delivery(
        self,
        project_id: UUID,
        delivery_id: UUID,
        webhooks: Webhooks,
        webhook_id: UUID | None = None,
    ) -> bool:
        """Attempt a failed delivery again now; False when it is not failed."""
        await self.require_delivery(project_id, delivery_id, webhook_id)
        await self.end_read()
        return await webhooks.dispatcher.retry(delivery_id)

    async def end_read(self) -> None:
        """End the read transaction before a slow call (no pooled connection is held
        while a receiver answers)."""
        await self.repository.session.commit()
