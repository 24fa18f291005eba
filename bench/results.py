"""Collected samples and their summaries: medians, spreads, ratios, targets."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Literal

from bench.scenarios import SCENARIOS, Sample

MEMORY = "memory"
"""Pseudo-scenario holding one sample per system: RSS after warm-up and after load."""

Better = Literal["lower", "higher"]


@dataclass(slots=True)
class Results:
    samples: dict[str, dict[str, list[Sample]]] = field(default_factory=dict)
    """scenario key -> system key -> one sample per repetition."""

    def add(self, scenario: str, system: str, sample: Sample) -> None:
        self.samples.setdefault(scenario, {}).setdefault(system, []).append(sample)

    def values(self, scenario: str, system: str, metric: str) -> list[float]:
        found = self.samples.get(scenario, {}).get(system, [])
        return [s.metrics[metric] for s in found if metric in s.metrics]

    def median(self, scenario: str, system: str, metric: str) -> float | None:
        values = self.values(scenario, system, metric)
        return statistics.median(values) if values else None

    def derive_added_latency(self) -> None:
        """Added p50 over direct, paired per repetition (same minute, same machine state)."""
        for scenario in SCENARIOS:
            by_system = self.samples.get(scenario.key, {})
            floor = by_system.get("direct", [])
            for system, samples in by_system.items():
                if system == "direct":
                    continue
                for sample, base in zip(samples, floor, strict=False):
                    if "p50_ms" in sample.metrics and "p50_ms" in base.metrics:
                        added = sample.metrics["p50_ms"] - base.metrics["p50_ms"]
                        sample.metrics["added_p50_ms"] = added

    def flagged(self) -> list[str]:
        lines: list[str] = []
        for scenario, by_system in self.samples.items():
            for system, samples in by_system.items():
                for index, sample in enumerate(samples, start=1):
                    if sample.errors or sample.notes:
                        detail = "; ".join(sample.notes) or f"{sample.errors} errors"
                        kind = "errors" if sample.errors else "note"
                        lines.append(f"{kind}: {scenario} / {system} / run {index}: {detail}")
        return lines

    def summary(self) -> dict[str, dict[str, dict[str, dict[str, float]]]]:
        """scenario -> system -> metric -> {median, min, max} (for the JSON file)."""
        out: dict[str, dict[str, dict[str, dict[str, float]]]] = {}
        for scenario, by_system in self.samples.items():
            for system, samples in by_system.items():
                metrics = sorted({m for s in samples for m in s.metrics})
                for metric in metrics:
                    values = self.values(scenario, system, metric)
                    out.setdefault(scenario, {}).setdefault(system, {})[metric] = {
                        "median": statistics.median(values),
                        "min": min(values),
                        "max": max(values),
                    }
        return out


@dataclass(frozen=True, slots=True)
class TargetSpec:
    label: str
    scenario: str
    metric: str
    limit: float
    better: Better
    unit: str
    where: str


TARGETS = (
    TargetSpec(
        "CPU per non-streaming chat request", "chat-c64", "cpu_ms_per_req", 0.5, "lower", "ms",
        "chat, concurrency 64",
    ),
    TargetSpec(
        "CPU per 20-chunk stream", "stream-c16", "cpu_ms_per_req", 1.0, "lower", "ms",
        "streaming, concurrency 16",
    ),
    TargetSpec(
        "Non-streaming requests/s at concurrency 64", "chat-c64", "rps", 2000, "higher", "/s",
        "chat, concurrency 64",
    ),
    TargetSpec(
        "Added p50 latency at concurrency 1", "chat-c1", "added_p50_ms", 1.0, "lower", "ms",
        "chat, concurrency 1, paired with direct",
    ),
    TargetSpec(
        "p99 latency at concurrency 64", "chat-c64", "p99_ms", 60, "lower", "ms",
        "chat, concurrency 64",
    ),
    TargetSpec(
        "RSS after warm-up", MEMORY, "rss_after_warmup_mb", 150, "lower", "MB",
        "process tree, after 2 s of each load",
    ),
    TargetSpec(
        "Memory per open idle stream", "slow-1000", "kb_per_stream", 20, "lower", "KB",
        "1,000 slow streams",
    ),
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class Verdict:
    spec: TargetSpec
    arona: float | None
    litellm: float | None

    @property
    def passed(self) -> bool | None:
        if self.arona is None:
            return None
        if self.spec.better == "lower":
            return self.arona <= self.spec.limit
        return self.arona >= self.spec.limit

    @property
    def text(self) -> str:
        passed = self.passed
        if passed is None:
            return "n/a"
        if passed:
            return "PASS"
        assert self.arona is not None
        off = (self.arona - self.spec.limit) / self.spec.limit * 100
        return f"MISS ({off:+.0f}%)"


def verdicts(results: Results) -> list[Verdict]:
    return [
        Verdict(
            spec,
            results.median(spec.scenario, "arona", spec.metric),
            results.median(spec.scenario, "litellm", spec.metric),
        )
        for spec in TARGETS
    ]
