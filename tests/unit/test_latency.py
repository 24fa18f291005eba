"""The sliding-window TTFT tracker, on a fake clock."""

from __future__ import annotations

from app.routing.latency import LatencyTracker
from tests.support.routing_fakes import FakeClock


def make(window: float = 30.0, min_samples: int = 3) -> tuple[LatencyTracker, FakeClock]:
    clock = FakeClock()
    return LatencyTracker(window, min_samples, clock), clock


def test_unknown_below_min_samples_then_the_median() -> None:
    tracker, _ = make()
    assert tracker.typical("p") is None
    tracker.record("p", 100)
    tracker.record("p", 5000)
    assert tracker.typical("p") is None
    tracker.record("p", 200)
    assert tracker.typical("p") == 200  # one outlier does not move the median
    tracker.record("p", 300)
    assert tracker.typical("p") == 250
    assert tracker.count("p") == 4


def test_profiles_are_tracked_apart() -> None:
    tracker, _ = make(min_samples=1)
    tracker.record("a", 10)
    tracker.record("b", 90)
    assert (tracker.typical("a"), tracker.typical("b")) == (10, 90)


def test_samples_age_out_of_the_window() -> None:
    tracker, clock = make(window=30, min_samples=2)
    tracker.record("p", 1000)
    clock.advance(10)
    tracker.record("p", 3000)
    tracker.record("p", 5000)
    assert tracker.typical("p") == 3000
    clock.advance(19.9)
    assert tracker.typical("p") == 3000  # the first sample is 29.9 s old: still in
    clock.advance(0.1)
    assert tracker.typical("p") == 4000  # exactly the window old: out
    assert tracker.count("p") == 2
    clock.advance(10)
    assert tracker.typical("p") is None
    assert tracker.count("p") == 0


def test_a_new_sample_is_seen_at_once() -> None:
    tracker, _ = make(min_samples=1)
    tracker.record("p", 100)
    assert tracker.typical("p") == 100
    tracker.record("p", 300)
    assert tracker.typical("p") == 200


def test_memory_is_bounded_to_the_newest_samples() -> None:
    clock = FakeClock()
    tracker = LatencyTracker(60, 1, clock, max_samples=4)
    for ms in (9000, 9000, 9000, 1, 2, 3, 4):
        tracker.record("p", ms)
    assert tracker.count("p") == 4
    assert tracker.typical("p") == 2.5


def test_forget_drops_a_profile() -> None:
    tracker, _ = make(min_samples=1)
    tracker.record("p", 100)
    tracker.forget("p")
    tracker.forget("p")
    assert tracker.typical("p") is None
    assert tracker.count("p") == 0


def test_samples_from_elsewhere_count_at_their_age_and_age_out_in_order() -> None:
    tracker, clock = make(window=30.0, min_samples=3)
    tracker.record("p", 100)
    clock.advance(10)
    tracker.record("p", 300)
    tracker.record_aged("p", 200, age_seconds=5)  # between the two local samples
    tracker.record_aged("p", 999, age_seconds=30)  # already outside the window
    assert tracker.count("p") == 3
    assert tracker.typical("p") == 200
    clock.advance(20.5)  # the first sample (t=0) is out; the aged one (t=5) still in
    assert tracker.count("p") == 2
    clock.advance(5)  # t=35.5: the aged one (t=5) is out too
    assert tracker.count("p") == 1


def test_a_full_series_drops_its_oldest_for_a_newer_sample_from_elsewhere() -> None:
    tracker = LatencyTracker(60, 1, FakeClock(), max_samples=3)
    for ms in (1, 2, 3):
        tracker.record("p", ms)
    tracker.record_aged("p", 9, age_seconds=0)
    assert tracker.count("p") == 3
    tracker.record_aged("p", 0, age_seconds=50)  # older than all it keeps: ignored
    assert tracker.count("p") == 3
    assert tracker.typical("p") == 3  # median of (2, 3, 9)
