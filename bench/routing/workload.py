"""Pools of simulated engines and the traffic sent to them.

A pool is a list of ``EngineShape``; its capacity (requests per second) is the sum of
each engine's full-batch rate for the mean request. A workload is open-loop Poisson
arrivals at a fraction of that capacity, each request with a prompt and output length
drawn from the seed, so every policy and every run of a seed sees the same requests
at the same times.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from app.fakes.batching_engine import EngineShape

MEAN_PROMPT_TOKENS = 300
MEAN_OUTPUT_TOKENS = 160
KV_TOKENS_PER_SLOT = 700
"""KV cache per batch slot: room for the mean request and then some (long ones can
still fill it, which is what makes the KV-cache gauge worth reading)."""
FIRST_TOKEN_DEADLINE = 30.0
"""A request whose first token has not come after this long is abandoned (a timeout:
the client disconnects and the engine drops it)."""


def _engine(name: str, slots: int, speed: float = 1.0) -> EngineShape:
    return EngineShape(name, slots, slots * KV_TOKENS_PER_SLOT, speed)


POOLS: dict[str, tuple[EngineShape, ...]] = {
    "homogeneous": tuple(_engine(f"h{i}", 8) for i in range(4)),
    # The pool: 16, 8, 8 and 4 slots, the last at half speed.
    "skewed": (_engine("s16", 16), _engine("s8a", 8), _engine("s8b", 8), _engine("s4", 4, 0.5)),
    "one-slow": (
        _engine("f1", 8),
        _engine("f2", 8),
        _engine("f3", 8),
        _engine("slow", 8, 0.25),
    ),
}
LOADS = (0.6, 0.8, 0.95)


def pool_capacity(pool: tuple[EngineShape, ...]) -> float:
    return sum(e.full_batch_rate(MEAN_OUTPUT_TOKENS, MEAN_PROMPT_TOKENS) for e in pool)


@dataclass(frozen=True, slots=True)
class Arrival:
    at: float
    prompt_tokens: int
    output_tokens: int


@dataclass(frozen=True, slots=True)
class Workload:
    pool_name: str
    load: float
    seed: int
    duration: float
    """Seconds of arrivals (engine time)."""

    @property
    def pool(self) -> tuple[EngineShape, ...]:
        return POOLS[self.pool_name]

    @property
    def rate(self) -> float:
        return self.load * pool_capacity(self.pool)

    def arrivals(self) -> list[Arrival]:
        rng = random.Random(f"{self.pool_name}:{self.load}:{self.seed}")
        out: list[Arrival] = []
        at = 0.0
        while True:
            at += rng.expovariate(self.rate)
            if at >= self.duration:
                return out
            out.append(
                Arrival(at, _length(rng, MEAN_PROMPT_TOKENS), _length(rng, MEAN_OUTPUT_TOKENS))
            )


def _length(rng: random.Random, mean: float) -> int:
    # Log-normal with a long right tail (sigma 0.6), as request sizes are.
    sigma = 0.6
    value = rng.lognormvariate(math.log(mean) - sigma * sigma / 2, sigma)
    return max(8, min(int(value), int(mean * 6)))
