"""The budget threshold alerts the dashboard shows: a bounded record of the newest ones.

``BudgetAlerts`` (``app.domain.quotas.alerts``) publishes each alert once, platform
wide, on the EventBus channel ``budgets.alerts``. Every replica follows that channel
(``DashboardWiring``'s task) and records what it hears in an ``AlertHistory``:

- in this replica's memory (``MemoryAlertLog``): always, the newest ``KEEP`` alerts;
- with Redis configured, also in one shared record (``RedisAlertLog``: a sorted set of
  alert ids by time and a hash of their payloads, trimmed to ``KEEP`` in the same Lua
  call). Every replica hears the event and writes it; ``ZADD NX`` on the alert id makes
  the second and later writes no-ops, so an alert is recorded once. Pages read the
  shared record, so a replica started after an alert (or restarted) still shows it,
  and every replica shows the same list.

Reading falls back to memory when Redis cannot be reached (a bus event published
during the outage is lost anyway: the bus is Redis too). On the embedded default the
memory record is all there is, and a restart forgets it: the alerts are a live view,
not an audit log (the webhooks and the logs are the durable trace).

An entry is the event's payload, checked (``AlertEntry``); a malformed event is
dropped, never shown. Entries are newest first by their ``at`` and unique by
``alertId`` (stable per window bucket, scope and threshold).
"""

from __future__ import annotations

import bisect
import datetime
from collections.abc import Mapping
from typing import Annotated, Any, Literal
from uuid import UUID

import msgspec
import structlog
from redis.asyncio import Redis
from redis.exceptions import RedisError

from app.lib.log_budget import RepeatBudget

logger = structlog.get_logger()

KEEP = 200
"""Alerts kept (per replica in memory, and in the shared record)."""

_Id = Annotated[str, msgspec.Meta(min_length=1, max_length=200)]
_Amount = Annotated[int, msgspec.Meta(ge=0)]


class AlertEntry(msgspec.Struct, frozen=True, rename="camel", kw_only=True):
    """One alert as ``BudgetAlert.event`` publishes it (unknown fields ignored)."""

    kind: Literal["budget_threshold"]
    alert_id: _Id
    project_id: UUID
    scope: Literal["project", "key"]
    credential_id: UUID | None = None
    metric: Literal["cost", "tokens", "requests"]
    window: Literal["day", "month"]
    threshold: Annotated[int, msgspec.Meta(ge=1, le=1000)]
    used: _Amount
    limit: _Amount
    currency: Annotated[str, msgspec.Meta(max_length=8)] | None = None
    resets_at: datetime.datetime
    at: datetime.datetime
    origin: Annotated[str, msgspec.Meta(max_length=300)] = ""

    @property
    def order(self) -> tuple[float, str]:
        """Sort key: newest first means the largest first."""
        return (self.at.timestamp(), self.alert_id)


def parse_alert(event: Mapping[str, Any]) -> AlertEntry | None:
    """The alert an EventBus event carries, or ``None`` when it is not a valid one."""
    try:
        entry = msgspec.convert(dict(event), AlertEntry)
    except (msgspec.ValidationError, TypeError):
        return None
    if entry.at.tzinfo is None or entry.resets_at.tzinfo is None:
        return None  # naive times cannot be placed on the page's UTC clock
    return entry


def newest_first(entries: list[AlertEntry], keep: int = KEEP) -> list[AlertEntry]:
    """Unique by alert id (the first seen wins), newest first, at most ``keep``."""
    seen: set[str] = set()
    unique = []
    for entry in entries:
        if entry.alert_id not in seen:
            seen.add(entry.alert_id)
            unique.append(entry)
    unique.sort(key=lambda e: e.order, reverse=True)
    return unique[:keep]


class MemoryAlertLog:
    """This replica's newest ``keep`` alerts, newest first, unique by alert id."""

    def __init__(self, keep: int = KEEP) -> None:
        if keep < 1:
            raise ValueError(f"keep must be at least 1, got {keep}")
        self._keep = keep
        self._entries: list[AlertEntry] = []
        """Oldest first (so ``bisect`` inserts by ``order`` as it is)."""
        self._ids: set[str] = set()

    def add(self, entry: AlertEntry) -> bool:
        """Record it; False when it is already there or older than everything kept
        while the log is full."""
        if entry.alert_id in self._ids:
            return False
        if len(self._entries) >= self._keep and entry.order <= self._entries[0].order:
            return False
        bisect.insort(self._entries, entry, key=lambda e: e.order)
        self._ids.add(entry.alert_id)
        while len(self._entries) > self._keep:
            self._ids.discard(self._entries.pop(0).alert_id)
        return True

    def recent(self) -> list[AlertEntry]:
        return self._entries[::-1]


