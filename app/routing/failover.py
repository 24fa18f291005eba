"""Latency failover: new requests leave a slow profile for the next one in its chain.

A profile is *slow* when its typical time to first token (``LatencyTracker``) is above
its threshold: its own ``slow_threshold_ms``, or, for a profile with a failover chain
and no threshold of its own, the platform default (``ARONA_FAILOVER_SLOW_THRESHOLD_MS``).

The evidence is every streamed call to the profile's base model on the backends that
serve the profile (those carrying all its tags), whichever surface made it:
``/v1/chat/completions`` as much as the runtime chat (``record_call``, fed by the
routing service at each stream's first chunk). A sample counts for every profile
whose pool the backend is in, so a backend made slow by ``/v1`` traffic moves the
runtime profiles it serves, and recovers them as soon as fast answers come back.

The policy is global (every project, every conversation) and non-sticky (each request
is decided afresh). A slow profile's requests go to the first link of its
``failover_chain`` that exists, is enabled, is not slow itself and is available to the
caller; with none, they stay on the slow profile. Priority conversations are never
redirected, and an admin can switch the policy off.

Recovery needs no probe: while redirected, the slow profile gets traffic only from
other surfaces and priority conversations, so its samples age out of the window (or
are replaced by fast ones); once fewer than ``min_samples`` remain its typical TTFT is
unknown, it counts as ok again and traffic returns. If it is still slow, the first new
samples flip it back to redirecting.

Every judged profile has a status (``ok``, ``slow``: slow with nowhere to
go, ``redirecting``: slow and sending new requests to ``target``). ``on_change`` is
called exactly when a profile's (state, target) changes, detected whenever the policy
looks: on ``route``, ``record``, ``refresh`` (the caller runs it periodically, so a
profile without traffic recovers too), ``statuses`` and a toggle of ``enabled``.
The status target is judged without any one project's view (``has_backend`` at most),
so it does not flap between callers; ``route`` decides each request with the caller's
own ``available``. Samples travel between replicas (``SharedLatency``), so every
replica reaches the same status from the same evidence.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import KW_ONLY, dataclass, field
from typing import Literal

import structlog

from app.routing.latency import LatencyTracker
from app.routing.profiles import Profile, ProfileTable

FailoverState = Literal["ok", "slow", "redirecting"]
Availability = Callable[[Profile], bool]

logger = structlog.get_logger()


@dataclass(frozen=True, slots=True)
class FailoverDecision:
    profile: Profile
    """The profile to serve this request with."""
    redirected_from: str | None = None
    """The slow profile's id when the request was redirected."""


@dataclass(frozen=True, slots=True)
class ProfileFailoverStatus:
    profile_id: str
    state: FailoverState
    target: str | None
    since: float
    """Wall-clock epoch seconds of the last (state, target) change."""
    typical_ttft_ms: float | None
    samples: int


ChangeListener = Callable[[ProfileFailoverStatus], None]
PoolMember = Callable[[Profile, str, str], bool]
"""``(profile, model as asked, backend)``: whether a call for that model on that
backend is one of the profile's calls (same base model, a backend of its pool)."""
DEFAULT_SLOW_THRESHOLD_MS = 10_000.0


@dataclass(slots=True)
class _Mark:
    state: FailoverState
    target: str | None
    since: float


def _always(_: Profile) -> bool:
    return True


