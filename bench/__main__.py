"""Benchmark entry point (``make bench``).

The side-by-side harness against LiteLLM arrives with the performance step. Until
then this measures the one hot-path primitive that exists: resolving an API key
from the in-process index (valid, and a flood of unknown keys), and prints figures.
"""

from __future__ import annotations

import asyncio
import time
import uuid

from app.domain.accounts.keyring import ActiveApiKey, ApiKeyIndex
from app.lib.hashing import random_secret, sha256_hex


async def _no_keys() -> list[tuple[str, ActiveApiKey]]:
    return []


async def _never_found(_: str) -> ActiveApiKey | None:
    return None


async def main() -> None:
    index = ApiKeyIndex(_no_keys, _never_found)
    secrets = [random_secret("ak-") for _ in range(10_000)]
    for secret in secrets:
        index.add(sha256_hex(secret), ActiveApiKey(key_id=uuid.uuid4(), project_id=uuid.uuid4()))
    rounds = 100_000
    started = time.perf_counter()
    for i in range(rounds):
        await index.resolve(sha256_hex(secrets[i % len(secrets)]))
    valid = (time.perf_counter() - started) / rounds
    started = time.perf_counter()
    for _ in range(rounds):
        await index.resolve(sha256_hex(random_secret("ak-")))
    flood = (time.perf_counter() - started) / rounds
    print("api key resolution (10,000 active keys, in-process index)")
    print(f"  valid key:    {valid * 1e6:8.2f} us/lookup")
    print(f"  unknown key:  {flood * 1e6:8.2f} us/lookup")
    print(f"  database lookups during {rounds:,} unknown keys: {index.database_lookups}")


if __name__ == "__main__":
    asyncio.run(main())
