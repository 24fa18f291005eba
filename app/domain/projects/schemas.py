"""Bodies of the Projects REST API (camelCase on the wire)."""

from __future__ import annotations

import datetime
from typing import Annotated, Literal
from uuid import UUID

import msgspec

from app.domain.accounts.governance import GovernanceFields
from app.domain.bodies import Camel, Strict
from app.domain.usage.schemas import SpendOut

SLUG_PATTERN = r"^[a-z0-9](?:[a-z0-9-]{0,62}[a-z0-9])?$"
# At least one visible character: names are stored stripped.
ProjectName = Annotated[str, msgspec.Meta(min_length=1, max_length=200, pattern=r"\S")]
Slug = Annotated[str, msgspec.Meta(pattern=SLUG_PATTERN, max_length=64)]
Label = Annotated[str, msgspec.Meta(max_length=200)]
Role = Literal["owner", "member"]
# A runtime token lives between one minute and one year.
TokenLifetime = Annotated[int, msgspec.Meta(ge=60, le=366 * 24 * 3600)]


class ProjectCreate(Strict):
    name: ProjectName
    slug: Slug | None = None


class ProjectUpdate(Strict):
    name: ProjectName | msgspec.UnsetType = msgspec.UNSET
    slug: Slug | msgspec.UnsetType = msgspec.UNSET


class ProjectOut(Camel):
    id: UUID
    name: str
    slug: str
    owner_id: UUID
    role: str
    created_at: datetime.datetime
    updated_at: datetime.datetime


class MemberAdd(Strict):
    email: Annotated[str, msgspec.Meta(min_length=3, max_length=320)]
    role: Role = "member"


class MemberOut(Camel):
    user_id: UUID
    email: str
    name: str
    role: str
    added_at: datetime.datetime


class ApiKeyCreate(GovernanceFields):
    name: Label = ""


class ApiKeyUpdate(GovernanceFields):
    """``PATCH``: unsent fields stay, ``null`` clears; the key itself is not rotated."""

    name: Label | msgspec.UnsetType = msgspec.UNSET


class Governance(Camel):
    """A key's or token's limits as shown (``null``: none)."""

    allowed_models: list[str] | None
    rpm: int | None
    tpm: int | None
    budget: str | None
    """An exact decimal amount in the price book's currency."""
    budget_period: str | None
    labels: dict[str, str] | None


class ApiKeyOut(Governance):
    id: UUID
    name: str
    prefix: str
    created_at: datetime.datetime
    last_used_at: datetime.datetime | None
    revoked_at: datetime.datetime | None
    expires_at: datetime.datetime | None
    spend: SpendOut
    """What the key spent in its budget period (see ``SpendOut``)."""


class ApiKeyCreated(Governance):
    id: UUID
    name: str
    prefix: str
    key: str
    created_at: datetime.datetime
    expires_at: datetime.datetime | None


class RuntimeTokenCreate(GovernanceFields):
    """``expiresAt`` or ``expiresInSeconds`` (not both) sets the signed expiry."""

    name: Label = ""
    expires_in_seconds: TokenLifetime | None = None


class RuntimeTokenUpdate(GovernanceFields):
    """``PATCH``: as for API keys, but ``expiresAt`` may only move earlier (the
    token's lifetime is signed into it)."""

    name: Label | msgspec.UnsetType = msgspec.UNSET


class RuntimeTokenOut(Governance):
    id: UUID
    name: str
    expires_at: datetime.datetime
    created_at: datetime.datetime
    revoked_at: datetime.datetime | None
    spend: SpendOut
    """What the token's runtime chats spent in its budget period (see ``SpendOut``)."""


class RuntimeTokenCreated(Governance):
    id: UUID
    name: str
    token: str
    expires_at: datetime.datetime
    created_at: datetime.datetime
