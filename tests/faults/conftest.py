"""Fixtures shared by the fault tests."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.support.redis_instance import RedisInstance


@pytest.fixture
async def redis_server(tmp_path: Path) -> AsyncIterator[RedisInstance]:
    """A running Redis of the test's own, killed at the end."""
    server = RedisInstance(tmp_path)
    server.start()
    try:
        yield server
    finally:
        server.kill()
