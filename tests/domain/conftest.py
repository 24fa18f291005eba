"""Fixtures the domain tests share."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from redis.asyncio import Redis

from app.lib.redis_client import build_redis
from tests.support.settings import REDIS_URL


@pytest.fixture
async def redis() -> AsyncIterator[Redis]:
    """A client of the production configuration on the tests' Redis database."""
    client = build_redis(REDIS_URL)
    yield client
    await client.aclose()
