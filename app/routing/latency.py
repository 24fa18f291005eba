"""Typical time to first token per profile, over a sliding window.

``typical`` is the median of the samples younger than ``window_seconds``: the median,
not the mean, so one pathological request does not flip a profile to slow. Below
``min_samples`` the answer is None (not enough evidence either way). Each profile keeps
at most ``max_samples`` (the newest), so memory stays bounded under any traffic.

Each replica records what it serves; ``SharedLatency`` adds the samples the other
replicas recorded (``record_aged``), so every replica judges a profile by the same
evidence.
"""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass, field

from app.routing.types import Clock, monotonic

DEFAULT_WINDOW_SECONDS = 30.0
DEFAULT_MIN_SAMPLES = 3
DEFAULT_MAX_SAMPLES = 256


@dataclass(slots=True)
class _Series:
    samples: deque[tuple[float, float]]
    """``(recorded_at, ttft_ms)``, oldest first."""
    typical: float | None = None
    valid_until: float | None = None
    """The cached ``typical`` holds until the oldest sample ages out (or one is added):
    routing asks on every request and must not sort the window each time."""


@dataclass(slots=True)
class LatencyTracker:
    window_seconds: float = DEFAULT_WINDOW_SECONDS
    min_samples: int = DEFAULT_MIN_SAMPLES
    clock: Clock = monotonic
    max_samples: int = DEFAULT_MAX_SAMPLES
    _series: dict[str, _Series] = field(default_factory=dict, init=False)

    def record(self, profile_id: str, ttft_ms: float) -> None:
        series = self._series.get(profile_id)
        if series is None:
            series = _Series(deque(maxlen=self.max_samples))
            self._series[profile_id] = series
        series.samples.append((self.clock(), ttft_ms))
        series.valid_until = None

    def record_aged(self, profile_id: str, ttft_ms: float, age_seconds: float) -> None:
        """Record a sample taken ``age_seconds`` ago (on another replica); one already
        outside the window is ignored. Kept in time order, so pruning stays exact."""
        if age_seconds >= self.window_seconds:
            return
        series = self._series.get(profile_id)
        if series is None:
            series = _Series(deque(maxlen=self.max_samples))
            self._series[profile_id] = series
        at = self.clock() - max(0.0, age_seconds)
        samples = series.samples
        position = len(samples)
        # Samples from elsewhere are at most a second or so old: found near the end.
        while position > 0 and samples[position - 1][0] > at:
            position -= 1
        if len(samples) == samples.maxlen:
            if position == 0:
                return  # older than everything a full series keeps
            samples.popleft()
            position -= 1
        samples.insert(position, (at, ttft_ms))
        series.valid_until = None

    def typical(self, profile_id: str) -> float | None:
        """Median TTFT (ms) of the window, or None with fewer than ``min_samples``."""
        series = self._series.get(profile_id)
        if series is None:
            return None
        now = self.clock()
        if series.valid_until is not None and now < series.valid_until:
            return series.typical
        if not self._prune(profile_id, series, now):
            return None
        samples = series.samples
        enough = len(samples) >= self.min_samples
        series.typical = statistics.median(ms for _, ms in samples) if enough else None
        series.valid_until = samples[0][0] + self.window_seconds
        return series.typical

    def count(self, profile_id: str) -> int:
        """Samples inside the window."""
        series = self._series.get(profile_id)
        if series is None or not self._prune(profile_id, series, self.clock()):
            return 0
        return len(series.samples)

    def forget(self, profile_id: str) -> None:
        self._series.pop(profile_id, None)

    def _prune(self, profile_id: str, series: _Series, now: float) -> bool:
        """Drop aged-out samples; False (and the series dropped) when none remain."""
        samples = series.samples
        horizon = now - self.window_seconds
        while samples and samples[0][0] <= horizon:
            samples.popleft()
            series.valid_until = None
        if not samples:
            del self._series[profile_id]
            return False
        return True
