"""One metering path: what a call turned into becomes one usage record.

Every surface collects a ``CallRecord`` while its call runs (``/v1`` chat and
embeddings, the runtime chat, video jobs) and turns it into the same ``UsageEntry``:
the request path hands it to the ``UsageSink`` through ``Meter`` (which prices it at
settle with its ``CallPricer``, settles the admission's reservation to the call's
actual tokens and cost, and never fails the call it meters); video jobs
write it as a row in the transaction that makes the job final (``usage_row``).
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Protocol
from uuid import UUID

import msgspec
import structlog

from app.domain.calls.admission import Admission
from app.domain.calls.callers import Caller
from app.domain.quotas.holds import CallHold
from app.domain.records import copied
from app.domain.usage.entry import UsageEntry, UsageSink
from app.lib.clock import utcnow
from app.lib.errors import AronaError
from app.routing.relay import RelayedStream
from app.routing.service import CallOutcome
from app.routing.types import Clock, Usage

logger = structlog.get_logger()

CLIENT_CLOSED_STATUS = 499
"""The status of a call whose client went away before it finished (nginx's 499)."""
CLIENT_CLOSED_CODE = "client_closed"
MICROS = 1_000_000
"""Micro-units in one unit of a currency."""


@dataclass(slots=True)
class CallRecord:
    """What one call turned into, collected while it runs."""

    endpoint: str
    model_requested: str
    started: float = 0.0
    """When the call started, on the meter's clock (monotonic)."""
    project_id: UUID | None = None
    api_key_id: UUID | None = None
    user_id: UUID | None = None
    streamed: bool = False
    conversation_id: str | None = None
    model_profile_id: str | None = None
    backend: str | None = None
    model_served: str | None = None
    usage: Usage | None = None
    status: int = 200
    error_code: str | None = None
    ttft_ms: int | None = None
    is_custom: bool = False
    is_override_key: bool = False
    cost_micros: int | None = None
    """What the call cost in micro-units of ``currency`` (None: unpriced)."""
    currency: str | None = None
    cost_estimated: bool = False
    hold: CallHold | None = None
    """The admission's reservation, settled to this call's use when it is metered."""

    def charged_to(self, caller: Caller) -> None:
        self.project_id = caller.project_id
        self.api_key_id, self.user_id = caller.api_key_id, caller.user_id

    def admitted(self, admission: Admission) -> None:
        self.is_custom, self.is_override_key = admission.is_custom, admission.is_override_key
        self.hold = admission.hold

    def failed(self, error: AronaError) -> None:
        self.status, self.error_code = error.status_code, error.code

    def client_closed(self) -> None:
        self.status, self.error_code = CLIENT_CLOSED_STATUS, CLIENT_CLOSED_CODE

    def served(self, outcome: CallOutcome) -> None:
        """A complete answer came back from ``outcome.backend``."""
        self.backend, self.model_served = outcome.backend, outcome.served_model or None
        self.usage = outcome.usage

    def relayed(self, relay: RelayedStream, usage: Usage) -> None:
        """A relayed stream is over; ``usage`` is what it counted."""
        self.backend, self.model_served = relay.backend or None, relay.served_model or None
        self.usage = usage
        if relay.first_byte_at is not None:
            self.ttft_ms = int((relay.first_byte_at - self.started) * 1000)

    def priced(self, cost_micros: int | None, currency: str | None) -> None:
        """What the call cost (None: unpriced); estimated when its usage was."""
        self.cost_micros = cost_micros
        self.currency = None if cost_micros is None else currency
        estimated = self.usage is not None and self.usage.estimated
        self.cost_estimated = cost_micros is not None and estimated

    def entry(self, *, latency_ms: int, created_at: datetime.datetime | None = None) -> UsageEntry:
        usage = self.usage or Usage()
        # The call's own fields by name (the entry's ``id`` is new); the counts from
        # its usage; ``cost`` is the exact amount as the float readers before it use.
        return copied(
            UsageEntry,
            self,
            cost=None if self.cost_micros is None else self.cost_micros / MICROS,
            prompt_tokens=usage.prompt_tokens,
            completion_tokens=usage.completion_tokens,
            total_tokens=usage.total_tokens,
            estimated=usage.estimated,
            latency_ms=latency_ms,
            created_at=created_at or utcnow(),
        )


def usage_row(entry: UsageEntry) -> dict[str, Any]:
    """``entry`` as the values of a ``usage_records`` INSERT (for writes that must be
    in the caller's own transaction)."""
    return msgspec.structs.asdict(entry)


class CallPricer(Protocol):
    """What the meter prices a call with (``app.domain.prices.PriceBook``)."""

    async def cost_of(
        self, call: CallRecord, at: datetime.datetime
    ) -> tuple[int | None, str | None]:
        """The call's cost in micro-units and its currency at ``at``; ``(None, None)``
        when no price applies. From memory in steady state; never raises."""
        ...


class Meter:
    """Records calls through the request path's ``UsageSink``; latency on ``clock``."""

    __slots__ = ("_clock", "_prices", "_sink")

    def __init__(self, sink: UsageSink, clock: Clock, prices: CallPricer | None = None) -> None:
        self._sink = sink
        self._clock = clock
        self._prices = prices

    def now(self) -> float:
        return self._clock()

    async def record(self, call: CallRecord) -> None:
        try:
            latency_ms = int((self._clock() - call.started) * 1000)
            at = utcnow()
            if self._prices is not None and call.usage is not None:
                call.priced(*await self._prices.cost_of(call, at))
            settling = None
            if call.hold is not None:
                # Tokens and cost settle to actuals (0 when no upstream answered). The
                # settle leaves with the usage entry: one write to Redis for both.
                usage = call.usage
                settling = call.hold.settle(
                    0 if usage is None else usage.total_tokens, call.cost_micros or 0
                )
            try:
                await self._sink.record(call.entry(latency_ms=latency_ms, created_at=at))
            finally:
                if settling is not None:
                    await settling
        except Exception as exc:  # metering must never fail the request it meters
            logger.error("could not record usage", error=repr(exc))

    def failures(self, call: CallRecord) -> MeteredFailures:
        """Around what can refuse or fail a call before it has an answer (admission,
        the upstream call): an ``AronaError`` from it is the call's outcome, metered
        like any other, and raised on for the surface to answer."""
        return MeteredFailures(self, call)


class MeteredFailures:
    """``Meter.failures``' context. A class rather than ``@asynccontextmanager``: a
    generator-based one re-raises the error inside its generator (``athrow``) and then
    again out of ``__aexit__``, two extra unwinds on every failed call, where this one
    only looks at the error passing through."""

    __slots__ = ("_call", "_meter")

    def __init__(self, meter: Meter, call: CallRecord) -> None:
        self._meter = meter
        self._call = call

    async def __aenter__(self) -> None:
        return None

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if isinstance(exc, AronaError):
            self._call.failed(exc)
            await self._meter.record(self._call)
        elif exc is not None and self._call.hold is not None:
            # Cancelled (the client left) or a bug: not metered here, but the call's
            # reservation must not stay held (its tokens and cost: none known).
            await self._call.hold.settle(0, 0)
