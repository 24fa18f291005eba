"""Envelope-free secret encryption for values stored in the database.

Each secret is sealed with AES-256-GCM under the newest master key and stored as a
self-describing text token ``v1:<kid>:<base64url(nonce || ciphertext+tag)>``. The key
id travels with the row so master keys can rotate without a flag day: old rows stay
readable as long as their key is still configured, and ``reencrypt`` moves them to
the newest key.

Associated data ties a ciphertext to the row that owns it, so a value copied into
another project's row (or another column of the same row) fails to decrypt instead
of leaking across tenants.
"""

from __future__ import annotations

import base64
import binascii
import re
import secrets
import struct
from collections.abc import Sequence
from typing import TYPE_CHECKING
from uuid import UUID

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from app.lib.settings import VaultKey, valid_key_id

if TYPE_CHECKING:
    from app.lib.settings import Settings

FORMAT_VERSION = "v1"
KEY_BYTES = 32
NONCE_BYTES = 12
TAG_BYTES = 16
MASK = "••••"
# Versioned so a future change of encoding cannot collide with today's bytes.
_AAD_DOMAIN = b"arona.vault.aad.v1"
# Kids end up in env vars (`kid:base64,...`) and in tokens split on ":".
_B64URL_RE = re.compile(r"[A-Za-z0-9_-]+")


class VaultError(Exception):
    """Base class for vault failures. Messages never carry plaintext or key material."""


class VaultKeyMissingError(VaultError):
    """The token was sealed with a key id that is not configured."""

    def __init__(self, kid: str) -> None:
        self.kid = kid
        super().__init__(
            f"vault key {kid!r} is not configured, so secrets encrypted with it cannot be "
            f"read: add `{kid}:<base64 key>` to ARONA_VAULT_KEYS (after the newest key) "
            "and restart, then run `arona vault rotate` to move them to the newest key"
        )


class VaultDecryptError(VaultError):
    """The token is malformed, was tampered with, or belongs to another owner row."""


def aad(*parts: str | UUID) -> bytes:
    """Canonical associated data for an owner row, e.g. ``aad(project_id, "secret", row_id)``.

    Each part is length-prefixed so that ``("ab", "c")`` and ``("a", "bc")`` differ.
    A UUID and its canonical string form encode identically, so callers holding
    either type produce the same bytes.
    """
    if not parts:
        raise ValueError("aad() needs at least one part identifying the owner row")
    out = bytearray(_AAD_DOMAIN)
    out += struct.pack(">I", len(parts))
    for part in parts:
        if not isinstance(part, str | UUID):
            raise TypeError(f"aad() parts must be str or UUID, got {type(part).__name__}")
        encoded = str(part).encode("utf-8")
        out += struct.pack(">I", len(encoded))
        out += encoded
    return bytes(out)


def mask(value: str) -> str:
    """A display hint for a secret: ``••••`` plus its last four characters."""
    if len(value) <= 4:
        return MASK
    return MASK + value[-4:]


def generate_key_spec(kid: str) -> str:
    """A fresh ``kid:base64-32-bytes`` entry for ARONA_VAULT_KEYS."""
    _check_kid(kid)
    return f"{kid}:{base64.b64encode(secrets.token_bytes(KEY_BYTES)).decode('ascii')}"


def _check_kid(kid: str) -> None:
    if not valid_key_id(kid):
        raise ValueError(
            "vault key ids must be 1-64 characters of letters, digits, '.', '_' or '-'"
        )


