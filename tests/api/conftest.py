"""Fixtures of the webhook tests (REST API and console): apps on a PostgreSQL
database of the requesting module's own (their dispatchers must not take other tests'
delivery rows, nor leave theirs to other tests' apps), a certificate authority made
for the run, and a real HTTPS receiver."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import replace

import pytest
from litestar import Litestar
from litestar.testing import AsyncTestClient

from app.lib.settings import Settings
from tests.support.auth import fresh_database
from tests.support.settings import AppFactory
from tests.support.webhooks import Tls, WebhookReceiver, make_tls


@pytest.fixture(scope="module")
async def webhook_settings(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Settings]:
    async with fresh_database("postgres", tmp_path_factory.mktemp("hooks")) as settings:
        yield settings


@pytest.fixture(scope="module")
def webhook_tls(tmp_path_factory: pytest.TempPathFactory) -> Tls:
    return make_tls(tmp_path_factory.mktemp("tls"))


@pytest.fixture
async def webhook_receiver(webhook_tls: Tls) -> AsyncIterator[WebhookReceiver]:
    receiver = WebhookReceiver(webhook_tls)
    await receiver.start()
    yield receiver
    await receiver.stop()


@pytest.fixture
async def webhook_client(
    webhook_settings: Settings, webhook_tls: Tls, make_app: AppFactory
) -> AsyncIterator[AsyncTestClient[Litestar]]:
    """Loopback receivers allowed (the test's), its certificate authority trusted,
    retries quick."""
    settings = replace(
        webhook_settings,
        webhook_allow_private=True,
        webhook_ca_file=webhook_tls.ca_file,
        webhook_retry_base_seconds=0.05,
        webhook_max_attempts=2,
    )
    async with AsyncTestClient(app=make_app(settings)) as test_client:
        yield test_client


@pytest.fixture
async def webhook_strict(
    webhook_settings: Settings, make_app: AppFactory
) -> AsyncIterator[AsyncTestClient[Litestar]]:
    """The production default: public HTTPS receivers only."""
    async with AsyncTestClient(app=make_app(webhook_settings)) as test_client:
        yield test_client
