"""Request and response bodies of the auth API (camelCase on the wire)."""

from __future__ import annotations

import datetime
from typing import Annotated
from uuid import UUID

import msgspec

from app.domain.bodies import Camel, Strict

Email = Annotated[str, msgspec.Meta(min_length=3, max_length=320)]
# The upper bound keeps a hostile client from making argon2 hash megabytes.
Password = Annotated[str, msgspec.Meta(min_length=8, max_length=1024)]
LoginPassword = Annotated[str, msgspec.Meta(min_length=1, max_length=1024)]
DisplayName = Annotated[str, msgspec.Meta(max_length=200)]


class RegisterRequest(Strict):
    email: Email
    password: Password
    name: DisplayName = ""


class LoginRequest(Strict):
    email: Email
    password: LoginPassword


class RefreshRequest(Strict):
    refresh_token: Annotated[str, msgspec.Meta(min_length=1, max_length=512)]


class LogoutRequest(Strict):
    refresh_token: Annotated[str, msgspec.Meta(min_length=1, max_length=512)] | None = None


class TokenPair(Camel):
    access_token: str
    refresh_token: str
    expires_in: int
    refresh_expires_in: int
    token_type: str = "Bearer"  # noqa: S105 (a scheme name, not a secret)


class UserOut(Camel):
    id: UUID
    email: str
    name: str
    is_admin: bool
    disabled: bool
    created_at: datetime.datetime
