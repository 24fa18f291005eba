"""The dashboard's record of recent budget alerts: bounded, newest first, one entry per
alert id, in memory and in the record the replicas share on Redis; read from memory
when Redis is gone; fed by the ``budgets.alerts`` events ``BudgetAlert`` publishes."""

from __future__ import annotations

import asyncio
import datetime
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
from redis.asyncio import Redis

from app.domain.dashboard.budget_alerts import (
    AlertEntry,
    AlertHistory,
    MemoryAlertLog,
    RedisAlertLog,
    parse_alert,
)
from app.domain.dashboard.budget_views import NameBook, relative
from app.domain.dashboard.wiring import DashboardWiring
from app.domain.quotas.alerts import CHANNEL, BudgetAlert
from app.lib.events.memory import MemoryEventBus
from app.lib.redis_client import build_redis
from tests.support.helpers import until
from tests.support.state_harness import REDIS_URL

T0 = datetime.datetime(2026, 3, 10, 12, 0, tzinfo=datetime.UTC)
PROJECT = uuid.UUID("11111111-1111-4111-8111-111111111111")


def event(
    n: int,
    *,
    minutes: int | None = None,
    threshold: int = 80,
    project: uuid.UUID = PROJECT,
    **fields: Any,
) -> dict[str, Any]:
    """The payload ``BudgetAlerts`` publishes for alert ``n``, raised ``minutes`` (by
    default ``n``) minutes after T0."""
    alert = BudgetAlert(
        alert_id=f"{{{project}}}:c:d:20260310|alert:{threshold}:{n}",
        project_id=project,
        credential_id=fields.pop("credential_id", None),
        metric=fields.pop("metric", "cost"),
        window=fields.pop("window", "day"),
        threshold=threshold,
        used=fields.pop("used", 8_000_000),
        limit=fields.pop("limit", 10_000_000),
        currency=fields.pop("currency", "USD"),
        resets_at=T0 + datetime.timedelta(hours=12),
        at=T0 + datetime.timedelta(minutes=n if minutes is None else minutes),
    )
    return {**alert.event("replica-a"), **fields}


def entry(n: int, **kwargs: Any) -> AlertEntry:
    parsed = parse_alert(event(n, **kwargs))
    assert parsed is not None
    return parsed


def ids(entries: list[AlertEntry]) -> list[str]:
    return [e.alert_id.rsplit(":", 1)[1] for e in entries]


# ------------------------------------------------------------------- the payload


def test_the_published_payload_parses_back() -> None:
    key = uuid.uuid4()
    parsed = parse_alert({**event(1, credential_id=key, metric="tokens"), "channel": CHANNEL})
    assert parsed is not None
    assert parsed.project_id == PROJECT
    assert parsed.scope == "key"
    assert parsed.credential_id == key
    assert parsed.metric == "tokens"
    assert parsed.at == T0 + datetime.timedelta(minutes=1)
    assert parsed.at.tzinfo is not None


@pytest.mark.parametrize(
    "change",
    [
        {"kind": "something_else"},
        {"threshold": "80"},
        {"used": -1},
        {"projectId": "not-a-uuid"},
        {"metric": "watts"},
        {"window": "minute"},
        {"alertId": "x" * 500},
        {"at": "2026-03-10T12:00:00"},  # no zone: cannot be placed on the UTC clock
        {"currency": "a very long currency"},
    ],
)
def test_a_malformed_event_is_dropped(change: dict[str, Any]) -> None:
    assert parse_alert({**event(1), **change}) is None


def test_a_missing_field_is_dropped() -> None:
    payload = event(1)
    del payload["limit"]
    assert parse_alert(payload) is None


# ------------------------------------------------------------------- in memory


def test_memory_keeps_the_newest_first_and_each_alert_once() -> None:
    log = MemoryAlertLog(keep=3)
    for n in (2, 5, 1, 4, 3):  # heard out of order: shown by when they were raised
        assert log.add(entry(n)) is True
    assert ids(log.recent()) == ["5", "4", "3"]
    assert log.add(entry(4)) is False  # the same alert heard again
    assert log.add(entry(4, used=9_999_999)) is False  # same id: the first one stands
    assert ids(log.recent()) == ["5", "4", "3"]
    assert log.add(entry(0)) is False  # older than everything kept: not news
    assert log.add(entry(6)) is True
    assert ids(log.recent()) == ["6", "5", "4"]


def test_memory_keeps_at_most_its_bound() -> None:
    log = MemoryAlertLog(keep=200)
    for n in range(500):
        log.add(entry(n))
    recent = log.recent()
    assert len(recent) == 200
    assert ids(recent)[0] == "499"
    assert ids(recent)[-1] == "300"
    with pytest.raises(ValueError, match="keep must be at least 1"):
        MemoryAlertLog(keep=0)


# ------------------------------------------------------------------- on Redis


@pytest.fixture
async def clients() -> AsyncIterator[tuple[Redis, Redis, str]]:
    """Two clients (two replicas) and a prefix of the test's own."""
    first, second = build_redis(REDIS_URL), build_redis(REDIS_URL)
    prefix = f"test:{uuid.uuid4().hex}:"
    yield first, second, prefix
    keys = [k async for k in first.scan_iter(match=prefix + "*")]
    if keys:
        await first.delete(*keys)
    await first.aclose()
    await second.aclose()


