"""Password hashing with argon2id, kept off the event loop.

argon2 is deliberately slow and memory hungry (64 MiB per hash with the default
profile), so hashing runs on a small dedicated thread pool: the event loop keeps
serving requests, and a burst of logins queues up instead of allocating memory for
every concurrent attempt or starving the loop's default executor (used for DNS).
"""

from __future__ import annotations

import asyncio
import os
import secrets
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

import argon2
from argon2.exceptions import InvalidHashError, VerificationError

_T = TypeVar("_T")

DEFAULT_MAX_WORKERS = 4


class PasswordHasher:
    """argon2id hashing and verification that never blocks the event loop.

    ``time_cost``/``memory_cost``/``parallelism`` default to argon2-cffi's RFC 9106
    low-memory profile; tests pass cheaper values.
    """

    def __init__(
        self,
        *,
        time_cost: int | None = None,
        memory_cost: int | None = None,
        parallelism: int | None = None,
        max_workers: int | None = None,
    ) -> None:
        self._argon2 = argon2.PasswordHasher(
            time_cost=argon2.DEFAULT_TIME_COST if time_cost is None else time_cost,
            memory_cost=argon2.DEFAULT_MEMORY_COST if memory_cost is None else memory_cost,
            parallelism=argon2.DEFAULT_PARALLELISM if parallelism is None else parallelism,
            type=argon2.Type.ID,
        )
        workers = max_workers or max(1, min(DEFAULT_MAX_WORKERS, os.cpu_count() or 1))
        self._executor = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="argon2")
        # Hashed with this instance's parameters so a dummy verify costs what a real
        # one does; the password is random and thrown away, so nothing can match it.
        self._dummy_hash = self._argon2.hash(secrets.token_urlsafe(32))

    async def _run(self, fn: Callable[..., _T], *args: str) -> _T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, fn, *args)

    async def hash(self, password: str) -> str:
        """Hash ``password``; raises ValueError if it cannot be encoded as UTF-8."""
        return await self._run(self._argon2.hash, password)

    def _verify_sync(self, hash: str, password: str) -> bool:
        try:
            return self._argon2.verify(hash, password)
        except (VerificationError, InvalidHashError, ValueError):
            # ValueError covers a non-ASCII hash or an unencodable password (lone
            # surrogates): neither can ever match, so it is a mismatch, not a 500.
            return False

    async def verify(self, hash: str, password: str) -> bool:
        """True if ``password`` matches ``hash``; False on mismatch or an unusable hash."""
        return await self._run(self._verify_sync, hash, password)

    async def verify_dummy(self, password: str) -> None:
        """Spend as long as a failed ``verify`` would, for logins with an unknown email."""
        await self._run(self._verify_sync, self._dummy_hash, password)

    def needs_rehash(self, hash: str) -> bool:
        """True if ``hash`` was made with other parameters (or is not an argon2 hash)."""
        try:
            return self._argon2.check_needs_rehash(hash)
        except (InvalidHashError, ValueError):
            return True

    def close(self) -> None:
        """Release the worker threads; queued hashes are cancelled."""
        self._executor.shutdown(wait=False, cancel_futures=True)
