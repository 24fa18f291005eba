"""The JSON-RPC routes, built once per app around one ``LiveHub`` (for ``create_app``)."""

from __future__ import annotations

from litestar import asgi
from litestar.handlers import ASGIRouteHandler, WebsocketRouteHandler

from app.domain.calls.callers import CallerResolver
from app.domain.rpc.http import rpc_http_handler
from app.domain.rpc.live import LiveHub
from app.domain.rpc.sidecar import rpc_events_handler
from app.domain.rpc.socket import rpc_socket_handler
from app.domain.video.events import CHANNEL, notification_of
from app.domain.video.facade import VideoJobs
from app.lib.events.base import EventBus


def rpc_routes(
    callers: CallerResolver, jobs: VideoJobs, bus: EventBus, *, max_body_bytes: int
) -> list[ASGIRouteHandler | WebsocketRouteHandler]:
    hub = LiveHub(bus, CHANNEL, notification_of)
    return [
        asgi("/api/rpc", copy_scope=False, name="rpc_http", include_in_schema=False)(
            rpc_http_handler(callers, jobs, max_body_bytes=max_body_bytes)
        ),
        asgi("/api/rpc/events", copy_scope=False, name="rpc_events", include_in_schema=False)(
            rpc_events_handler(callers, jobs, hub)
        ),
        rpc_socket_handler(callers, jobs, hub, max_message_bytes=max_body_bytes),
    ]
