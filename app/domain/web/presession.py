"""CSRF for the forms that come before a session: log in and register.

Without it a cross-site ``POST /login`` signs the victim's browser into the
attacker's account (login CSRF). There is no session to hold a token yet, so the
token is bound to a random cookie instead: the page sets ``arona_presession``
(HttpOnly, SameSite=Lax) and puts ``HMAC(key, cookie)`` in the form; a post must
carry both and they must match. Another site can neither read the cookie nor compute
the token (the key derives from ``ARONA_JWT_SECRET``), and one that manages to plant
a cookie of its own still cannot compute the matching token.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from typing import Any

from litestar import Request
from litestar.datastructures import Cookie

PRESESSION_COOKIE = "arona_presession"
PRESESSION_MAX_AGE = 2 * 3600
"""A login page left open longer than this asks for a reload."""
_COOKIE_BYTES = 32


def private_cookie(request: Request[Any, Any, Any], key: str, value: str, max_age: int) -> Cookie:
    """A cookie scripts cannot read, sent to this site only, over HTTPS when the site
    is reached over HTTPS."""
    return Cookie(
        key=key,
        value=value,
        max_age=max_age,
        path="/",
        httponly=True,
        samesite="lax",
        secure=request.url.scheme == "https",
    )


class PresessionTokens:
    """Issue and check the token of a pre-session form."""

    __slots__ = ("_key",)

    def __init__(self, secret: str) -> None:
        self._key = hashlib.sha256(b"arona presession csrf\x00" + secret.encode()).digest()

    def token_for(self, cookie: str) -> str:
        return hmac.new(self._key, cookie.encode(), hashlib.sha256).hexdigest()

    def valid(self, cookie: str | None, sent: str | None) -> bool:
        if not cookie or not sent:
            return False
        return hmac.compare_digest(self.token_for(cookie), sent)

    def issue(self, request: Request[Any, Any, Any]) -> tuple[str, Cookie]:
        """The token for the request's cookie (a new cookie if it has none): what the
        form carries, and the cookie to (re)set with the page."""
        value = request.cookies.get(PRESESSION_COOKIE) or secrets.token_urlsafe(_COOKIE_BYTES)
        cookie = private_cookie(request, PRESESSION_COOKIE, value, PRESESSION_MAX_AGE)
        return self.token_for(value), cookie