@dataclass(slots=True, eq=False)
class FailoverPolicy:
    profiles: ProfileTable
    tracker: LatencyTracker
    clock_wall: Callable[[], float] = time.time
    on_change: ChangeListener | None = None
    _: KW_ONLY
    has_backend: Availability | None = None
    in_pool: PoolMember | None = None
    default_threshold_ms: float = DEFAULT_SLOW_THRESHOLD_MS
    _enabled: bool = field(default=True, init=False)
    _marks: dict[str, _Mark] = field(default_factory=dict, init=False)
    _sample_listeners: list[Callable[[str, float], None]] = field(default_factory=list, init=False)

    @property
    def enabled(self) -> bool:
        return self._enabled

    @enabled.setter
    def enabled(self, value: bool) -> None:
        self._enabled = value
        self.refresh()  # redirecting <-> slow is a change the dashboard must hear about

    def threshold_ms(self, profile: Profile) -> float | None:
        """The TTFT above which ``profile`` is slow (None: it is never judged)."""
        if profile.slow_threshold_ms is not None:
            return float(profile.slow_threshold_ms)
        return self.default_threshold_ms if profile.failover_chain else None

    def is_slow(self, profile: Profile) -> bool:
        threshold = self.threshold_ms(profile)
        if threshold is None:
            return False
        typical = self.tracker.typical(profile.id)
        return typical is not None and typical > threshold

    def route(
        self, profile: Profile, *, priority: bool, available: Availability
    ) -> FailoverDecision:
        slow = self._observe(profile)
        if not self._enabled or priority or not slow:
            return FailoverDecision(profile)
        target = self._first_link(profile, available)
        if target is None:
            return FailoverDecision(profile)
        return FailoverDecision(target, redirected_from=profile.id)

    def on_sample(self, listener: Callable[[str, float], None]) -> None:
        """Call ``listener(profile_id, ttft_ms)`` for every sample recorded here
        (``SharedLatency`` sends them to the other replicas)."""
        self._sample_listeners.append(listener)

    def record_call(self, model: str, backend: str, ttft_ms: float) -> None:
        """A streamed call for ``model`` got its first token from ``backend`` after
        ``ttft_ms``: a sample for every judged profile whose pool that is."""
        if self.in_pool is None:
            return
        matched = False
        for profile in self.profiles:
            if self.threshold_ms(profile) is not None and self.in_pool(profile, model, backend):
                self._add(profile.id, ttft_ms)
                matched = True
        if matched:
            self.refresh()

    def record(self, profile_id: str, ttft_ms: float) -> None:
        """Record a TTFT under one profile."""
        self._add(profile_id, ttft_ms)
        # Not just this profile: it may be a link whose slowness moves others' targets.
        self.refresh()

    def _add(self, profile_id: str, ttft_ms: float) -> None:
        self.tracker.record(profile_id, ttft_ms)
        for listener in self._sample_listeners:
            listener(profile_id, ttft_ms)

    def record_elsewhere(self, samples: list[tuple[str, float, float]]) -> None:
        """Add ``(profile_id, ttft_ms, age_seconds)`` samples another replica recorded."""
        for profile_id, ttft_ms, age in samples:
            self.tracker.record_aged(profile_id, ttft_ms, age)
        self.refresh()

    def refresh(self) -> None:
        tracked: set[str] = set()
        for profile in self.profiles:
            if self.threshold_ms(profile) is not None:
                tracked.add(profile.id)
                self._observe(profile)
        for profile_id in [p for p in self._marks if p not in tracked]:
            mark = self._marks.pop(profile_id)
            self.tracker.forget(profile_id)
            if mark.state != "ok":
                # Removed or no longer watched: tell listeners it stopped redirecting.
                self._notify(
                    ProfileFailoverStatus(profile_id, "ok", None, self.clock_wall(), None, 0)
                )

    def statuses(self) -> list[ProfileFailoverStatus]:
        self.refresh()
        return [self._status(profile_id, mark) for profile_id, mark in sorted(self._marks.items())]

    def _observe(self, profile: Profile) -> bool:
        """Bring ``profile``'s status up to date (notifying on change); True if slow."""
        slow = self.is_slow(profile)
        if self.threshold_ms(profile) is None or self.profiles.get(profile.id) is None:
            return slow  # only the table's profiles have a status (a stale copy would flap)
        state: FailoverState = "ok"
        target: Profile | None = None
        if slow:
            if self._enabled:
                target = self._first_link(profile, self.has_backend or _always)
            state = "redirecting" if target is not None else "slow"
        target_id = None if target is None else target.id
        mark = self._marks.get(profile.id)
        if mark is None:
            mark = self._marks[profile.id] = _Mark("ok", None, self.clock_wall())
        if (mark.state, mark.target) != (state, target_id):
            mark.state, mark.target, mark.since = state, target_id, self.clock_wall()
            self._notify(self._status(profile.id, mark))
        return slow

    def _first_link(self, profile: Profile, available: Availability) -> Profile | None:
        for link_id in profile.failover_chain:
            link = self.profiles.get(link_id)
            if (
                link is not None
                and link.id != profile.id
                and link.enabled
                and not self.is_slow(link)
                and available(link)
            ):
                return link
        return None

    def _status(self, profile_id: str, mark: _Mark) -> ProfileFailoverStatus:
        return ProfileFailoverStatus(
            profile_id=profile_id,
            state=mark.state,
            target=mark.target,
            since=mark.since,
            typical_ttft_ms=self.tracker.typical(profile_id),
            samples=self.tracker.count(profile_id),
        )

    def _notify(self, status: ProfileFailoverStatus) -> None:
        if self.on_change is None:
            return
        try:
            self.on_change(status)
        except Exception as exc:  # a broken listener must not fail the request routing it
            logger.warning("failover_listener_failed", profile=status.profile_id, error=str(exc))
