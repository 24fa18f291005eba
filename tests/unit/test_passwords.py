from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from app.lib.passwords import PasswordHasher

# Cheap parameters: these tests check behaviour, not cost.
CHEAP = {"time_cost": 1, "memory_cost": 8, "parallelism": 1}


@pytest.fixture
def hasher() -> Iterator[PasswordHasher]:
    h = PasswordHasher(**CHEAP)
    yield h
    h.close()


async def test_hash_and_verify(hasher: PasswordHasher) -> None:
    hashed = await hasher.hash("correct horse battery staple")
    assert hashed.startswith("$argon2id$")
    assert "correct horse" not in hashed
    assert await hasher.verify(hashed, "correct horse battery staple") is True
    assert await hasher.verify(hashed, "Correct horse battery staple") is False
    assert await hasher.verify(hashed, "") is False


async def test_hashes_are_salted(hasher: PasswordHasher) -> None:
    first = await hasher.hash("same password")
    second = await hasher.hash("same password")
    assert first != second
    assert await hasher.verify(second, "same password")


async def test_default_parameters_are_argon2id() -> None:
    h = PasswordHasher()
    try:
        hashed = await h.hash("pw")
        assert hashed.startswith("$argon2id$v=19$m=65536,t=3,p=4$")
    finally:
        h.close()


@pytest.mark.parametrize(
    "bad_hash",
    ["", "garbage", "$argon2id$v=19$m=8,t=1,p=1$bad$bad", "$2b$12$abcdefghijklmnopqrstuv", "ü"],
)
async def test_verify_with_unusable_hash_returns_false(
    hasher: PasswordHasher, bad_hash: str
) -> None:
    assert await hasher.verify(bad_hash, "whatever") is False


async def test_verify_unencodable_password_returns_false(hasher: PasswordHasher) -> None:
    hashed = await hasher.hash("pw")
    assert await hasher.verify(hashed, "\ud800") is False


async def test_needs_rehash(hasher: PasswordHasher) -> None:
    hashed = await hasher.hash("pw")
    assert hasher.needs_rehash(hashed) is False
    stronger = PasswordHasher(time_cost=2, memory_cost=8, parallelism=1)
    try:
        assert stronger.needs_rehash(hashed) is True
    finally:
        stronger.close()
    assert hasher.needs_rehash("garbage") is True


async def test_verify_runs_off_the_event_loop(hasher: PasswordHasher) -> None:
    hashed = await hasher.hash("pw")
    order: list[str] = []

    async def verify() -> None:
        assert await hasher.verify(hashed, "pw")
        order.append("verified")

    async def other() -> None:
        order.append("other ran")

    # verify is scheduled first: if it hashed on the loop thread it would finish
    # before `other` got a turn.
    await asyncio.gather(verify(), other())
    assert order == ["other ran", "verified"]


async def test_verify_dummy_runs_off_the_event_loop(hasher: PasswordHasher) -> None:
    order: list[str] = []

    async def dummy() -> None:
        await hasher.verify_dummy("anything")
        order.append("dummy done")

    async def other() -> None:
        order.append("other ran")

    await asyncio.gather(dummy(), other())
    assert order == ["other ran", "dummy done"]


async def test_dummy_hash_matches_real_parameters(hasher: PasswordHasher) -> None:
    hashed = await hasher.hash("pw")
    # The dummy must cost the same as a real verify, i.e. share the parameters.
    assert not hasher.needs_rehash(hasher._dummy_hash)
    assert hasher._dummy_hash.rsplit("$", 2)[0] == hashed.rsplit("$", 2)[0]
    await hasher.verify_dummy("")
