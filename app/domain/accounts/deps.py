"""Dependency providers of the accounts area (resolved by name by Litestar)."""

from __future__ import annotations

from typing import Any

from advanced_alchemy.extensions.litestar.providers import create_service_provider
from litestar import Request
from litestar.di import Provide

from app.db.models import User
from app.domain.accounts.authenticator import Authenticator
from app.domain.accounts.credential_services import (
    ApiKeyService,
    RuntimeTokenService,
    TokenRevocationService,
)
from app.domain.accounts.principals import AdminTokenPrincipal, Principal, UserPrincipal
from app.domain.accounts.revocations import RevocationList
from app.domain.accounts.services import AuthService, RefreshTokenService, UserService
from app.lib.errors import AuthenticationError, PermissionDeniedError
from app.lib.passwords import PasswordHasher
from app.lib.settings import Settings
from app.lib.state.base import StateStore
from app.lib.tokens import TokenService


async def provide_principal(
    request: Request[Any, Any, Any], authenticator: Authenticator
) -> Principal:
    principal = await authenticator.authenticate(request.headers.get("authorization"))
    if principal is None:
        raise AuthenticationError("authentication required", code="missing_credentials")
    return principal


async def provide_current_user(principal: Principal, users_service: UserService) -> User:
    """The signed-in user; API keys, runtime tokens and the admin token are refused."""
    if not isinstance(principal, UserPrincipal):
        raise PermissionDeniedError(
            "this endpoint needs a user's access token", code="user_token_required"
        )
    user = await users_service.get_one_or_none(User.id == principal.user_id)
    if user is None:
        raise AuthenticationError("the user of this token no longer exists", code="invalid_token")
    if user.disabled:
        raise AuthenticationError("this account is disabled", code="account_disabled")
    return user


async def require_platform_admin(principal: Principal, users_service: UserService) -> Principal:
    if isinstance(principal, AdminTokenPrincipal):
        return principal
    if isinstance(principal, UserPrincipal):
        user = await provide_current_user(principal, users_service)
        if user.is_admin:
            return principal
    raise PermissionDeniedError("platform admin only", code="admin_required")


def provide_auth_service(
    settings: Settings,
    users_service: UserService,
    refresh_tokens_service: RefreshTokenService,
    password_hasher: PasswordHasher,
    token_service: TokenService,
    revocations: RevocationList,
    state_store: StateStore,
) -> AuthService:
    return AuthService(
        settings=settings,
        users=users_service,
        refresh_tokens=refresh_tokens_service,
        passwords=password_hasher,
        tokens=token_service,
        revocations=revocations,
        state=state_store,
    )


def accounts_dependencies() -> dict[str, Provide]:
    return {
        "principal": Provide(provide_principal),
        "current_user": Provide(provide_current_user),
        "users_service": Provide(create_service_provider(UserService)),
        "refresh_tokens_service": Provide(create_service_provider(RefreshTokenService)),
        "api_keys_service": Provide(create_service_provider(ApiKeyService)),
        "runtime_tokens_service": Provide(create_service_provider(RuntimeTokenService)),
        "token_revocations_service": Provide(create_service_provider(TokenRevocationService)),
        "auth_service": Provide(provide_auth_service, sync_to_thread=False),
    }