# KEYS: the order (sorted set: alert id -> epoch ms) and the payloads (hash: alert id
# -> JSON). ARGV: alert id, score, payload, how many to keep. Returns 1 when added.
_ADD = """
if redis.call('ZADD', KEYS[1], 'NX', ARGV[2], ARGV[1]) == 0 then return 0 end
redis.call('HSET', KEYS[2], ARGV[1], ARGV[3])
local extra = redis.call('ZCARD', KEYS[1]) - tonumber(ARGV[4])
if extra > 0 then
  local old = redis.call('ZRANGE', KEYS[1], 0, extra - 1)
  redis.call('ZREMRANGEBYRANK', KEYS[1], 0, extra - 1)
  redis.call('HDEL', KEYS[2], unpack(old))
end
return 1
"""
# KEYS as above; ARGV: how many. The payloads of the newest, newest first.
_RECENT = """
local ids = redis.call('ZREVRANGE', KEYS[1], 0, tonumber(ARGV[1]) - 1)
if #ids == 0 then return {} end
return redis.call('HMGET', KEYS[2], unpack(ids))
"""

_decoder = msgspec.json.Decoder(AlertEntry)


class RedisAlertLog:
    """The record every replica shares (see the module docstring). Both keys carry
    one hash tag, so the scripts stay on one slot of a Redis Cluster."""

    def __init__(self, client: Redis, *, prefix: str, keep: int = KEEP) -> None:
        self._keys = [f"{prefix}budgets:{{alerts}}:order", f"{prefix}budgets:{{alerts}}:data"]
        self._keep = keep
        self._add = client.register_script(_ADD)
        self._recent = client.register_script(_RECENT)

    async def add(self, entry: AlertEntry) -> bool:
        score = int(entry.at.timestamp() * 1000)
        payload = msgspec.json.encode(entry)
        added = await self._add(keys=self._keys, args=[entry.alert_id, score, payload, self._keep])
        return bool(added)

    async def recent(self) -> list[AlertEntry]:
        raw: list[bytes | None] = await self._recent(keys=self._keys, args=[self._keep])
        entries = []
        for payload in raw:
            if payload is None:
                continue  # trimmed between the two reads of the script: cannot happen
            try:
                entries.append(_decoder.decode(payload))
            except msgspec.DecodeError:
                continue  # written by a newer version with another shape
        return newest_first(entries, self._keep)


class AlertHistory:
    """What the pages read: the shared record when there is one (with what this replica
    heard), else (or while Redis cannot be reached) this replica's memory."""

    def __init__(
        self, redis: Redis | None = None, *, prefix: str = "arona:", keep: int = KEEP
    ) -> None:
        self._keep = keep
        self.memory = MemoryAlertLog(keep)
        self.shared = None if redis is None else RedisAlertLog(redis, prefix=prefix, keep=keep)
        self._warnings = RepeatBudget(interval=60.0)

    async def add(self, entry: AlertEntry) -> None:
        self.memory.add(entry)
        if self.shared is None:
            return
        try:
            await self.shared.add(entry)
        except (RedisError, OSError) as exc:
            # Another replica that heard it may still write it; else it is in memory here.
            self._warn("could not record a budget alert in Redis", exc)

    async def recent(self, project_id: UUID | None = None) -> list[AlertEntry]:
        """The newest alerts (of one project when given), newest first."""
        entries = self.memory.recent()
        if self.shared is not None:
            try:
                # What this replica heard joins in: an alert whose write to Redis failed
                # (a blip) still shows here. Both hold the newest, so the merge does too.
                entries = newest_first([*await self.shared.recent(), *entries], self._keep)
            except (RedisError, OSError) as exc:
                self._warn("could not read the budget alerts from Redis", exc)
        if project_id is None:
            return entries
        return [entry for entry in entries if entry.project_id == project_id]

    def _warn(self, message: str, exc: Exception) -> None:
        held = self._warnings.admit(message)
        if held is not None:
            logger.warning(message, error=repr(exc), not_logged=held)
