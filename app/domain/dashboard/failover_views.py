"""What the failover page shows: the switch, each watched profile's status (from the
admin API's ``failover_out``, with changes other replicas published), and the sticky
fallback pins (``FallbackPinService``)."""

from __future__ import annotations

import datetime
from dataclasses import dataclass

import msgspec
from advanced_alchemy.extensions.litestar import SQLAlchemyAsyncConfig

from app.db.models import FallbackPin
from app.domain.backends.failover import FailoverControl, ProfileFailoverOut, failover_out
from app.domain.conversations.pins import FallbackPinService
from app.domain.projects.services import ProjectService
from app.lib.events.base import Event
from app.routing.profiles import ProfileTable

PIN_PAGE = 200
STATES = frozenset({"ok", "slow", "redirecting"})


@dataclass(frozen=True, slots=True)
class StatusView:
    status: ProfileFailoverOut
    name: str
    target_name: str | None
    remote: bool
    """The state shown was reported by another replica (newer than this one's)."""

    @property
    def tone(self) -> str:
        return {"ok": "ok", "redirecting": "warn"}.get(self.status.state, "bad")


@dataclass(frozen=True, slots=True)
class PinView:
    pin: FallbackPin
    project_name: str


@dataclass(frozen=True, slots=True)
class _Remote:
    state: str
    target: str | None
    since: datetime.datetime


class FailoverOverlay:
    """Status changes other replicas published on ``failover`` (latency samples are
    per replica); the newer of theirs and ours is shown."""

    def __init__(self, local_origin: str) -> None:
        self._origin = local_origin
        self._seen: dict[str, _Remote] = {}

    def note(self, event: Event) -> None:
        if event.get("kind") != "status" or event.get("origin") == self._origin:
            return
        profile_id, state, since = event.get("profileId"), event.get("state"), event.get("since")
        target = event.get("target")
        if not isinstance(profile_id, str) or state not in STATES:
            return
        if not isinstance(since, int | float):
            return
        self._seen[profile_id] = _Remote(
            state=str(state),
            target=target if isinstance(target, str) else None,
            since=datetime.datetime.fromtimestamp(float(since), datetime.UTC),
        )

    def apply(self, status: ProfileFailoverOut) -> tuple[ProfileFailoverOut, bool]:
        seen = self._seen.get(status.profile_id)
        if seen is None or seen.since <= status.since:
            return status, False
        changed = msgspec.structs.replace(
            status, state=seen.state, target=seen.target, since=seen.since
        )
        return changed, True


def status_views(
    control: FailoverControl, profiles: ProfileTable, overlay: FailoverOverlay | None = None
) -> tuple[bool, list[StatusView]]:
    """The switch and every watched profile's status (refreshed now)."""
    current = failover_out(control.policy, profiles)
    views = []
    for item in current.profiles:
        shown, remote = overlay.apply(item) if overlay is not None else (item, False)
        profile = profiles.get(shown.profile_id)
        target = None if shown.target is None else profiles.get(shown.target)
        views.append(
            StatusView(
                status=shown,
                name=profile.name if profile is not None else shown.profile_id,
                target_name=target.name if target is not None else shown.target,
                remote=remote,
            )
        )
    return current.enabled, views


async def pin_views(db_config: SQLAlchemyAsyncConfig) -> tuple[list[PinView], int]:
    """The newest pins of every project, with their project's name, and the total."""
    async with FallbackPinService.new(config=db_config) as service:
        pins, total = await service.page(PIN_PAGE, 0)
        projects = ProjectService(session=service.repository.session)
        names = await projects.names_of({pin.project_id for pin in pins})
    return [PinView(pin, names.get(pin.project_id, "(deleted project)")) for pin in pins], total
