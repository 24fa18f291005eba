"""Cluster ``EventBus`` on Redis pub/sub.

Events are hints (see ``base``), so the failure policy leans towards availability:

* ``publish`` logs a warning (at most one a minute) and returns when Redis is
  unreachable; the request that triggered the event must not fail because a cache
  elsewhere stays warm a little longer. Non-serializable events still raise: that
  is a bug, not an outage.
* A subscription owns a dedicated pub/sub connection. redis-py reconnects and
  resubscribes it after brief outages (events published meanwhile are lost); if
  reconnecting keeps failing, iteration raises ``redis.exceptions.ConnectionError``
  and the caller should resubscribe and refresh from the source of truth.
* Payloads that are not a JSON object (another producer, a stray ``PUBLISH``) are
  logged and skipped rather than ending the subscriber.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, Self

import msgspec
import structlog
from redis.asyncio import Redis
from redis.asyncio.client import PubSub
from redis.exceptions import RedisError

from app.lib.events.base import Event

logger = structlog.get_logger()

_decoder = msgspec.json.Decoder(dict[str, Any])

_Message = dict[str, Any]

_SUBSCRIBE_TIMEOUT = 10.0
_FAILURE_LOG_INTERVAL = 60.0
_READ_SECONDS = 1.0


class _Subscription:
    """Async iterator over one pub/sub connection, yielding decoded events."""

    def __init__(self, pubsub: PubSub, prefix: str, pending: deque[_Message]) -> None:
        self._pubsub = pubsub
        self._prefix = prefix
        self._pending = pending
        self._done = False

    def end(self) -> None:
        self._done = True

    def __aiter__(self) -> _Subscription:
        return self

    async def __anext__(self) -> Event:
        while not self._done:
            try:
                message = self._pending.popleft() if self._pending else await _next(self._pubsub)
            except RedisError:
                if self._done:
                    # The subscription closed under a reader in another task.
                    break
                raise
            if message.get("type") != "message":
                continue
            event = self._decode(message)
            if event is not None:
                return event
        raise StopAsyncIteration

    def _decode(self, message: _Message) -> Event | None:
        channel = _text(message["channel"]).removeprefix(self._prefix)
        try:
            event = _decoder.decode(message["data"])
        except msgspec.DecodeError as exc:
            logger.warning("event_malformed", channel=channel, error=str(exc))
            return None
        event["channel"] = channel
        return event


async def _next(pubsub: PubSub) -> _Message:
    """The next message, waiting as long as it takes, in bounded reads.

    An unbounded blocking read was seen (once, at a shutdown in the test suite) to
    stay blocked after its task was cancelled: the cancellation was absorbed on the
    way in and the read went on, so the shutdown waited forever. Each bounded read
    gives the loop a point to notice a cancellation requested and not yet honoured.
    """
    task = asyncio.current_task()
    while True:
        message: _Message | None = await pubsub.get_message(timeout=_READ_SECONDS)
        if message is not None:
            return message
        if task is not None and task.cancelling():
            raise asyncio.CancelledError


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


class RedisEventBus:
    """Pub/sub across replicas; channel ``c`` is published as ``prefix + c``.

    The bus closes the client in :meth:`close` only when it created it
    (:meth:`from_url`).
    """

    def __init__(
        self, client: Redis, prefix: str = "arona:events:", *, owns_client: bool = False
    ) -> None:
        self._client = client
        self._prefix = prefix
        self._owns_client = owns_client
        self._unlogged_failures = 0
        self._next_failure_log = 0.0

    @classmethod
    def from_url(cls, url: str, prefix: str = "arona:events:", **client_kwargs: Any) -> Self:
        """Build a bus owning a new client; ``client_kwargs`` go to ``Redis.from_url``."""
        return cls(Redis.from_url(url, **client_kwargs), prefix, owns_client=True)

    async def publish(self, channel: str, event: Event) -> None:
        payload = msgspec.json.encode(event)
        try:
            await self._client.publish(self._prefix + channel, payload)
        except (RedisError, OSError) as exc:
            # During an outage every publish fails: one line per minute, with the count.
            self._unlogged_failures += 1
            now = time.monotonic()
            if now >= self._next_failure_log:
                logger.warning(
                    "event_publish_failed",
                    channel=channel,
                    error=str(exc),
                    failures=self._unlogged_failures,
                )
                self._unlogged_failures = 0
                self._next_failure_log = now + _FAILURE_LOG_INTERVAL

    @asynccontextmanager
    async def subscribe(self, *channels: str) -> AsyncIterator[AsyncIterator[Event]]:
        if not channels:
            raise ValueError("subscribe needs at least one channel")
        names = {self._prefix + c for c in channels}
        # Leaving ``pubsub`` drops its connection, which unsubscribes server-side; an
        # UNSUBSCRIBE would need its reply read, and a cancelled reader may have left
        # the connection mid-frame.
        async with self._client.pubsub() as pubsub:
            await pubsub.subscribe(*names)
            async with asyncio.timeout(_SUBSCRIBE_TIMEOUT):
                pending = await _confirmed(pubsub, len(names))
            sub = _Subscription(pubsub, self._prefix, pending)
            try:
                yield sub
            finally:
                sub.end()

    async def close(self) -> None:
        if self._owns_client:
            await self._client.aclose()


async def _confirmed(pubsub: PubSub, count: int) -> deque[_Message]:
    """Wait until the server has confirmed every channel, so that anything published
    after ``subscribe`` returns is delivered; keeps messages that arrive meanwhile."""
    early: deque[_Message] = deque()
    while count:
        message = await _next(pubsub)
        if message.get("type") == "subscribe":
            count -= 1
        else:
            early.append(message)
    return early
