"""Bodies of the Projects REST API (camelCase on the wire)."""

from __future__ import annotations

import datetime
from typing import Annotated, Literal
from uuid import UUID

import msgspec

from app.domain.bodies import Camel, Strict

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


class ApiKeyCreate(Strict):
    name: Label = ""


class ApiKeyOut(Camel):
    id: UUID
    name: str
    prefix: str
    created_at: datetime.datetime
    last_used_at: datetime.datetime | None
    revoked_at: datetime.datetime | None


class ApiKeyCreated(Camel):
    id: UUID
    name: str
    prefix: str
    key: str
    created_at: datetime.datetime


class RuntimeTokenCreate(Strict):
    name: Label = ""
    expires_in_seconds: TokenLifetime | None = None


class RuntimeTokenOut(Camel):
    id: UUID
    name: str
    expires_at: datetime.datetime
    created_at: datetime.datetime
    revoked_at: datetime.datetime | None


class RuntimeTokenCreated(Camel):
    id: UUID
    name: str
    token: str
    expires_at: datetime.datetime
    created_at: datetime.datetime
