"""The HTML faces' per-app objects: console and dashboard sessions."""

from __future__ import annotations

from collections.abc import Mapping

from app.domain.web.deps import web_dependencies
from app.domain.web.sessions import WebSessions
from app.lib.components import Component
from app.lib.settings import Settings
from app.lib.state.base import StateStore


class WebWiring(Component):
    name = "web"

    def __init__(self, settings: Settings, *, state_store: StateStore) -> None:
        self.sessions = WebSessions(state_store, idle_seconds=settings.session_idle_seconds)

    def provides(self) -> Mapping[str, object]:
        return {**web_dependencies(), "web_sessions": self.sessions}
