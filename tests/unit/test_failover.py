"""Latency failover along a profile's chain: engage, skip, fall back, recover, notify."""

from __future__ import annotations

from dataclasses import replace

import pytest

from app.routing.failover import FailoverPolicy, ProfileFailoverStatus
from app.routing.latency import LatencyTracker
from app.routing.profiles import Profile, ProfileTable
from tests.support.routing_fakes import FakeClock

WINDOW = 30.0


class Rig:
    def __init__(self) -> None:
        self.clock = FakeClock()
        self.wall = FakeClock()
        self.wall.now = 1_700_000_000.0
        self.table = ProfileTable(
            [
                Profile(
                    "smart",
                    "Smart",
                    "big",
                    slow_threshold_ms=1000,
                    failover_chain=("ghost", "fast", "cheap"),
                ),
                Profile("fast", "Fast", "mid", slow_threshold_ms=500),
                Profile("cheap", "Cheap", "small"),
            ]
        )
        self.tracker = LatencyTracker(WINDOW, 3, self.clock)
        self.changes: list[ProfileFailoverStatus] = []
        self.policy = FailoverPolicy(self.table, self.tracker, self.wall, self.changes.append)

    def profile(self, profile_id: str) -> Profile:
        profile = self.table.get(profile_id)
        assert profile is not None
        return profile

    def slow_down(self, profile_id: str, ms: float = 2000, samples: int = 3) -> None:
        for _ in range(samples):
            self.policy.record(profile_id, ms)

    def route(
        self, profile_id: str = "smart", *, priority: bool = False, unavailable: str = ""
    ) -> str:
        decision = self.policy.route(
            self.profile(profile_id),
            priority=priority,
            available=lambda p: p.id != unavailable,
        )
        if decision.profile.id != profile_id:
            assert decision.redirected_from == profile_id
        else:
            assert decision.redirected_from is None
        return decision.profile.id

    def status(self, profile_id: str = "smart") -> ProfileFailoverStatus:
        return next(s for s in self.policy.statuses() if s.profile_id == profile_id)

    def transitions(self) -> list[tuple[str, str, str | None]]:
        return [(c.profile_id, c.state, c.target) for c in self.changes]


@pytest.fixture
def rig() -> Rig:
    return Rig()


def test_a_fast_profile_is_used_unchanged(rig: Rig) -> None:
    rig.slow_down("smart", ms=900)
    assert rig.route() == "smart"
    assert rig.status().state == "ok"
    assert rig.changes == []


def test_at_the_threshold_is_not_slow(rig: Rig) -> None:
    rig.slow_down("smart", ms=1000)
    assert rig.route() == "smart"


def test_too_few_samples_never_engage(rig: Rig) -> None:
    rig.slow_down("smart", samples=2)
    assert rig.route() == "smart"


def test_engages_above_the_threshold_along_the_chain(rig: Rig) -> None:
    rig.slow_down("smart")
    assert rig.route() == "fast"  # "ghost" is not in the table: skipped
    status = rig.status()
    assert (status.state, status.target) == ("redirecting", "fast")
    assert status.typical_ttft_ms == 2000
    assert status.samples == 3


def test_skips_a_link_that_is_slow_itself(rig: Rig) -> None:
    rig.slow_down("smart")
    rig.slow_down("fast", ms=600)
    assert rig.route() == "cheap"
    assert rig.status().target == "cheap"
    assert rig.status("fast").state == "slow"  # fast has no chain: nowhere to go


def test_skips_a_disabled_link(rig: Rig) -> None:
    rig.table.put(replace(rig.profile("fast"), enabled=False))
    rig.slow_down("smart")
    assert rig.route() == "cheap"


def test_skips_a_link_unavailable_to_the_caller(rig: Rig) -> None:
    rig.slow_down("smart")
    assert rig.route(unavailable="fast") == "cheap"
    # The status is global: one project's view does not move it.
    assert rig.status().target == "fast"


def test_falls_back_to_the_original_when_no_link_qualifies(rig: Rig) -> None:
    rig.table.put(replace(rig.profile("cheap"), enabled=False))
    rig.slow_down("smart")
    rig.slow_down("fast", ms=600)
    assert rig.route() == "smart"
    assert (rig.status().state, rig.status().target) == ("slow", None)


def test_global_backend_check_shapes_the_status(rig: Rig) -> None:
    policy = FailoverPolicy(
        rig.table, rig.tracker, rig.wall, rig.changes.append, has_backend=lambda p: p.id != "fast"
    )
    for _ in range(3):
        policy.record("smart", 2000)
    assert [(s.profile_id, s.state, s.target) for s in policy.statuses()] == [
        ("fast", "ok", None),
        ("smart", "redirecting", "cheap"),
    ]


def test_recovers_once_its_samples_age_out(rig: Rig) -> None:
    rig.slow_down("smart")
    assert rig.route() == "fast"
    rig.clock.advance(WINDOW - 1)
    assert rig.route() == "fast"
    rig.clock.advance(1)
    assert rig.route() == "smart"
    assert rig.status().state == "ok"
    # Still slow: new samples flip it again.
    rig.slow_down("smart")
    assert rig.route() == "fast"
    assert rig.transitions() == [
        ("smart", "redirecting", "fast"),
        ("smart", "ok", None),
        ("smart", "redirecting", "fast"),
    ]


def test_refresh_notices_recovery_without_traffic(rig: Rig) -> None:
    rig.slow_down("smart")
    rig.clock.advance(WINDOW)
    rig.policy.refresh()
    assert rig.transitions()[-1] == ("smart", "ok", None)


