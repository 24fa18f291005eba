"""``evernight://<node>/<service>[/path]`` backend URLs, resolved through the local bridge.

Such a URL is never dialled. The evernight agent running next to this process opens a
tunnel to ``service`` on ``node`` and answers which local port forwards to it (JSON-RPC
``Bridge.Connect`` over its WebSocket); the backend then runs against
``http://127.0.0.1:<port>[/path]`` (``ws://`` for engine backends). The stored
configuration keeps the ``evernight://`` URL, so every start resolves it afresh.

``EvernightTunnels`` remembers which backend rides which tunnel and the port each
tunnel had last; ``refresh`` asks the bridge again and names the backends whose
tunnel moved (the remote side restarted and came back on a new local port) or became
reachable, so the caller rebuilds exactly those.
"""

from __future__ import annotations

import asyncio
import itertools
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import msgspec
import structlog
from websockets.asyncio.client import connect
from websockets.exceptions import WebSocketException

SCHEME = "evernight"
LOCAL_HOST = "127.0.0.1"
DEFAULT_TIMEOUT_SECONDS = 5.0
MAX_BRIDGE_FRAME_BYTES = 64 * 1024
# Node and service names travel to the bridge as-is: keep them to what a host or
# service name can be, so a URL cannot smuggle anything else into the request.
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
WS_KINDS = frozenset({"engine"})
"""Backend kinds that speak WebSocket: their local URL is ``ws://``."""

logger = structlog.get_logger()


class EvernightUrlError(ValueError):
    """The URL is not a well-formed ``evernight://node/service`` URL (the message says why)."""


class BridgeError(Exception):
    """The bridge agent could not be reached or refused the tunnel (the message says why)."""


@dataclass(frozen=True, slots=True)
class EvernightAddress:
    node: str
    service: str
    path: str = ""
    """Anything after the service (``/v1``, ``/ws``), appended to the local URL."""

    @property
    def tunnel(self) -> tuple[str, str]:
        return (self.node, self.service)

    def local_url(self, port: int, kind: str) -> str:
        scheme = "ws" if kind in WS_KINDS else "http"
        return f"{scheme}://{LOCAL_HOST}:{port}{self.path}"


def is_evernight(url: str) -> bool:
    return url.strip().lower().startswith(f"{SCHEME}://")


def parse_evernight(url: str) -> EvernightAddress:
    parts = urlsplit(url.strip())
    if parts.scheme.lower() != SCHEME:
        raise EvernightUrlError("url must start with evernight://")
    if parts.username is not None or parts.password is not None or parts.port is not None:
        raise EvernightUrlError("an evernight url names a node, never credentials or a port")
    if parts.query or parts.fragment:
        raise EvernightUrlError("url must not have a query or fragment")
    node = parts.netloc
    service, _, rest = parts.path.lstrip("/").partition("/")
    if not _NAME.match(node):
        raise EvernightUrlError("evernight url needs a node: evernight://<node>/<service>")
    if not _NAME.match(service):
        raise EvernightUrlError("evernight url needs a service: evernight://<node>/<service>")
    path = "/" + rest.rstrip("/") if rest.strip("/") else ""
    return EvernightAddress(node=node, service=service, path=path)


class _RpcReply(msgspec.Struct):
    id: Any = None
    result: Any = None
    error: Any = None


