"""The webhook dispatcher against a real database and a real HTTPS receiver.

Everything is real: PostgreSQL (a database of this module's own, so no other test's
app takes its rows), TLS with a certificate authority generated for the run, the
SSRF-guarded aiohttp pool. Backoff settings are small (0.1 s base) so retries happen
within the test.
"""

from __future__ import annotations

import asyncio
import datetime
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import delete, func, insert, select, update
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from app.db.config import install_sqlite_pragmas
from app.db.models import ProjectWebhook, WebhookDelivery
from app.domain.webhooks import signing
from app.domain.webhooks.sender import AttemptResult
from app.domain.webhooks.setup import Webhooks, build_webhooks
from app.domain.webhooks.store import envelope
from app.lib.clock import utcnow
from app.lib.settings import Settings
from app.lib.vault import Vault
from tests.support.auth import fresh_database
from tests.support.dns import TableResolver
from tests.support.settings import base_settings, with_settings
from tests.support.webhooks import (
    Tls,
    WebhookReceiver,
    add_hook,
    budget_alert,
    make_tls,
    new_project,
    rows_of,
    running,
    settled,
    statements,
    verify_signature,
)

BASE = 0.1
SETTINGS = base_settings(
    webhook_allow_private=True, webhook_retry_base_seconds=BASE, webhook_max_attempts=3
)
VAULT = Vault(SETTINGS.vault_keys)


