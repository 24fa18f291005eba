"""The ``/v1`` gateway driven end to end: a live Arona (uvicorn on a loopback port),
real fake upstreams on their own ports, and the official ``openai`` SDK as client.

The app runs in the test's own event loop, so tests may reach into its resources
(flush the usage writer, run a health round) instead of sleeping.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import pytest

from app.lib.settings import Settings
from tests.support.auth import fresh_database
from tests.support.gateway import (
    ADMIN_TOKEN,
    BREAKER_OPEN_SECONDS,
    HEALTH_ROUNDS_NEVER,
    GatewayEnv,
    open_env,
)
from tests.support.settings import AppFactory, with_settings


@pytest.fixture(scope="module")
async def gateway_settings(
    tmp_path_factory: pytest.TempPathFactory,
) -> AsyncIterator[Settings]:
    """A database of the module's own: registered backends never leak into other tests."""
    async with fresh_database("postgres", tmp_path_factory.mktemp("gateway")) as settings:
        yield with_settings(
            settings,
            admin_token=ADMIN_TOKEN,
            breaker_open_seconds=BREAKER_OPEN_SECONDS,
            # Tests probe when they mean to (registration, ``probe_all``): a periodic
            # round landing while a test makes a fake fail would count a failure
            # the test did not make, or mark the backend down mid-test.
            health_interval_seconds=HEALTH_ROUNDS_NEVER,
        )


@pytest.fixture
async def env(gateway_settings: Settings, make_app: AppFactory) -> AsyncIterator[GatewayEnv]:
    async with contextlib.AsyncExitStack() as stack:
        yield await open_env(gateway_settings, make_app, stack)
