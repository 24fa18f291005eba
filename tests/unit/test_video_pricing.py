"""Video pricing arithmetic, and the poller's schedule and progress estimate (both pure)."""

from __future__ import annotations

import datetime

import pytest

from app.domain.video.events import notification_of
from app.domain.video.pricing import Price, cost_of, frames, resolution_coeff, short_side
from app.domain.video.schedule import (
    MAX_POLL_SECONDS,
    estimate_progress,
    next_poll_at,
    poll_delay,
)
from app.domain.video.schemas import VideoError, VideoJobOut, VideoResult

COEFFS = {"720": 1.0, "1080": 2.5, "*": 1.5}


def test_per_call_is_the_base_whatever_the_request() -> None:
    price = Price(mode="per_call", base=0.4, price_per_second=99, price_per_frame=99)
    assert cost_of(price, 6, 1920, 1080) == 0.4
    assert cost_of(price, 60, None, None) == 0.4


@pytest.mark.parametrize(
    ("width", "height", "coeff"),
    [
        (1280, 720, 1.0),
        (720, 1280, 1.0),  # portrait: the short side is the width
        (1920, 1080, 2.5),
        (None, 1080, 2.5),  # one side given: that side
        (1080, None, 2.5),
        (640, 480, 1.5),  # no coefficient for 480: the "*" fallback
        (None, None, 1.5),  # unknown resolution: the fallback too
    ],
)
def test_per_second_resolution_uses_the_short_side(
    width: int | None, height: int | None, coeff: float
) -> None:
    price = Price(base=0.1, price_per_second=0.05, resolution_coeffs=COEFFS)
    assert cost_of(price, 6, width, height) == pytest.approx(0.1 + 6 * 0.05 * coeff)


def test_per_second_resolution_is_the_default_and_without_coefficients_charges_alike() -> None:
    price = Price(base=0.0, price_per_second=0.1)
    assert price.mode == "per_second_resolution"
    assert cost_of(price, 10, 1920, 1080) == pytest.approx(1.0)
    assert cost_of(price, 10, None, None) == pytest.approx(1.0)
    only_exact = {"720": 2.0}
    assert resolution_coeff(only_exact, 1280, 720) == 2.0
    assert resolution_coeff(only_exact, 1920, 1080) == 1.0


def test_per_frame_counts_every_started_frame() -> None:
    price = Price(mode="per_frame", base=0.5, price_per_frame=0.01, fps=24)
    assert frames(6, 24) == 144
    assert frames(6.01, 24) == 145
    assert frames(1 / 3, 30) == 10
    assert cost_of(price, 6, None, None) == pytest.approx(0.5 + 144 * 0.01)
    assert cost_of(Price(mode="per_frame", price_per_frame=0.001, fps=30), 10, 1, 1) == 0.3


def test_no_price_is_no_cost_and_costs_are_rounded() -> None:
    assert cost_of(None, 6, 1280, 720) is None
    assert cost_of(Price(mode="per_call", base=0.1 + 0.2), 6, None, None) == 0.3
    assert cost_of(Price(price_per_second=1 / 3), 1, None, None) == 0.333333


def test_short_side() -> None:
    assert short_side(None, None) is None
    assert short_side(800, 600) == 600
    assert short_side(None, 64) == 64


# -- the poller's schedule ----------------------------------------------------------------


def test_polls_back_off_by_half_up_to_a_cap() -> None:
    delays = [poll_delay(n, 2.0) for n in range(8)]
    assert delays[:4] == [2.0, 3.0, 4.5, 6.75]
    assert delays == sorted(delays)
    assert max(delays) == MAX_POLL_SECONDS
    assert poll_delay(10_000, 2.0) == MAX_POLL_SECONDS
    # A first interval above the cap is kept as it is.
    assert poll_delay(5, 30.0) == 30.0


def test_the_next_poll_never_passes_the_deadline() -> None:
    now = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)
    deadline = now + datetime.timedelta(seconds=1)
    assert next_poll_at(now, 0, 0.5, deadline) == now + datetime.timedelta(seconds=0.5)
    assert next_poll_at(now, 9, 0.5, deadline) == deadline


def test_progress_follows_the_provider_and_never_goes_back() -> None:
    assert estimate_progress(5, "Preparing", 0) == 8
    assert estimate_progress(8, "Queueing", 1) == 12
    early = estimate_progress(12, "Processing", 0)
    later = estimate_progress(early, "Processing", 60)
    much_later = estimate_progress(later, "Processing", 3600)
    assert 20 <= early < later < much_later <= 95
    # A late "Queueing" (or an unknown status) does not pull it back.
    assert estimate_progress(later, "Queueing", 61) == later
    assert estimate_progress(later, "SomethingNew", 61) == later
    assert estimate_progress(99, "Processing", 10**6) == 99


# -- notifications ------------------------------------------------------------------------


def _job(status: str, **fields: object) -> VideoJobOut:
    values: dict[str, object] = {
        "id": "vid_1",
        "object": "video.generation",
        "model": "m",
        "status": status,
        "progress": 40,
        "stream_id": "s1",
        "created_at": 1,
        "updated_at": 2,
    }
    values.update(fields)
    return VideoJobOut(**values)  # type: ignore[arg-type]


def test_notifications_of_a_job_read_back() -> None:
    assert notification_of(_job("running")) == (
        "video.progress",
        {"job_id": "vid_1", "stream_id": "s1", "status": "running", "progress": 40},
    )
    done = _job("done", progress=100, result=VideoResult("http://x/v.mp4"), cost=0.7)
    assert notification_of(done) == (
        "video.done",
        {"job_id": "vid_1", "stream_id": "s1", "result": {"url": "http://x/v.mp4"}, "cost": 0.7},
    )
    failed = _job("failed", error=VideoError("boom", "video_failed"))
    assert notification_of(failed) == (
        "video.failed",
        {"job_id": "vid_1", "stream_id": "s1", "error": "boom"},
    )
    cancelled = _job("cancelled", error=VideoError("cancelled", "cancelled"))
    assert notification_of(cancelled)[1]["error"] == "cancelled"
