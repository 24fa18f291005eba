"""Signed JWTs (HS256) for access, refresh and runtime tokens.

One secret signs every audience, so the audience claim is what keeps a refresh token
from being replayed as an access token: ``verify`` always demands an exact audience.
Time checks use the injected clock rather than PyJWT's wall clock so expiry is
testable and consistent with the rest of the service.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final, Literal

import jwt

from app.lib.settings import MIN_JWT_SECRET_LENGTH

ALGORITHM: Final = "HS256"
AUDIENCE_USER: Final = "user"
AUDIENCE_REFRESH: Final = "refresh"
AUDIENCE_RUNTIME: Final = "runtime"

RESERVED_CLAIMS: Final = frozenset({"sub", "aud", "iss", "iat", "nbf", "exp", "jti"})
REQUIRED_CLAIMS: Final = ("exp", "iat", "aud", "iss", "jti", "sub")

TokenErrorReason = Literal[
    "expired",
    "invalid_audience",
    "invalid_signature",
    "malformed",
    "missing_claim",
    "not_yet_valid",
    "invalid_issuer",
]


class TokenError(Exception):
    """A token was rejected; ``reason`` is stable for callers, the message is for humans."""

    def __init__(self, reason: TokenErrorReason, message: str) -> None:
        super().__init__(message)
        self.reason: TokenErrorReason = reason
        self.message = message


@dataclass(frozen=True, slots=True)
class IssuedToken:
    token: str
    jti: str
    expires_at: datetime
    issued_at: datetime


def _numeric_claim(claims: Mapping[str, Any], name: str) -> float:
    value = claims[name]
    # bool is an int subclass; `"exp": true` must not pass as a timestamp.
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TokenError("malformed", f"token claim {name!r} must be a number")
    return float(value)


class TokenService:
    """Issues and verifies HS256 JWTs for one issuer."""

    def __init__(
        self,
        secret: str,
        issuer: str = "arona",
        clock: Callable[[], float] = time.time,
        leeway: int = 0,
    ) -> None:
        if len(secret) < MIN_JWT_SECRET_LENGTH:
            raise ValueError(f"the JWT secret must be at least {MIN_JWT_SECRET_LENGTH} characters")
        if not issuer:
            raise ValueError("the JWT issuer must not be empty")
        if leeway < 0:
            raise ValueError("leeway must be >= 0")
        self._secret = secret
        self.issuer = issuer
        self._clock = clock
        self.leeway = leeway

    def __repr__(self) -> str:
        return f"TokenService(issuer={self.issuer!r}, leeway={self.leeway})"

    def issue(
        self,
        subject: str,
        audience: str,
        ttl_seconds: int,
        claims: Mapping[str, Any] | None = None,
        jti: str | None = None,
    ) -> IssuedToken:
        if not subject:
            raise ValueError("token subject must not be empty")
        if not audience:
            raise ValueError("token audience must not be empty")
        if ttl_seconds <= 0:
            raise ValueError("ttl_seconds must be positive")
        extra = dict(claims or {})
        clashing = RESERVED_CLAIMS.intersection(extra)
        if clashing:
            # Letting callers override these would make e.g. `exp` or `aud`
            # silently differ from what the arguments say.
            raise ValueError(f"extra claims may not set reserved claims: {sorted(clashing)}")
        token_id = jti if jti is not None else uuid.uuid4().hex
        if not token_id:
            raise ValueError("jti must not be empty")
        issued_at = int(self._clock())
        expires_at = issued_at + ttl_seconds
        payload: dict[str, Any] = {
            **extra,
            "sub": subject,
            "aud": audience,
            "iss": self.issuer,
            "iat": issued_at,
            "nbf": issued_at,
            "exp": expires_at,
            "jti": token_id,
        }
        token = jwt.encode(payload, self._secret, algorithm=ALGORITHM)
        return IssuedToken(
            token=token,
            jti=token_id,
            expires_at=datetime.fromtimestamp(expires_at, UTC),
            issued_at=datetime.fromtimestamp(issued_at, UTC),
        )

    @staticmethod
    def unverified_audience(token: str) -> str | None:
        """The ``aud`` claim read without verification, only to pick which audience to
        verify against; the token is then fully verified for that audience."""
        try:
            claims = jwt.decode(token, options={"verify_signature": False})
        except jwt.InvalidTokenError:
            return None
        audience = claims.get("aud") if isinstance(claims, dict) else None
        return audience if isinstance(audience, str) else None

    def verify(self, token: str, audience: str) -> dict[str, Any]:
        """Return the claims of a valid token for ``audience``; raise TokenError otherwise."""
        try:
            header = jwt.get_unverified_header(token)
        except jwt.InvalidTokenError:
            raise TokenError("malformed", "token is not a well-formed JWT") from None
        # PyJWT enforces `algorithms` too; checking here keeps the rule visible and
        # independent of library defaults (no "none", no HS512/RS256 confusion).
        if header.get("alg") != ALGORITHM:
            raise TokenError("invalid_signature", f"token must be signed with {ALGORITHM}")
        try:
            claims: dict[str, Any] = jwt.decode(
                token,
                self._secret,
                algorithms=[ALGORITHM],
                audience=audience,
                issuer=self.issuer,
                options={
                    "require": list(REQUIRED_CLAIMS),
                    "strict_aud": True,
                    # Checked below against the injected clock.
                    "verify_exp": False,
                    "verify_nbf": False,
                    "verify_iat": False,
                },
            )
        except jwt.InvalidSignatureError:
            raise TokenError("invalid_signature", "token signature is invalid") from None
        except jwt.InvalidAlgorithmError:
            raise TokenError(
                "invalid_signature", f"token must be signed with {ALGORITHM}"
            ) from None
        except jwt.MissingRequiredClaimError as exc:
            raise TokenError("missing_claim", f"token is missing the {exc.claim!r} claim") from None
        except jwt.InvalidAudienceError:
            raise TokenError(
                "invalid_audience", f"token is not valid for audience {audience!r}"
            ) from None
        except jwt.InvalidIssuerError:
            raise TokenError("invalid_issuer", "token was issued by someone else") from None
        except jwt.InvalidTokenError:
            raise TokenError("malformed", "token is not a well-formed JWT") from None

        self._check_times(claims)
        if not isinstance(claims["sub"], str) or not claims["sub"]:
            raise TokenError("malformed", "token claim 'sub' must be a non-empty string")
        if not isinstance(claims["jti"], str) or not claims["jti"]:
            raise TokenError("malformed", "token claim 'jti' must be a non-empty string")
        return claims

    def _check_times(self, claims: Mapping[str, Any]) -> None:
        now = self._clock()
        exp = _numeric_claim(claims, "exp")
        iat = _numeric_claim(claims, "iat")
        if exp <= now - self.leeway:
            raise TokenError("expired", "token has expired")
        if iat > now + self.leeway:
            raise TokenError("not_yet_valid", "token was issued in the future")
        if "nbf" in claims:
            nbf = _numeric_claim(claims, "nbf")
            if nbf > now + self.leeway:
                raise TokenError("not_yet_valid", "token is not valid yet")
