"""Webhook signatures, Stripe-style: ``X-Arona-Signature: t=<unix seconds>,v1=<hex>``.

``v1`` is the hex HMAC-SHA256, keyed with the webhook's signing secret (the whole
``whsec_...`` string as UTF-8), of ``"<t>." + <the raw request body>``. Signing the
timestamp with the body lets a receiver refuse a replayed request: it checks the
signature, then that ``t`` is within a few minutes of its own clock.

Right after a secret is rotated, the previous secret keeps signing for a while: the
header then carries two ``v1`` values (new secret first) and a receiver accepts the
request if any of them matches the secret it holds. ``verify`` is the reference
receiver check (docs/projects-api.md shows the same recipe to copy).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from collections.abc import Sequence

SIGNATURE_HEADER = "X-Arona-Signature"
EVENT_HEADER = "X-Arona-Event"
DELIVERY_HEADER = "X-Arona-Delivery"
ATTEMPT_HEADER = "X-Arona-Attempt"
SECRET_PREFIX = "whsec_"  # noqa: S105 (a prefix, not a password)
DEFAULT_TOLERANCE_SECONDS = 300
"""How far from the receiver's clock a signed timestamp may be (replays, clock skew)."""


def new_secret() -> str:
    """A fresh signing secret: 32 random bytes, URL-safe, with a recognisable prefix."""
    return SECRET_PREFIX + secrets.token_urlsafe(32)


def signature(secret: str, timestamp: int, body: bytes) -> str:
    """The hex ``v1`` value of ``body`` sent at ``timestamp`` under ``secret``."""
    message = str(timestamp).encode("ascii") + b"." + body
    return hmac.new(secret.encode("utf-8"), message, hashlib.sha256).hexdigest()


def signature_header(secrets_: Sequence[str], timestamp: int, body: bytes) -> str:
    """The header value: ``t=...`` then one ``v1=...`` per secret (current first)."""
    parts = [f"t={timestamp}"]
    parts.extend(f"v1={signature(secret, timestamp, body)}" for secret in secrets_)
    return ",".join(parts)


def verify(
    secret: str,
    header: str,
    body: bytes,
    *,
    tolerance: float = DEFAULT_TOLERANCE_SECONDS,
    now: float | None = None,
) -> bool:
    """Whether ``header`` signs ``body`` with ``secret`` at a time within ``tolerance``
    seconds of ``now`` (the receiver's side; constant-time comparison)."""
    timestamp: int | None = None
    candidates: list[str] = []
    for part in header.split(","):
        key, _, value = part.strip().partition("=")
        if key == "t" and value.isdigit():
            timestamp = int(value)
        elif key == "v1":
            candidates.append(value)
    if timestamp is None or not candidates:
        return False
    current = time.time() if now is None else now
    if abs(current - timestamp) > tolerance:
        return False
    expected = signature(secret, timestamp, body)
    return any(hmac.compare_digest(expected, candidate) for candidate in candidates)