class BridgeClient:
    """JSON-RPC calls to the local evernight agent: one short connection per call.

    Calls are rare (registration, start-up, a keepalive round every 15 s per tunnel),
    so holding no connection keeps a restarted agent from leaving a dead one behind.
    """

    def __init__(self, url: str, *, timeout: float = DEFAULT_TIMEOUT_SECONDS) -> None:
        self.url = url
        self._timeout = timeout
        self._ids = itertools.count(1)

    async def connect(self, node: str, service: str) -> int:
        """The local port that forwards to ``service`` on ``node``; raises ``BridgeError``."""
        request_id = next(self._ids)
        request = {
            "jsonrpc": "2.0",
            "id": request_id,
            "method": "Bridge.Connect",
            "params": {"node": node, "service": service},
        }
        try:
            async with asyncio.timeout(self._timeout):
                async with connect(
                    self.url, max_size=MAX_BRIDGE_FRAME_BYTES, open_timeout=None
                ) as socket:
                    await socket.send(msgspec.json.encode(request).decode())
                    while True:
                        reply = _decode(await socket.recv())
                        if reply.id == request_id:
                            break  # anything else is the agent's own chatter
        except TimeoutError as exc:
            raise BridgeError(f"the evernight agent at {self.url} did not answer") from exc
        except (OSError, WebSocketException) as exc:
            logger.info("evernight agent unreachable", url=self.url, error=repr(exc)[:200])
            raise BridgeError(f"the evernight agent at {self.url} is unreachable") from exc
        return _local_port(reply, node, service)


def _decode(frame: str | bytes) -> _RpcReply:
    try:
        return msgspec.json.decode(frame, type=_RpcReply)
    except msgspec.DecodeError as exc:
        raise BridgeError("the evernight agent sent a malformed reply") from exc


def _local_port(reply: _RpcReply, node: str, service: str) -> int:
    if reply.error is not None:
        message = reply.error.get("message") if isinstance(reply.error, dict) else None
        detail = message if isinstance(message, str) and message else "refused"
        raise BridgeError(f"the evernight agent could not reach {service} on {node}: {detail}")
    port = reply.result.get("local_port") if isinstance(reply.result, dict) else None
    if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
        raise BridgeError("the evernight agent answered without a valid local_port")
    return port


PortLookup = Callable[[str, str], Awaitable[int]]


class EvernightTunnels:
    """Which backends ride which tunnel, and the local port each tunnel has now."""

    def __init__(self, lookup: PortLookup) -> None:
        self._lookup = lookup
        self._ports: dict[tuple[str, str], int] = {}
        self._riders: dict[str, EvernightAddress] = {}

    async def resolve(self, address: EvernightAddress, *, fresh: bool = False) -> int:
        """The tunnel's local port: the known one, or asked of the bridge (``fresh``
        always asks). Raises ``BridgeError``."""
        if not fresh and (known := self._ports.get(address.tunnel)) is not None:
            return known
        port = await self._lookup(address.node, address.service)
        self._ports[address.tunnel] = port
        return port

    def track(self, backend: str, address: EvernightAddress) -> None:
        """``backend`` is configured with ``address`` (resolved or not yet)."""
        self._riders[backend] = address

    def untrack(self, backend: str) -> None:
        address = self._riders.pop(backend, None)
        if address is not None and address.tunnel not in self._tunnels_in_use():
            self._ports.pop(address.tunnel, None)

    def port_of(self, address: EvernightAddress) -> int | None:
        return self._ports.get(address.tunnel)

    def riders(self) -> dict[str, EvernightAddress]:
        return dict(self._riders)

    async def refresh(self) -> list[str]:
        """Ask the bridge for every tunnel in use; the backends whose port changed (or
        that resolve for the first time). A tunnel the bridge cannot answer for keeps
        its last port: health probes judge whether it still works."""
        moved: set[tuple[str, str]] = set()
        for tunnel in self._tunnels_in_use():
            before = self._ports.get(tunnel)
            try:
                port = await self._lookup(*tunnel)
            except BridgeError as exc:
                logger.warning(
                    "evernight tunnel check failed",
                    node=tunnel[0],
                    service=tunnel[1],
                    error=str(exc),
                )
                continue
            self._ports[tunnel] = port
            if port != before:
                if before is not None:
                    logger.info(
                        "evernight tunnel moved",
                        node=tunnel[0],
                        service=tunnel[1],
                        old_port=before,
                        new_port=port,
                    )
                moved.add(tunnel)
        return sorted(name for name, address in self._riders.items() if address.tunnel in moved)

    def _tunnels_in_use(self) -> set[tuple[str, str]]:
        return {address.tunnel for address in self._riders.values()}