@pytest.fixture(scope="module")
async def hooks_db(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[str]:
    async with fresh_database("postgres", tmp_path_factory.mktemp("hooks")) as settings:
        yield settings.database_url


@pytest.fixture
async def engine(hooks_db: str) -> AsyncIterator[AsyncEngine]:
    engine = create_async_engine(hooks_db)
    async with engine.begin() as conn:  # every test starts with an empty queue
        await conn.execute(delete(WebhookDelivery))
    yield engine
    await engine.dispose()


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> Tls:
    return make_tls(tmp_path_factory.mktemp("tls"))


@pytest.fixture
async def receiver(tls: Tls) -> AsyncIterator[WebhookReceiver]:
    receiver = WebhookReceiver(tls)
    await receiver.start()
    yield receiver
    await receiver.stop()


# ------------------------------------------------------------------ helpers


def webhooks_for(
    engine: AsyncEngine,
    tls: Tls,
    origin: str = "replica-a",
    settings: Settings = SETTINGS,
    **options: Any,
) -> Webhooks:
    return build_webhooks(
        settings, engine, VAULT, origin=origin, ssl_context=tls.client_context(), **options
    )


# ------------------------------------------------------------------ delivery


async def test_an_alert_is_queued_in_memory_then_delivered_signed(
    engine: AsyncEngine, tls: Tls, receiver: WebhookReceiver
) -> None:
    project_id = await new_project(engine)
    hook_id, secret = await add_hook(engine, VAULT, project_id, receiver.url())
    await add_hook(engine, VAULT, project_id, receiver.url(path="/off"), enabled=False)
    await add_hook(engine, VAULT, project_id, receiver.url(path="/none"), events=())
    alert = budget_alert(project_id)
    hooks = webhooks_for(engine, tls)

    # On the caller's path: no statement, nothing written, until the worker runs.
    with statements(engine) as seen:
        await hooks.dispatcher.alert(alert)
    assert seen == []
    assert hooks.dispatcher.queued == 1
    assert await rows_of(engine) == []

    async with running(hooks):
        [got] = await receiver.wait_for(1)
        [row] = await settled(engine, 1)
    assert receiver.received == [got]  # the disabled and unsubscribed ones got nothing
    assert (row.status, row.attempts, row.last_status_code) == ("delivered", 1, 200)
    assert row.delivered_at is not None
    assert row.next_attempt_at is None
    assert row.last_response == "receiver says 200"
    assert row.webhook_id == hook_id
    assert row.alert_id == alert.alert_id

    body = got.json()
    assert body == {
        "type": "budget.threshold",
        "id": str(row.id),
        "createdAt": body["createdAt"],
        "data": alert.event("replica-a"),
    }
    assert got.headers["x-arona-event"] == "budget.threshold"
    assert got.headers["x-arona-delivery"] == str(row.id)
    assert got.headers["content-type"] == "application/json"
    header = got.headers["x-arona-signature"]
    # The documented receiver recipe accepts it; any change to body, secret or time fails.
    assert verify_signature(secret, header, got.body)
    assert signing.verify(secret, header, got.body)
    assert not verify_signature(secret, header, got.body + b" ")
    assert not verify_signature(signing.new_secret(), header, got.body)
    timestamp = int(header.split(",")[0].removeprefix("t="))
    stale = f"t={timestamp - 600},v1={signing.signature(secret, timestamp - 600, got.body)}"
    assert not verify_signature(secret, stale, got.body)  # a replay ten minutes later


async def test_a_failing_receiver_is_retried_with_backoff_until_it_answers(
    engine: AsyncEngine, tls: Tls, receiver: WebhookReceiver
) -> None:
    project_id = await new_project(engine)
    _, secret = await add_hook(engine, VAULT, project_id, receiver.url())
    receiver.answer(500, 500)
    hooks = webhooks_for(engine, tls)
    await hooks.dispatcher.alert(budget_alert(project_id))
    async with running(hooks):
        [row] = await settled(engine, 1)
    assert (row.status, row.attempts, row.last_status_code) == ("delivered", 3, 200)
    assert [a["statusCode"] for a in row.attempt_log] == [500, 500, 200]
    assert [a["error"] for a in row.attempt_log] == ["answered 500", "answered 500", None]
    first, second, third = receiver.received
    # Exponential waits (x4), each within the +/-20 % jitter.
    assert second.at - first.at >= BASE * 0.8
    assert third.at - second.at >= BASE * 4 * 0.8
    # The same delivery, re-signed for each attempt.
    assert len({r.headers["x-arona-delivery"] for r in receiver.received}) == 1
    assert [r.headers["x-arona-attempt"] for r in receiver.received] == ["1", "2", "3"]
    assert {r.body for r in receiver.received} == {first.body}
    assert all(
        verify_signature(secret, r.headers["x-arona-signature"], r.body) for r in receiver.received
    )


async def test_a_delivery_fails_after_the_last_attempt_and_can_be_retried_by_hand(
    engine: AsyncEngine, tls: Tls, receiver: WebhookReceiver
) -> None:
    project_id = await new_project(engine)
    await add_hook(engine, VAULT, project_id, receiver.url())
    receiver.default = 503
    hooks = webhooks_for(engine, tls)
    await hooks.dispatcher.alert(budget_alert(project_id))
    async with running(hooks):
        [row] = await settled(engine, 1)
        assert (row.status, row.attempts, row.next_attempt_at) == ("failed", 3, None)
        assert row.last_status_code == 503
        assert row.last_error == "answered 503"
        await asyncio.sleep(BASE * 20)
        assert len(receiver.received) == 3  # nothing after the last attempt

        receiver.default = 204
        assert await hooks.dispatcher.retry(row.id)
        [again] = await rows_of(engine)
        assert (again.status, again.attempts, again.last_status_code) == ("delivered", 4, 204)
        assert not await hooks.dispatcher.retry(row.id)  # only a failed one


async def test_a_name_that_resolves_to_loopback_is_refused_at_connection(
    engine: AsyncEngine, tls: Tls, receiver: WebhookReceiver
) -> None:
    # Default policy (public addresses only): DNS now says the receiver's name is
    # 127.0.0.1, as a rebinding attacker would after the write-time check.
    strict = with_settings(SETTINGS, webhook_allow_private=False)
    dns = TableResolver({"rebind.test": ["127.0.0.1"]})
    project_id = await new_project(engine)
    await add_hook(engine, VAULT, project_id, receiver.url(host="rebind.test"))
    hooks = webhooks_for(engine, tls, settings=strict, resolver_factory=lambda: dns)
    await hooks.dispatcher.alert(budget_alert(project_id))
    async with running(hooks):
        [row] = await settled(engine, 1)
    assert receiver.received == []
    assert dns.lookups == ["rebind.test"]
    # Refused by policy: failed at once, not retried.
    assert (row.status, row.attempts, row.last_status_code) == ("failed", 1, None)
    assert "rebind.test resolves to 127.0.0.1 is a loopback address" in row.last_error


async def test_a_redirect_is_never_followed(
    engine: AsyncEngine, tls: Tls, receiver: WebhookReceiver
) -> None:
    project_id = await new_project(engine)
    await add_hook(engine, VAULT, project_id, receiver.url())
    receiver.default = 302
    hooks = webhooks_for(engine, tls)
    await hooks.dispatcher.alert(budget_alert(project_id))
    async with running(hooks):
        [row] = await settled(engine, 1)
    assert receiver.landed == 0
    assert len(receiver.received) == 3
    assert (row.status, row.last_status_code) == ("failed", 302)
    assert "redirects are not followed" in row.last_error
    assert "/landing" in row.last_error


# ------------------------------------------------------------------ restarts, replicas


async def test_pending_rows_of_a_previous_process_are_delivered_after_a_restart(
    engine: AsyncEngine, tls: Tls, receiver: WebhookReceiver
) -> None:
    project_id = await new_project(engine)
    hook_id, _ = await add_hook(engine, VAULT, project_id, receiver.url())
    # A process that stopped with an alert queued writes it (and attempts nothing)...
    before = webhooks_for(engine, tls, origin="old-process")
    await before.dispatcher.alert(budget_alert(project_id))
    await before.dispatcher.stop()
    await before.dispatcher.aclose()
    # ...and one that died mid-attempt left a row leased to it, its lease now over.
    now = utcnow()
    leased_id = uuid.uuid4()
    async with engine.begin() as conn:
        await conn.execute(
            insert(WebhookDelivery).values(
                id=leased_id,
                webhook_id=hook_id,
                event="budget.threshold",
                alert_id="died-mid-attempt",
                payload=envelope(leased_id, "budget.threshold", {"kind": "x"}, now),
                status="pending",
                attempts=1,
                attempt_log=[],
                lease_owner="dead-process",
                next_attempt_at=now - datetime.timedelta(seconds=1),
                created_at=now,
                updated_at=now,
            )
        )
    assert [r.status for r in await rows_of(engine)] == ["pending", "pending"]
    assert receiver.received == []

    after = webhooks_for(engine, tls, origin="new-process")
    async with running(after):
        rows = await settled(engine, 2)
    assert {r.status for r in rows} == {"delivered"}
    assert {r.headers["x-arona-delivery"] for r in receiver.received} == {str(r.id) for r in rows}
    leased = next(r for r in rows if r.id == leased_id)
    assert leased.attempts == 2
    assert leased.lease_owner is None


async def test_two_replicas_on_one_database_deliver_each_row_once(
    engine: AsyncEngine, tls: Tls, receiver: WebhookReceiver
) -> None:
    project_id = await new_project(engine)
    hook_ids = [(await add_hook(engine, VAULT, project_id, receiver.url()))[0] for _ in range(3)]
    a = webhooks_for(engine, tls, origin="replica-a")
    b = webhooks_for(engine, tls, origin="replica-b")
    # Written by nobody's worker yet: both replicas find them due at once.
    for n in range(10):
        await a.dispatcher.alert(budget_alert(project_id, threshold=80 + n))
    await a.dispatcher.stop()
    await a.dispatcher.aclose()
    assert len(await rows_of(engine)) == 30
    a = webhooks_for(engine, tls, origin="replica-a")
    async with running(a, b):
        rows = await settled(engine, 30)
    assert {r.status for r in rows} == {"delivered"}
    assert {r.attempts for r in rows} == {1}
    ids = [r.headers["x-arona-delivery"] for r in receiver.received]
    assert len(ids) == 30
    assert set(ids) == {str(r.id) for r in rows}
    assert {r.webhook_id for r in rows} == set(hook_ids)


async def test_an_idle_dispatcher_does_not_poll(
    engine: AsyncEngine, tls: Tls, receiver: WebhookReceiver
) -> None:
    project_id = await new_project(engine)
    await add_hook(engine, VAULT, project_id, receiver.url())
    hooks = webhooks_for(engine, tls)
    async with running(hooks):
        await asyncio.sleep(0.2)  # its first look: nothing pending
        with statements(engine) as seen:
            await asyncio.sleep(1.0)
        assert seen == []
        # An alert wakes it at once.
        await hooks.dispatcher.alert(budget_alert(project_id))
        await receiver.wait_for(1, within=5.0)


async def test_the_dispatcher_works_on_sqlite(
    tmp_path: Path, tls: Tls, receiver: WebhookReceiver
) -> None:
    async with fresh_database("sqlite", tmp_path) as settings:
        engine = create_async_engine(settings.database_url)
        install_sqlite_pragmas(engine)
        try:
            project_id = await new_project(engine)
            _, secret = await add_hook(engine, VAULT, project_id, receiver.url())
            receiver.answer(500)
            hooks = webhooks_for(engine, tls)
            await hooks.dispatcher.alert(budget_alert(project_id))
            async with running(hooks):
                [row] = await settled(engine, 1)
            assert (row.status, row.attempts) == ("delivered", 2)
            last = receiver.received[-1]
            assert verify_signature(secret, last.headers["x-arona-signature"], last.body)
            # A webhook deleted takes its log with it (foreign keys on).
            async with engine.begin() as conn:
                await conn.execute(delete(ProjectWebhook))
                left = await conn.scalar(select(func.count()).select_from(WebhookDelivery))
            assert left == 0
        finally:
            await engine.dispose()


async def test_a_lost_lease_does_not_overwrite_the_new_holder(
    engine: AsyncEngine, tls: Tls, receiver: WebhookReceiver
) -> None:
    project_id = await new_project(engine)
    await add_hook(engine, VAULT, project_id, receiver.url())
    hooks = webhooks_for(engine, tls)
    await hooks.dispatcher.alert(budget_alert(project_id))
    await hooks.dispatcher.stop()  # writes the row, attempts nothing
    store = hooks.dispatcher._store
    now = utcnow()
    [claimed] = await store.claim_due(now, now + datetime.timedelta(seconds=30), 10)
    assert await store.claim_due(now, now + datetime.timedelta(seconds=30), 10) == []
    # Another replica takes the row over (its lease ended meanwhile).
    async with engine.begin() as conn:
        await conn.execute(
            update(WebhookDelivery).values(
                lease_owner="other", attempts=WebhookDelivery.attempts + 1
            )
        )
    outcome = hooks.dispatcher._outcome(claimed, AttemptResult(200, None, None, 5), now)
    assert not await store.record(claimed, outcome, now)
    [row] = await rows_of(engine)
    assert (row.status, row.lease_owner) == ("pending", "other")
    await hooks.dispatcher.aclose()