async def test_redis_records_each_alert_once_for_every_replica(
    clients: tuple[Redis, Redis, str],
) -> None:
    first, second, prefix = clients
    a, b = RedisAlertLog(first, prefix=prefix, keep=3), RedisAlertLog(second, prefix=prefix, keep=3)
    # Every replica hears every alert and writes it: the second write is a no-op.
    for n in (2, 1, 3):
        results = await asyncio.gather(a.add(entry(n)), b.add(entry(n)))
        assert sorted(results) == [False, True]
    assert ids(await a.recent()) == ["3", "2", "1"]
    assert ids(await b.recent()) == ["3", "2", "1"]
    for n in (5, 4):
        await b.add(entry(n))
    assert ids(await a.recent()) == ["5", "4", "3"]
    # Trimmed together: no payload outlives its place in the order.
    assert await first.zcard(f"{prefix}budgets:{{alerts}}:order") == 3
    assert await first.hlen(f"{prefix}budgets:{{alerts}}:data") == 3
    # A new replica (or one restarted) reads what the others recorded.
    client = build_redis(REDIS_URL)
    fresh = AlertHistory(client, prefix=prefix, keep=3)
    try:
        assert ids(await fresh.recent()) == ["5", "4", "3"]
        assert ids(fresh.memory.recent()) == []  # it heard nothing itself
        # Heard here while the write to Redis failed: shown with the shared ones.
        fresh.memory.add(entry(9))
        assert ids(await fresh.recent()) == ["9", "5", "4"]
    finally:
        await client.aclose()


async def test_the_history_filters_by_project_and_falls_back_to_memory() -> None:
    other = uuid.uuid4()
    # Nothing listens on port 1: every command fails at once, as in an outage.
    down = build_redis("redis://127.0.0.1:1/0")
    history = AlertHistory(down, prefix="test:down:")
    try:
        await history.add(entry(1))  # never raises: kept in memory
        await history.add(entry(2, project=other))
        assert ids(await history.recent()) == ["2", "1"]
        assert ids(await history.recent(PROJECT)) == ["1"]
        assert ids(await history.recent(other)) == ["2"]
    finally:
        await down.aclose()


# ------------------------------------------------------------- the follower


async def test_the_component_records_what_is_published() -> None:
    bus = MemoryEventBus()
    wiring = DashboardWiring(bus=bus, redis=None, redis_prefix="arona:")
    await wiring.start()
    assert [task.name for task in wiring.tasks()] == ["budget-alert-log"]
    running = asyncio.create_task(wiring.follow())
    try:
        await wiring.ready()
        assert wiring.following.is_set()
        await bus.publish(CHANNEL, event(1))
        await bus.publish(CHANNEL, {"kind": "budget_threshold", "junk": True})
        await bus.publish(CHANNEL, event(1))  # once, even if published twice
        await bus.publish(CHANNEL, event(2, threshold=100))
        await until(lambda: len(wiring.alerts.memory.recent()) == 2)
        assert [e.threshold for e in await wiring.alerts.recent()] == [100, 80]
        assert wiring.provides() == {"budget_alert_log": wiring.alerts}
    finally:
        running.cancel()
        await asyncio.gather(running, return_exceptions=True)
        await bus.close()


# ------------------------------------------------------------- how rows read


def test_relative_times() -> None:
    now = T0
    assert relative(now - datetime.timedelta(seconds=5), now) == "just now"
    assert relative(now - datetime.timedelta(minutes=3, seconds=59), now) == "3 min ago"
    assert relative(now - datetime.timedelta(hours=2, minutes=5), now) == "2 h ago"
    assert relative(now - datetime.timedelta(days=1, hours=1), now) == "1 day ago"
    assert relative(now + datetime.timedelta(days=3), now) == "in 3 days"
    assert relative(now + datetime.timedelta(seconds=30), now) == "in under a minute"


def test_amounts_read_as_money_or_counts() -> None:
    names = NameBook(db_config=None)  # type: ignore[arg-type]  # nothing is read
    names.projects[PROJECT] = "Acme"
    key = uuid.uuid4()
    spend = names.view(entry(1, used=8_500_000, limit=10_000_000), T0)
    assert (spend.what, spend.used, spend.limit, spend.percent) == (
        "spend per day",
        "8.5 USD",
        "10 USD",
        85,
    )
    assert (spend.tone, spend.reached, spend.key_label) == ("warn", False, "")
    tokens = names.view(
        entry(
            2,
            threshold=100,
            metric="tokens",
            window="month",
            used=1_234_567,
            limit=1_000_000,
            currency=None,
            credential_id=key,
        ),
        T0,
    )
    assert (tokens.what, tokens.used, tokens.limit, tokens.percent) == (
        "tokens per month",
        "1,234,567",
        "1,000,000",
        123,
    )
    assert (tokens.tone, tokens.reached) == ("bad", True)
    assert tokens.key_label == f"key {key}"  # a key deleted since: its id
    assert tokens.project_name == "Acme"