def _b64url_encode(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


def _b64url_decode(text: str) -> bytes:
    # urlsafe_b64decode silently skips characters outside the alphabet; check first
    # so that two different strings never decode to the same ciphertext.
    if not _B64URL_RE.fullmatch(text):
        raise VaultDecryptError("malformed vault token: body is not base64url")
    try:
        return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (binascii.Error, ValueError) as exc:
        raise VaultDecryptError("malformed vault token: body is not base64url") from exc


def _split(token: str) -> tuple[str, str]:
    if not isinstance(token, str):
        raise VaultDecryptError("malformed vault token: expected text")
    parts = token.split(":")
    if len(parts) != 3:
        raise VaultDecryptError("malformed vault token: expected `v1:<kid>:<data>`")
    version, kid, body = parts
    if version != FORMAT_VERSION:
        raise VaultDecryptError("malformed vault token: unsupported version")
    if not valid_key_id(kid):
        raise VaultDecryptError("malformed vault token: invalid key id")
    return kid, body


def _gcm_aad(kid: str, owner_aad: bytes) -> bytes:
    # Authenticating the header too means a token cannot be relabelled with another
    # version or kid (say, one configured twice under different ids) and still open.
    header = f"{FORMAT_VERSION}:{kid}".encode("ascii")
    return struct.pack(">I", len(header)) + header + owner_aad


class Vault:
    """Encrypts and decrypts secrets with a ring of master keys, newest first."""

    __slots__ = ("_ciphers", "_newest_kid")

    def __init__(self, keys: Sequence[VaultKey]) -> None:
        if not keys:
            raise ValueError("Vault needs at least one key (ARONA_VAULT_KEYS is empty)")
        ciphers: dict[str, AESGCM] = {}
        for key in keys:
            _check_kid(key.kid)
            if key.kid in ciphers:
                raise ValueError(f"vault key id {key.kid!r} is listed twice")
            if len(key.key) != KEY_BYTES:
                raise ValueError(
                    f"vault key {key.kid!r} must be {KEY_BYTES} bytes, got {len(key.key)}"
                )
            ciphers[key.kid] = AESGCM(key.key)
        self._ciphers = ciphers
        self._newest_kid = keys[0].kid

    @classmethod
    def from_settings(cls, settings: Settings) -> Vault:
        return cls(settings.vault_keys)

    def __repr__(self) -> str:
        return f"Vault(kids={list(self._ciphers)!r})"

    @property
    def newest_kid(self) -> str:
        return self._newest_kid

    @property
    def kids(self) -> tuple[str, ...]:
        return tuple(self._ciphers)

    def encrypt(self, plaintext: str, aad: bytes) -> str:
        kid = self._newest_kid
        nonce = secrets.token_bytes(NONCE_BYTES)
        sealed = self._ciphers[kid].encrypt(nonce, plaintext.encode("utf-8"), _gcm_aad(kid, aad))
        return f"{FORMAT_VERSION}:{kid}:{_b64url_encode(nonce + sealed)}"

    def decrypt(self, token: str, aad: bytes) -> str:
        kid, body = _split(token)
        cipher = self._ciphers.get(kid)
        if cipher is None:
            raise VaultKeyMissingError(kid)
        raw = _b64url_decode(body)
        if len(raw) < NONCE_BYTES + TAG_BYTES:
            raise VaultDecryptError("malformed vault token: too short")
        nonce, sealed = raw[:NONCE_BYTES], raw[NONCE_BYTES:]
        try:
            plaintext = cipher.decrypt(nonce, sealed, _gcm_aad(kid, aad))
        except InvalidTag:
            raise VaultDecryptError(
                f"vault token (key {kid!r}) failed authentication: it was altered or "
                "belongs to a different owner row"
            ) from None
        try:
            return plaintext.decode("utf-8")
        except UnicodeDecodeError:
            # Only reachable if something other than encrypt() sealed the bytes.
            raise VaultDecryptError("vault token does not contain UTF-8 text") from None

    def key_id_of(self, token: str) -> str:
        return _split(token)[0]

    def needs_rotation(self, token: str) -> bool:
        return self.key_id_of(token) != self._newest_kid

    def reencrypt(self, token: str, aad: bytes) -> str:
        """Decrypt with whichever configured key sealed ``token``; seal again with the newest."""
        return self.encrypt(self.decrypt(token, aad), aad)
