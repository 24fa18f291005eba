"""The Redis client every replica uses for its ``StateStore`` and ``EventBus``.

- RESP2, not redis-py 8's RESP3 default: nothing here needs push messages, and under
  bursts of hundreds of concurrent commands the RESP3 path (with its maintenance
  notification handling) left reads hanging until the socket timeout in our suite.
- A blocking pool of bounded size: a burst waits briefly for a connection instead of
  opening one socket per concurrent command.
"""

from __future__ import annotations

from redis.asyncio import BlockingConnectionPool, Redis

MAX_CONNECTIONS = 64
POOL_WAIT_SECONDS = 5.0
CONNECT_TIMEOUT_SECONDS = 2.0
SOCKET_TIMEOUT_SECONDS = 5.0


def build_redis(
    url: str,
    *,
    max_connections: int = MAX_CONNECTIONS,
    socket_timeout: float = SOCKET_TIMEOUT_SECONDS,
) -> Redis:
    pool = BlockingConnectionPool.from_url(
        url,
        max_connections=max_connections,
        timeout=POOL_WAIT_SECONDS,
        socket_connect_timeout=CONNECT_TIMEOUT_SECONDS,
        socket_timeout=socket_timeout,
        protocol=2,
    )
    return Redis(connection_pool=pool)
