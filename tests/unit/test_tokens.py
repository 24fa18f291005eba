from __future__ import annotations

import base64
import json
from datetime import UTC, datetime
from typing import Any

import jwt
import pytest

from app.lib.tokens import IssuedToken, TokenError, TokenService

SECRET = "s" * 64
OTHER_SECRET = "o" * 64
NOW = 1_700_000_000.0


class Clock:
    def __init__(self, now: float = NOW) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def service(clock: Clock | None = None, leeway: int = 0) -> TokenService:
    return TokenService(SECRET, clock=clock or Clock(), leeway=leeway)


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def claims(**overrides: Any) -> dict[str, Any]:
    base = {
        "sub": "user-1",
        "aud": "user",
        "iss": "arona",
        "iat": int(NOW),
        "nbf": int(NOW),
        "exp": int(NOW) + 60,
        "jti": "abc",
    }
    base.update(overrides)
    return {k: v for k, v in base.items() if v is not None}


def assert_reason(svc: TokenService, token: str, audience: str, reason: str) -> TokenError:
    with pytest.raises(TokenError) as info:
        svc.verify(token, audience)
    assert info.value.reason == reason, info.value
    return info.value


def test_roundtrip() -> None:
    svc = service()
    issued = svc.issue("user-1", "user", 900, claims={"role": "admin"})
    assert isinstance(issued, IssuedToken)
    assert issued.issued_at == datetime.fromtimestamp(NOW, UTC)
    assert issued.expires_at == datetime.fromtimestamp(NOW + 900, UTC)
    assert issued.expires_at.tzinfo is UTC
    assert len(issued.jti) == 32

    got = svc.verify(issued.token, "user")
    assert got["sub"] == "user-1"
    assert got["aud"] == "user"
    assert got["iss"] == "arona"
    assert got["jti"] == issued.jti
    assert got["iat"] == got["nbf"] == int(NOW)
    assert got["exp"] == int(NOW) + 900
    assert got["role"] == "admin"
    assert jwt.get_unverified_header(issued.token)["alg"] == "HS256"


def test_explicit_jti_and_unique_default_jti() -> None:
    svc = service()
    assert svc.issue("u", "refresh", 60, jti="fixed").jti == "fixed"
    assert svc.issue("u", "refresh", 60).jti != svc.issue("u", "refresh", 60).jti


def test_issue_rejects_reserved_extra_claims() -> None:
    with pytest.raises(ValueError, match="reserved"):
        service().issue("u", "user", 60, claims={"exp": 10**12})


def test_constructor_rejects_short_secret() -> None:
    with pytest.raises(ValueError, match="at least"):
        TokenService("short")


def test_expired() -> None:
    clock = Clock()
    svc = service(clock)
    token = svc.issue("u", "user", 60).token
    clock.now = NOW + 59
    svc.verify(token, "user")
    clock.now = NOW + 60
    err = assert_reason(svc, token, "user", "expired")
    assert "expired" in str(err)


def test_leeway_extends_expiry() -> None:
    clock = Clock()
    svc = service(clock, leeway=10)
    token = svc.issue("u", "user", 60).token
    clock.now = NOW + 65
    svc.verify(token, "user")
    clock.now = NOW + 70
    assert_reason(svc, token, "user", "expired")


def test_not_yet_valid() -> None:
    clock = Clock()
    svc = service(clock)
    token = svc.issue("u", "user", 60).token
    clock.now = NOW - 5
    assert_reason(svc, token, "user", "not_yet_valid")


def test_future_nbf_rejected() -> None:
    token = jwt.encode(claims(nbf=int(NOW) + 30), SECRET, algorithm="HS256")
    assert_reason(service(), token, "user", "not_yet_valid")


def test_tampered_signature() -> None:
    svc = service()
    token = svc.issue("u", "user", 60).token
    header, payload, signature = token.split(".")
    flipped = ("A" if signature[0] != "A" else "B") + signature[1:]
    assert_reason(svc, f"{header}.{payload}.{flipped}", "user", "invalid_signature")


def test_tampered_payload() -> None:
    svc = service()
    token = svc.issue("u", "user", 60).token
    header, _, signature = token.split(".")
    forged = b64(json.dumps(claims(sub="admin")).encode())
    assert_reason(svc, f"{header}.{forged}.{signature}", "user", "invalid_signature")


def test_wrong_audience() -> None:
    svc = service()
    refresh = svc.issue("u", "refresh", 60).token
    assert_reason(svc, refresh, "user", "invalid_audience")
    assert_reason(svc, refresh, "runtime", "invalid_audience")
    svc.verify(refresh, "refresh")


def test_audience_list_rejected() -> None:
    token = jwt.encode(claims(aud=["user", "refresh"]), SECRET, algorithm="HS256")
    assert_reason(service(), token, "user", "invalid_audience")


def test_wrong_issuer() -> None:
    token = TokenService(SECRET, issuer="someone-else", clock=Clock()).issue("u", "user", 60)
    assert_reason(service(), token.token, "user", "invalid_issuer")


def test_alg_none_rejected() -> None:
    header = b64(json.dumps({"alg": "none", "typ": "JWT"}).encode())
    payload = b64(json.dumps(claims()).encode())
    for token in (f"{header}.{payload}.", f"{header}.{payload}"):
        with pytest.raises(TokenError) as info:
            service().verify(token, "user")
        assert info.value.reason in {"invalid_signature", "malformed"}
    err = assert_reason(service(), f"{header}.{payload}.", "user", "invalid_signature")
    assert "HS256" in str(err)


def test_other_secret_rejected() -> None:
    token = TokenService(OTHER_SECRET, clock=Clock()).issue("u", "user", 60).token
    assert_reason(service(), token, "user", "invalid_signature")


def test_hs512_rejected() -> None:
    token = jwt.encode(claims(), SECRET, algorithm="HS512")
    assert_reason(service(), token, "user", "invalid_signature")


def test_header_alg_swapped_to_hs512_rejected() -> None:
    # A valid HS256 signature under a header that claims another algorithm.
    token = jwt.encode(claims(), SECRET, algorithm="HS256", headers={"alg": "HS512"})
    assert_reason(service(), token, "user", "invalid_signature")


@pytest.mark.parametrize("claim", ["jti", "sub", "exp", "iat", "aud", "iss"])
def test_missing_claim_rejected(claim: str) -> None:
    token = jwt.encode(claims(**{claim: None}), SECRET, algorithm="HS256")
    err = assert_reason(service(), token, "user", "missing_claim")
    assert claim in str(err)


@pytest.mark.parametrize(
    "overrides",
    [{"exp": "9999999999"}, {"exp": True}, {"iat": "now"}, {"jti": 5}, {"sub": 7}, {"jti": ""}],
)
def test_bad_claim_types_rejected(overrides: dict[str, Any]) -> None:
    token = jwt.encode(claims(**overrides), SECRET, algorithm="HS256")
    assert_reason(service(), token, "user", "malformed")


@pytest.mark.parametrize("token", ["", "abc", "a.b.c", "a.b", "....", "eyJ.eyJ.sig"])
def test_malformed(token: str) -> None:
    assert_reason(service(), token, "user", "malformed")


def test_repr_hides_secret() -> None:
    assert SECRET not in repr(service())
