"""What a call may use at most, before it runs: admission reserves this much.

Tokens: the prompt's estimate (``app.routing.usage``: characters / 4, as the meter
estimates usage an upstream did not report) plus the output the call may produce:
its ``max_completion_tokens`` or ``max_tokens``, capped by its profile's or custom
LLM's limit; without either, the cap, else ``default_output_tokens``. Embeddings
produce no output tokens.

Cost: those tokens at the dearest price in force for the call's names on any
backend (``PriceBook.estimate_micros``), since the backend is chosen after admission.

The meter settles the reservation to what the call actually used, so an estimate
above it only holds units for the length of the call; one below it lets the
concurrent calls of that moment overshoot by the difference.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol
from uuid import UUID

import msgspec

from app.domain.quotas.gate import CallEstimate
from app.routing.types import RawBody, Usage
from app.routing.usage import estimate_prompt_tokens

DEFAULT_OUTPUT_TOKENS = 1024
_OUTPUT_FIELDS = ("max_completion_tokens", "max_tokens")


class CostEstimator(Protocol):
    """The price book's side of an estimate (``PriceBook.estimate_micros``)."""

    async def estimate_micros(
        self,
        names: Sequence[str],
        usage: Usage,
        project_id: UUID | None,
        is_custom_or_override: bool,
        *,
        embedding: bool,
    ) -> int: ...


@dataclass(frozen=True, slots=True)
class CallShape:
    """What admission needs of a call to estimate it (read only if a limit asks)."""

    body: RawBody
    embedding: bool = False
    output_cap: int | None = None
    """The profile's or custom LLM's largest output (``None``: no cap known)."""


def requested_output(body: RawBody) -> int | None:
    for name in _OUTPUT_FIELDS:
        raw = body.get(name)
        if raw is None:
            continue
        try:
            value = msgspec.json.decode(raw)
        except msgspec.DecodeError:
            return None
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            return value
        return None
    return None


def output_tokens(shape: CallShape, default: int) -> int:
    if shape.embedding:
        return 0
    asked = requested_output(shape.body)
    cap = shape.output_cap
    if asked is None:
        return cap if cap is not None else default
    return asked if cap is None else min(asked, cap)


class CallEstimator:
    def __init__(
        self, prices: CostEstimator | None, *, default_output_tokens: int = DEFAULT_OUTPUT_TOKENS
    ) -> None:
        self._prices = prices
        self.default_output_tokens = default_output_tokens

    async def estimate(
        self,
        shape: CallShape,
        names: Sequence[str],
        project_id: UUID | None,
        *,
        is_custom_or_override: bool,
    ) -> CallEstimate:
        prompt = estimate_prompt_tokens(shape.body)
        output = output_tokens(shape, self.default_output_tokens)
        cost = 0
        if self._prices is not None:
            cost = await self._prices.estimate_micros(
                names,
                Usage(prompt_tokens=prompt, completion_tokens=output, estimated=True),
                project_id,
                is_custom_or_override,
                embedding=shape.embedding,
            )
        return CallEstimate(tokens=prompt + output, cost_micros=cost)
