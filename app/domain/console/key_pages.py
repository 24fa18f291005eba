"""The Keys tab: the project's API keys (``/v1`` clients, automation) and runtime
tokens (runtimes). A new one is shown once, with a copy button, in the answer that
created it; afterwards only its name and prefix are."""

from __future__ import annotations

import datetime
from collections.abc import Awaitable, Callable
from typing import Any
from uuid import UUID

from litestar import post
from litestar.response import Template

from app.domain.accounts.credential_services import ApiKeyService, RuntimeTokenService
from app.domain.accounts.revocations import RevocationList
from app.domain.accounts.runtime_policies import RuntimePolicySync
from app.domain.accounts.sync import ApiKeySync
from app.domain.console.key_forms import FIELDS, PERIODS, governance_view, read_form
from app.domain.console.key_spend_view import spend_view
from app.domain.console.tab_support import (
    FormState,
    Tab,
    TabPages,
    TabScope,
    compact,
    parse,
    plain,
)
from app.domain.projects import lifecycle
from app.domain.projects.schemas import ApiKeyCreate, RuntimeTokenCreate
from app.domain.usage.services import UsageRecordService
from app.domain.web.pages import WebUser
from app.lib.clock import utcnow
from app.lib.errors import AronaError
from app.lib.settings import Settings
from app.lib.tokens import TokenService

KEY = "keys"
SHOWN = 200
DAY = 24 * 3600
LIFETIMES = (
    (3600, "1 hour"),
    (DAY, "1 day"),
    (7 * DAY, "7 days"),
    (30 * DAY, "30 days"),
    (90 * DAY, "90 days"),
    (365 * DAY, "1 year"),
)


def _lifetimes(default_seconds: int) -> list[tuple[str, str]]:
    options = [(str(s), label) for s, label in LIFETIMES]
    if default_seconds not in dict(LIFETIMES):
        options.append((str(default_seconds), f"{default_seconds // 3600} hours (default)"))
    return options


def _state(revoked_at: datetime.datetime | None, expires_at: datetime.datetime | None) -> str:
    if revoked_at is not None:
        return "revoked"
    if expires_at is not None and expires_at <= utcnow():
        return "expired"
    return "active"


async def _context(
    scope: TabScope,
    api_keys_service: ApiKeyService,
    tokens_service: RuntimeTokenService,
    usage_records_service: UsageRecordService,
    settings: Settings,
) -> dict[str, Any]:
    project_id = scope.project.id
    keys, keys_total = await api_keys_service.page(project_id, SHOWN, 0)
    tokens, tokens_total = await tokens_service.page(project_id, SHOWN, 0)
    # Keys and tokens together: one usage statement for the whole tab.
    spends = await usage_records_service.key_spend(
        project_id, [*(k.id for k in keys), *(t.id for t in tokens)], now=utcnow()
    )
    return {
        "api_keys": [
            {
                **plain(
                    k,
                    "id",
                    "name",
                    "prefix",
                    "created_at",
                    "last_used_at",
                    "revoked_at",
                    "expires_at",
                ),
                **governance_view(k),
                "spend": spend_view(spends[k.id], k),
                "state": _state(k.revoked_at, k.expires_at),
            }
            for k in keys
        ],
        "api_keys_total": keys_total,
        "tokens": [
            {
                **plain(t, "id", "name", "created_at", "expires_at", "revoked_at"),
                **governance_view(t),
                "spend": spend_view(spends[t.id], t),
                "state": _state(t.revoked_at, t.expires_at),
            }
            for t in tokens
        ],
        "tokens_total": tokens_total,
        "lifetimes": _lifetimes(settings.runtime_token_ttl_seconds),
        "default_lifetime": str(settings.runtime_token_ttl_seconds),
        "periods": PERIODS,
    }


def _tab(
    tab_scope: TabScope,
    api_keys_service: ApiKeyService,
    runtime_tokens_service: RuntimeTokenService,
    usage_records_service: UsageRecordService,
    settings: Settings,
) -> Tab:
    return tab_scope.tab(
        KEY,
        lambda: _context(
            tab_scope, api_keys_service, runtime_tokens_service, usage_records_service, settings
        ),
    )


async def _edited(
    tab: Tab,
    form: str,
    current: Any,
    save: Callable[[dict[str, Any]], Awaitable[None]],
    done: str,
) -> Template:
    """A credential's edit form: every field checked at once, then ``save``d; a key
    and a runtime token differ only in what saves them."""
    values = (await tab.scope.form()).texts(*FIELDS)
    changes, errors = read_form(values, now=utcnow(), current=current)
    if errors:
        return await tab.reject(form, FormState(values=values, errors=errors, failed=True))
    try:
        await save(changes)
    except AronaError as exc:
        return await tab.refuse(form, exc, FIELDS, values)
    return await tab.show(done)


