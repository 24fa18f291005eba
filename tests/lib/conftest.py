"""Fixtures running the ``StateStore`` / ``EventBus`` contract against each implementation.

The ``redis`` parameter talks to a real server (``ARONA_TEST_REDIS_URL``); a missing
server fails those tests rather than skipping them. Each test gets its own random
key/channel prefix and its keys are deleted afterwards, so tests never see each
other's state and can share a database with other suites.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from app.lib.events.base import EventBus
from app.lib.state.base import StateStore
from tests.support.state_harness import BACKENDS, Clocked, Harness


@pytest.fixture(params=BACKENDS)
async def harness(request: pytest.FixtureRequest) -> AsyncIterator[Harness]:
    h = Harness(request.param)
    yield h
    await h.cleanup()


@pytest.fixture
def store(harness: Harness) -> StateStore:
    return harness.state()


@pytest.fixture
def bus(harness: Harness) -> EventBus:
    return harness.bus()


@pytest.fixture
def clocked(harness: Harness) -> Clocked:
    return Clocked(harness)
