"""When to look at a job next, and how far along it looks: pure functions."""

from __future__ import annotations

import datetime
import math

BACKOFF_FACTOR = 1.5
MAX_POLL_SECONDS = 15.0
SUBMITTED_PROGRESS = 5
# A provider reports a status, not a percentage: the estimate starts from the status
# and creeps towards RUNNING_CEILING as time passes (EXPECTED_SECONDS is the time
# constant: about 63% of the way after that long). It never reaches 100 before the
# provider says the video is done, and it never goes backwards.
STATUS_FLOOR = {"Preparing": 8, "Queueing": 12, "Processing": 20}
RUNNING_CEILING = 95
EXPECTED_SECONDS = 90.0
MAX_UNFINISHED_PROGRESS = 99


def poll_delay(steps: int, first: float) -> float:
    """Seconds until the next poll after ``steps`` steps: ``first``, x1.5 each step,
    capped at 15 s (or at ``first`` when that is longer)."""
    cap = max(MAX_POLL_SECONDS, first)
    exponent = min(max(steps, 0), 64)  # beyond this the cap holds anyway
    return float(min(cap, first * BACKOFF_FACTOR**exponent))


def next_poll_at(
    now: datetime.datetime, steps: int, first: float, deadline: datetime.datetime
) -> datetime.datetime:
    """The next poll time; never past the deadline, so a timeout is noticed on time."""
    return min(now + datetime.timedelta(seconds=poll_delay(steps, first)), deadline)


def estimate_progress(previous: int, provider_status: str, elapsed_seconds: float) -> int:
    """The progress to show after a poll saw ``provider_status``, ``elapsed_seconds``
    after the task was submitted."""
    floor = STATUS_FLOOR.get(provider_status)
    if floor is None:
        estimate = previous  # a status this build does not know: hold still
    elif provider_status == "Processing":
        share = 1.0 - math.exp(-max(elapsed_seconds, 0.0) / EXPECTED_SECONDS)
        estimate = floor + int((RUNNING_CEILING - floor) * share)
    else:
        estimate = floor
    return max(previous, min(estimate, MAX_UNFINISHED_PROGRESS))
