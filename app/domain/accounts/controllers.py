"""The auth API: register, login, refresh, logout, me."""

from __future__ import annotations

from typing import Any

from litestar import Controller, Request, get, post
from litestar.status_codes import HTTP_200_OK, HTTP_201_CREATED, HTTP_204_NO_CONTENT

from app.db.models import User
from app.domain.accounts.principals import Principal, UserPrincipal
from app.domain.accounts.schemas import (
    LoginRequest,
    LogoutRequest,
    RefreshRequest,
    RegisterRequest,
    TokenPair,
    UserOut,
)
from app.domain.accounts.services import AuthService
from app.domain.paging import from_row
from app.lib.errors import ERRORS_OPT, PermissionDeniedError

# Every field of it is the user's attribute of the same name.
user_out = from_row(UserOut)


def client_address(request: Request[Any, Any, Any]) -> str:
    return request.client.host if request.client else "unknown"


class AuthController(Controller):
    path = "/api/auth"
    tags = ["auth"]

    @post("/register", status_code=HTTP_201_CREATED, opt={ERRORS_OPT: (403,)})
    async def register(self, data: RegisterRequest, auth_service: AuthService) -> UserOut:
        user = await auth_service.register(email=data.email, password=data.password, name=data.name)
        return user_out(user)

    @post("/login", status_code=HTTP_200_OK, opt={ERRORS_OPT: (401, 429)})
    async def login(
        self, request: Request[Any, Any, Any], data: LoginRequest, auth_service: AuthService
    ) -> TokenPair:
        return await auth_service.login(
            email=data.email, password=data.password, client=client_address(request)
        )

    @post("/refresh", status_code=HTTP_200_OK, opt={ERRORS_OPT: (401,)})
    async def refresh(self, data: RefreshRequest, auth_service: AuthService) -> TokenPair:
        return await auth_service.refresh(data.refresh_token)

    @post("/logout", status_code=HTTP_204_NO_CONTENT)
    async def logout(
        self,
        principal: Principal,
        current_user: User,
        auth_service: AuthService,
        data: LogoutRequest | None = None,
    ) -> None:
        if not isinstance(principal, UserPrincipal):
            raise PermissionDeniedError("log out needs a user's access token")
        await auth_service.logout(
            user_id=current_user.id,
            access_jti=principal.jti,
            access_expires=principal.expires_at,
            family_id=principal.family_id,
            refresh_token=data.refresh_token if data else None,
        )

    @get("/me")
    async def me(self, current_user: User) -> UserOut:
        return user_out(current_user)
