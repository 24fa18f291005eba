from __future__ import annotations

import base64
import uuid

import pytest

from app.lib.settings import VaultKey, parse_vault_keys
from app.lib.vault import (
    Vault,
    VaultDecryptError,
    VaultError,
    VaultKeyMissingError,
    aad,
    generate_key_spec,
    mask,
)

K1 = VaultKey(kid="k1", key=bytes(range(32)))
K2 = VaultKey(kid="k2", key=bytes(range(100, 132)))
PROJECT = uuid.UUID("00000000-0000-4000-8000-000000000001")
ROW = uuid.UUID("00000000-0000-4000-8000-000000000002")
SECRET = "sk-live-very-secret-value-1234"


def owner() -> bytes:
    return aad(PROJECT, "secret", ROW)


def flip_body_byte(token: str, index: int) -> str:
    version, kid, body = token.split(":")
    raw = bytearray(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
    raw[index] ^= 0x01
    return f"{version}:{kid}:{base64.urlsafe_b64encode(bytes(raw)).rstrip(b'=').decode()}"


def test_roundtrip() -> None:
    vault = Vault([K1])
    token = vault.encrypt(SECRET, owner())
    assert token.startswith("v1:k1:")
    assert SECRET not in token
    assert vault.decrypt(token, owner()) == SECRET


def test_roundtrip_unicode_and_empty() -> None:
    vault = Vault([K1])
    for value in ["", "ключ-🔑", "a" * 10_000]:
        assert vault.decrypt(vault.encrypt(value, owner()), owner()) == value


def test_each_encryption_uses_a_fresh_nonce() -> None:
    vault = Vault([K1])
    tokens = {vault.encrypt(SECRET, owner()) for _ in range(50)}
    assert len(tokens) == 50
    nonces = {base64.urlsafe_b64decode(t.split(":")[2] + "==")[:12] for t in tokens}
    assert len(nonces) == 50


def test_wrong_aad_fails() -> None:
    vault = Vault([K1])
    token = vault.encrypt(SECRET, owner())
    other_project = aad(uuid.uuid4(), "secret", ROW)
    other_kind = aad(PROJECT, "backend_key", ROW)
    for wrong in [other_project, other_kind, b""]:
        with pytest.raises(VaultDecryptError) as info:
            vault.decrypt(token, wrong)
        assert SECRET not in str(info.value)


@pytest.mark.parametrize("index", [0, 11, 12, -1])
def test_tampered_ciphertext_fails(index: int) -> None:
    vault = Vault([K1])
    token = vault.encrypt(SECRET, owner())
    with pytest.raises(VaultDecryptError):
        vault.decrypt(flip_body_byte(token, index), owner())


def test_kid_is_authenticated() -> None:
    # Same key material under two ids: relabelling the token must still fail.
    twin = VaultKey(kid="twin", key=K1.key)
    vault = Vault([K1, twin])
    token = vault.encrypt(SECRET, owner())
    relabelled = token.replace("v1:k1:", "v1:twin:", 1)
    with pytest.raises(VaultDecryptError):
        vault.decrypt(relabelled, owner())


def test_aad_encoding_is_unambiguous() -> None:
    assert aad("ab", "c") != aad("a", "bc")
    assert aad("a", "") != aad("a")
    assert aad("a:b") != aad("a", "b")
    assert aad("a\x00b") != aad("a", "b")
    assert aad(PROJECT, "x") == aad(str(PROJECT), "x")


def test_aad_ambiguity_does_not_decrypt() -> None:
    vault = Vault([K1])
    token = vault.encrypt(SECRET, aad("ab", "c"))
    with pytest.raises(VaultDecryptError):
        vault.decrypt(token, aad("a", "bc"))


def test_aad_rejects_no_parts_and_bad_types() -> None:
    with pytest.raises(ValueError, match="at least one part"):
        aad()
    with pytest.raises(TypeError):
        aad(1)  # type: ignore[arg-type]


def test_rotation_decrypts_old_and_reencrypts_to_newest() -> None:
    old = Vault([K1])
    token_k1 = old.encrypt(SECRET, owner())

    rotated = Vault([K2, K1])
    assert rotated.newest_kid == "k2"
    assert rotated.key_id_of(token_k1) == "k1"
    assert rotated.needs_rotation(token_k1)
    assert rotated.decrypt(token_k1, owner()) == SECRET

    token_k2 = rotated.reencrypt(token_k1, owner())
    assert rotated.key_id_of(token_k2) == "k2"
    assert not rotated.needs_rotation(token_k2)
    assert rotated.decrypt(token_k2, owner()) == SECRET
    assert Vault([K2]).decrypt(token_k2, owner()) == SECRET


def test_reencrypt_checks_aad() -> None:
    rotated = Vault([K2, K1])
    token_k1 = Vault([K1]).encrypt(SECRET, owner())
    with pytest.raises(VaultDecryptError):
        rotated.reencrypt(token_k1, aad(PROJECT, "secret", uuid.uuid4()))


def test_missing_key_names_the_kid_without_leaking() -> None:
    token_k1 = Vault([K1]).encrypt(SECRET, owner())
    with pytest.raises(VaultKeyMissingError) as info:
        Vault([K2]).decrypt(token_k1, owner())
    message = str(info.value)
    assert isinstance(info.value, VaultError)
    assert info.value.kid == "k1"
    assert "'k1'" in message
    assert "ARONA_VAULT_KEYS" in message
    assert SECRET not in message
    for key in (K1.key, K2.key):
        assert base64.b64encode(key).decode() not in message
        assert base64.urlsafe_b64encode(key).decode().rstrip("=") not in message
        assert key.hex() not in message


@pytest.mark.parametrize(
    "token",
    [
        "",
        "garbage",
        "v1:k1",
        "v1:k1:",
        "v2:k1:AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA",
        "v1::AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA",
        "v1:k1:AAAA:AAAA",
        "v1:k1:not base64!",
        "v1:k1:AAAA",  # shorter than nonce + tag
        "v1:k1:A",
    ],
)
def test_malformed_tokens(token: str) -> None:
    vault = Vault([K1])
    with pytest.raises(VaultDecryptError):
        vault.decrypt(token, owner())


def test_malformed_token_for_key_id_of() -> None:
    with pytest.raises(VaultDecryptError):
        Vault([K1]).key_id_of("nope")


def test_constructor_validation() -> None:
    with pytest.raises(ValueError, match="at least one key"):
        Vault([])
    with pytest.raises(ValueError, match="32 bytes"):
        Vault([VaultKey(kid="short", key=b"x" * 16)])
    with pytest.raises(ValueError, match="twice"):
        Vault([K1, VaultKey(kid="k1", key=K2.key)])
    with pytest.raises(ValueError, match="key ids"):
        Vault([VaultKey(kid="bad:kid", key=K1.key)])


def test_repr_hides_key_material() -> None:
    text = repr(Vault([K1, K2]))
    assert "k1" in text
    assert K1.key.hex() not in text
    assert repr(K1.key) not in text


def test_generate_key_spec_is_parsable_and_random() -> None:
    spec = generate_key_spec("demo")
    (key,) = parse_vault_keys(spec)
    assert key.kid == "demo"
    assert len(key.key) == 32
    assert generate_key_spec("demo") != spec
    vault = Vault([key])
    assert vault.decrypt(vault.encrypt(SECRET, owner()), owner()) == SECRET
    with pytest.raises(ValueError, match="key ids"):
        generate_key_spec("a:b")


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("", "••••"),
        ("abc", "••••"),
        ("abcd", "••••"),
        ("abcde", "••••bcde"),
        ("sk-live-1234567890abcd", "••••abcd"),
    ],
)
def test_mask(value: str, expected: str) -> None:
    assert mask(value) == expected