def test_priority_conversations_are_never_redirected(rig: Rig) -> None:
    rig.slow_down("smart")
    assert rig.route(priority=True) == "smart"
    assert rig.route() == "fast"


def test_the_toggle_switches_redirection_off_and_on(rig: Rig) -> None:
    assert rig.policy.enabled
    rig.slow_down("smart")
    rig.policy.enabled = False
    assert rig.route() == "smart"
    assert rig.status().state == "slow"
    rig.policy.enabled = True
    assert rig.route() == "fast"
    assert rig.transitions() == [
        ("smart", "redirecting", "fast"),
        ("smart", "slow", None),
        ("smart", "redirecting", "fast"),
    ]


def test_on_change_fires_once_per_transition(rig: Rig) -> None:
    rig.slow_down("smart", samples=5)
    for _ in range(5):
        rig.route()
        rig.policy.refresh()
        rig.policy.statuses()
    assert rig.transitions() == [("smart", "redirecting", "fast")]
    rig.slow_down("fast", ms=600)  # the target itself turns slow: a new target
    assert rig.transitions() == [
        ("smart", "redirecting", "fast"),
        ("fast", "slow", None),
        ("smart", "redirecting", "cheap"),
    ]


def test_since_is_the_time_of_the_last_change(rig: Rig) -> None:
    start = rig.wall.now
    assert rig.status().since == start
    rig.wall.advance(5)
    rig.slow_down("smart")
    assert rig.status().since == start + 5
    assert rig.changes[-1].since == start + 5
    rig.wall.advance(5)
    rig.route()
    assert rig.status().since == start + 5  # no change, no new since
    rig.clock.advance(WINDOW)
    rig.wall.advance(5)
    rig.route()
    assert rig.status().since == start + 15


def test_statuses_cover_only_profiles_with_a_threshold(rig: Rig) -> None:
    assert [s.profile_id for s in rig.policy.statuses()] == ["fast", "smart"]
    assert rig.status().typical_ttft_ms is None
    assert rig.status().samples == 0


def test_a_removed_redirecting_profile_is_reported_ok_once(rig: Rig) -> None:
    rig.slow_down("smart")
    rig.table.remove("smart")
    rig.policy.refresh()
    rig.policy.refresh()
    assert rig.transitions() == [("smart", "redirecting", "fast"), ("smart", "ok", None)]
    assert [s.profile_id for s in rig.policy.statuses()] == ["fast"]


def test_a_broken_listener_does_not_break_routing(rig: Rig) -> None:
    def explode(_: ProfileFailoverStatus) -> None:
        raise RuntimeError("listener bug")

    policy = FailoverPolicy(rig.table, rig.tracker, rig.wall, explode)
    for _ in range(3):
        policy.record("smart", 2000)
    decision = policy.route(rig.profile("smart"), priority=False, available=lambda _: True)
    assert decision.profile.id == "fast"


# ----------------------------------------------- samples from every call to the model


def pool_rig(default_threshold_ms: float = 4000) -> tuple[FailoverPolicy, ProfileTable]:
    """Profiles on model ``big``: ``tagged`` only on backends tagged ``gpu``; ``chained``
    has a chain but no threshold (the default applies); ``plain`` neither."""
    table = ProfileTable(
        [
            Profile("tagged", "T", "big", tags=frozenset({"gpu"}), slow_threshold_ms=1000),
            Profile("chained", "C", "big", failover_chain=("other",)),
            Profile("plain", "P", "big"),
            Profile("other", "O", "small"),
        ]
    )
    tags = {"gpu-1": frozenset({"gpu"}), "cpu-1": frozenset[str]()}

    def in_pool(profile: Profile, model: str, backend: str) -> bool:
        return model == profile.base_model and profile.tags <= tags[backend]

    policy = FailoverPolicy(
        table,
        LatencyTracker(WINDOW, 3, FakeClock()),
        in_pool=in_pool,
        default_threshold_ms=default_threshold_ms,
    )
    return policy, table


def test_a_call_counts_for_every_judged_profile_whose_pool_served_it() -> None:
    policy, table = pool_rig()
    for _ in range(3):
        policy.record_call("big", "gpu-1", 5000)
    states = {s.profile_id: (s.state, s.samples) for s in policy.statuses()}
    # ``plain`` has neither threshold nor chain: not judged, no status.
    assert states == {"tagged": ("slow", 3), "chained": ("redirecting", 3)}
    other = table.get("other")
    assert other is not None
    assert policy.threshold_ms(other) is None


def test_calls_on_a_backend_outside_a_profiles_pool_do_not_count_for_it() -> None:
    policy, _ = pool_rig()
    for _ in range(3):
        policy.record_call("big", "cpu-1", 5000)  # no ``gpu`` tag: not ``tagged``'s pool
        policy.record_call("small", "gpu-1", 5000)  # another model
    states = {s.profile_id: (s.state, s.samples) for s in policy.statuses()}
    assert states == {"tagged": ("ok", 0), "chained": ("redirecting", 3)}


def test_the_default_threshold_judges_a_chained_profile_without_its_own() -> None:
    policy, table = pool_rig(default_threshold_ms=6000)
    chained = table.get("chained")
    assert chained is not None
    for _ in range(3):
        policy.record_call("big", "cpu-1", 5000)
    assert policy.threshold_ms(chained) == 6000
    assert not policy.is_slow(chained)
    for _ in range(4):
        policy.record_call("big", "cpu-1", 7000)
    assert policy.is_slow(chained)