async def _issued(tab: Tab, kind: str, name: str | None, value: str) -> Template:
    """The tab with the new credential's value, which is shown this once."""
    return await tab.show(
        f"{kind} created: copy it now, it is shown only once.",
        new_secret={"kind": kind, "name": name, "value": value},
    )


class KeysTab(TabPages, tab=_tab, key=KEY):
    @post("/api-keys")
    async def create_key(
        self,
        tab: Tab,
        project_id: UUID,
        web_user: WebUser,
        api_keys_service: ApiKeyService,
        api_key_sync: ApiKeySync,
    ) -> Template:
        tab.scope.require_credentials("create API keys")
        form = await tab.scope.form()
        values = form.texts("name")
        try:
            data = parse(ApiKeyCreate, compact(values))
        except AronaError as exc:
            return await tab.refuse("api-key", exc, ("name",), values)
        row, secret = await lifecycle.issue_api_key(
            project_id,
            data.name,
            web_user.user.id,
            api_keys_service=api_keys_service,
            api_key_sync=api_key_sync,
        )
        return await _issued(tab, "API key", row.name, secret)

    @post("/api-keys/{key_id:uuid}/edit")
    async def edit_key(
        self,
        tab: Tab,
        project_id: UUID,
        key_id: UUID,
        api_keys_service: ApiKeyService,
        api_key_sync: ApiKeySync,
    ) -> Template:
        """A key's limits, expiry and labels, all checked at once; not rotated."""
        tab.scope.require_credentials("edit API keys")
        current = await api_keys_service.get_in_project(project_id, key_id)

        async def save(changes: dict[str, Any]) -> None:
            await lifecycle.change_api_key(
                project_id,
                key_id,
                changes,
                api_keys_service=api_keys_service,
                api_key_sync=api_key_sync,
            )

        return await _edited(tab, f"edit-{key_id}", current, save, "API key updated.")

    @post("/api-keys/{key_id:uuid}/revoke")
    async def revoke_key(
        self,
        tab: Tab,
        project_id: UUID,
        key_id: UUID,
        api_keys_service: ApiKeyService,
        api_key_sync: ApiKeySync,
    ) -> Template:
        tab.scope.require_credentials("revoke API keys")
        await lifecycle.revoke_api_key(
            project_id, key_id, api_keys_service=api_keys_service, api_key_sync=api_key_sync
        )
        return await tab.show("API key revoked.")

    @post("/runtime-tokens")
    async def create_token(
        self,
        tab: Tab,
        project_id: UUID,
        web_user: WebUser,
        runtime_tokens_service: RuntimeTokenService,
        token_service: TokenService,
        settings: Settings,
    ) -> Template:
        tab.scope.require_credentials("issue runtime tokens")
        form = await tab.scope.form()
        values = form.texts("name", "expiresInSeconds")
        try:
            data = parse(RuntimeTokenCreate, compact(values))
        except AronaError as exc:
            return await tab.refuse("runtime-token", exc, values, values)
        row, issued = await runtime_tokens_service.issue(
            tokens=token_service,
            project_id=project_id,
            name=data.name,
            ttl_seconds=data.expires_in_seconds or settings.runtime_token_ttl_seconds,
            created_by=web_user.user.id,
        )
        return await _issued(tab, "Runtime token", row.name, issued.token)

    @post("/runtime-tokens/{token_id:uuid}/edit")
    async def edit_token(
        self,
        tab: Tab,
        project_id: UUID,
        token_id: UUID,
        runtime_tokens_service: RuntimeTokenService,
        runtime_policy_sync: RuntimePolicySync,
    ) -> Template:
        """A token's limits and labels, or an earlier expiry, all checked at once."""
        tab.scope.require_credentials("edit runtime tokens")
        current = await runtime_tokens_service.get_in_project(project_id, token_id)

        async def save(changes: dict[str, Any]) -> None:
            await lifecycle.change_runtime_token(
                project_id,
                token_id,
                changes,
                runtime_tokens_service=runtime_tokens_service,
                runtime_policy_sync=runtime_policy_sync,
            )

        return await _edited(tab, f"edit-{token_id}", current, save, "Runtime token updated.")

    @post("/runtime-tokens/{token_id:uuid}/revoke")
    async def revoke_token(
        self,
        tab: Tab,
        project_id: UUID,
        token_id: UUID,
        runtime_tokens_service: RuntimeTokenService,
        revocations: RevocationList,
    ) -> Template:
        tab.scope.require_credentials("revoke runtime tokens")
        await lifecycle.revoke_runtime_token(
            project_id,
            token_id,
            runtime_tokens_service=runtime_tokens_service,
            revocations=revocations,
        )
        return await tab.show("Runtime token revoked.")
