"""Writes whose effects reach beyond the database, shared by the Projects API and the
console so the two can never drift apart.

Runtime JWTs are checked without the database and API keys are looked up in every
replica's in-memory key ring: deleting a project or revoking a credential must also
revoke the live tokens and drop the keys from every ring, not just delete rows.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from uuid import UUID

from app.db.models import ApiKey, RuntimeToken
from app.domain.accounts.credential_services import (
    ApiKeyService,
    RuntimeTokenService,
    TokenRevocationService,
)
from app.domain.accounts.keyring import active_key
from app.domain.accounts.revocations import RevocationList
from app.domain.accounts.runtime_policies import RuntimePolicySync
from app.domain.accounts.sync import ApiKeySync
from app.domain.projects.services import ProjectService


async def delete_project(
    project_id: UUID,
    *,
    projects_service: ProjectService,
    runtime_tokens_service: RuntimeTokenService,
    token_revocations_service: TokenRevocationService,
    revocations: RevocationList,
    api_key_sync: ApiKeySync,
) -> None:
    # The rows go with the project (ON DELETE CASCADE); the live tokens are read first
    # and recorded in token_revocation in the same transaction as the delete (the
    # services share the request's session), so a restart or a Redis outage, which
    # rebuild the revocation marks from the database, cannot bring them back.
    tokens = await runtime_tokens_service.unexpired_in_project(project_id)
    await token_revocations_service.record(tokens)
    await projects_service.delete(project_id, auto_commit=True)
    await api_key_sync.project_deleted(project_id)
    for token in tokens:
        await revocations.revoke(str(token.id), token.expires_at.timestamp())


async def issue_api_key(
    project_id: UUID,
    name: str,
    created_by: UUID | None,
    *,
    api_keys_service: ApiKeyService,
    api_key_sync: ApiKeySync,
    governance: Mapping[str, Any] | None = None,
) -> tuple[ApiKey, str]:
    """A new key (its secret returned once), usable at once on every replica."""
    row, secret = await api_keys_service.issue(
        project_id=project_id, name=name, created_by=created_by, governance=governance
    )
    await api_key_sync.created(row.key_hash, active_key(row))
    return row, secret


async def change_api_key(
    project_id: UUID,
    key_id: UUID,
    values: Mapping[str, Any],
    *,
    api_keys_service: ApiKeyService,
    api_key_sync: ApiKeySync,
) -> ApiKey:
    """New governance (or name) for a key, held by every replica's index at once
    (this one now, the others when the event arrives); the key is not rotated."""
    row = await api_keys_service.change(project_id, key_id, values)
    await api_key_sync.updated(row.key_hash, active_key(row))
    return row


async def change_runtime_token(
    project_id: UUID,
    token_id: UUID,
    values: Mapping[str, Any],
    *,
    runtime_tokens_service: RuntimeTokenService,
    runtime_policy_sync: RuntimePolicySync,
) -> RuntimeToken:
    """New governance for a runtime token, forgotten by every replica's policy cache."""
    row = await runtime_tokens_service.change(project_id, token_id, values)
    await runtime_policy_sync.changed(row.id)
    return row


async def revoke_api_key(
    project_id: UUID, key_id: UUID, *, api_keys_service: ApiKeyService, api_key_sync: ApiKeySync
) -> ApiKey:
    row = await api_keys_service.revoke(project_id, key_id)
    await api_key_sync.revoked(row.key_hash)
    return row


async def revoke_runtime_token(
    project_id: UUID,
    token_id: UUID,
    *,
    runtime_tokens_service: RuntimeTokenService,
    revocations: RevocationList,
) -> RuntimeToken:
    row = await runtime_tokens_service.revoke(project_id, token_id)
    await revocations.revoke(str(row.id), row.expires_at.timestamp())
    return row
