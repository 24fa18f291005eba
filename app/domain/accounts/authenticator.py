"""Turn an ``Authorization`` header into a principal, from memory wherever possible."""

from __future__ import annotations

import time
from collections.abc import Callable
from uuid import UUID

from app.domain.accounts.keyring import ApiKeyIndex
from app.domain.accounts.last_used import LastUsedRecorder
from app.domain.accounts.principals import (
    AdminTokenPrincipal,
    ApiKeyPrincipal,
    Principal,
    RuntimePrincipal,
    UserPrincipal,
)
from app.domain.accounts.revocations import RevocationList
from app.domain.accounts.runtime_policies import RuntimePolicies
from app.domain.accounts.services import ACCESS_AUDIENCE, FAMILY_CLAIM, RUNTIME_AUDIENCE
from app.lib.errors import AuthenticationError
from app.lib.hashing import constant_time_equals, sha256_hex
from app.lib.tokens import TokenError, TokenService

API_KEY_PREFIX = "ak-"
MAX_CREDENTIAL_LENGTH = 4096

_TOKEN_ERROR_MESSAGES = {
    "expired": "token has expired",
    "invalid_audience": "token is not valid for this API",
    "invalid_signature": "token signature is invalid",
    "invalid_issuer": "token issuer is not accepted",
    "not_yet_valid": "token is not valid yet",
}


def bearer_credential(authorization: str | None) -> str | None:
    if not authorization:
        return None
    scheme, _, credential = authorization.strip().partition(" ")
    if scheme.lower() != "bearer" or not credential.strip():
        raise AuthenticationError(
            "Authorization header must be `Bearer <token>`", code="invalid_authorization"
        )
    return credential.strip()


class Authenticator:
    def __init__(
        self,
        *,
        tokens: TokenService,
        revocations: RevocationList,
        api_keys: ApiKeyIndex,
        last_used: LastUsedRecorder,
        admin_token: str | None,
        runtime_policies: RuntimePolicies | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """``runtime_policies``: each runtime token's governance (``None``: none is
        enforced, for tests of the authenticator alone); ``clock``: epoch seconds,
        against which a key's expiry is checked on every use."""
        self._runtime_policies = runtime_policies
        self._clock = clock
        self._tokens = tokens
        self._revocations = revocations
        self._api_keys = api_keys
        self._last_used = last_used
        self._admin_token = admin_token

    async def authenticate(self, authorization: str | None) -> Principal | None:
        """Resolve the caller; ``None`` when no credential was sent at all."""
        credential = bearer_credential(authorization)
        if credential is None:
            return None
        if len(credential) > MAX_CREDENTIAL_LENGTH:
            raise AuthenticationError("credential is not valid", code="invalid_token")
        if credential.startswith(API_KEY_PREFIX):
            return await self._api_key(credential)
        if self._admin_token and constant_time_equals(credential, self._admin_token):
            return AdminTokenPrincipal()
        return await self._jwt(credential)

    async def _api_key(self, credential: str) -> ApiKeyPrincipal:
        found = await self._api_keys.resolve(sha256_hex(credential))
        if found is None:
            raise AuthenticationError("API key is not valid", code="invalid_api_key")
        if found.policy.expired(self._clock()):
            # Checked at use time: no event is needed for a key to expire everywhere.
            raise AuthenticationError("API key has expired", code="api_key_expired")
        self._last_used.touch(found.key_id)
        return ApiKeyPrincipal(
            key_id=found.key_id, project_id=found.project_id, policy=found.policy
        )

    async def _jwt(self, credential: str) -> UserPrincipal | RuntimePrincipal:
        audience = self._tokens.unverified_audience(credential)
        if audience is None:
            raise AuthenticationError("token is malformed", code="invalid_token")
        if audience not in (ACCESS_AUDIENCE, RUNTIME_AUDIENCE):
            raise AuthenticationError("token is not valid for this API", code="invalid_token")
        try:
            claims = self._tokens.verify(credential, audience=audience)
        except TokenError as exc:
            message = _TOKEN_ERROR_MESSAGES.get(exc.reason, "token is malformed")
            code = "token_expired" if exc.reason == "expired" else "invalid_token"
            raise AuthenticationError(message, code=code) from exc
        jti = str(claims["jti"])
        family_id = (
            _optional_uuid(claims.get(FAMILY_CLAIM)) if audience == ACCESS_AUDIENCE else None
        )
        family = str(family_id) if family_id is not None else None
        if await self._revocations.is_revoked(jti, family):
            raise AuthenticationError("token has been revoked", code="token_revoked")
        try:
            subject = UUID(str(claims["sub"]))
        except ValueError as exc:
            raise AuthenticationError("token is malformed", code="invalid_token") from exc
        if audience == ACCESS_AUDIENCE:
            return UserPrincipal(
                user_id=subject,
                jti=jti,
                expires_at=float(claims["exp"]),
                family_id=family_id,
            )
        try:
            token_id = UUID(jti)
        except ValueError as exc:
            raise AuthenticationError("token is malformed", code="invalid_token") from exc
        if self._runtime_policies is None:
            return RuntimePrincipal(token_id=token_id, project_id=subject)
        policy = await self._runtime_policies.get(token_id)
        if policy is None:
            raise AuthenticationError("token has been revoked", code="token_revoked")
        if policy.expired(self._clock()):
            raise AuthenticationError(_TOKEN_ERROR_MESSAGES["expired"], code="token_expired")
        return RuntimePrincipal(token_id=token_id, project_id=subject, policy=policy)


def _optional_uuid(value: object) -> UUID | None:
    if value is None:
        return None
    try:
        return UUID(str(value))
    except ValueError as exc:
        raise AuthenticationError("token is malformed", code="invalid_token") from exc
