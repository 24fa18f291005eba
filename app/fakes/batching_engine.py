"""A simulated continuous-batching engine (the scheduling shape of vLLM), clock-agnostic.

What routing quality depends on is modelled, nothing else:

- ``slots`` batch slots (``max_num_seqs``) and a KV cache of ``kv_tokens`` tokens: a
  waiting request is admitted, oldest first, when a slot is free and its prompt fits;
- every engine step prefills the newly admitted prompts and decodes one token for each
  running request; a step takes ``step_base + step_per_seq * batch`` seconds plus
  ``prefill_per_token`` per admitted prompt token, divided by ``speed`` (so a bigger
  batch is slower per step but faster in total, as on a GPU);
- when the growing sequences no longer fit the KV cache, the newest running request is
  preempted back to the head of the queue (recomputed when readmitted, as vLLM does);
- a request leaves when it has produced its ``output_tokens`` or is aborted (its client
  went away).

The engine publishes what vLLM publishes (``running``, ``waiting``, KV-cache usage,
finished requests) and keeps, per request, when it arrived, was first admitted, got its
first token and finished: the queue wait a router causes is measured here, not guessed.

The core is driven by whoever owns the clock: ``BatchingEngineServer``
(``app.fakes.batching_server``) in real time behind HTTP, or the benchmark's
discrete-event simulation in virtual time. It never sleeps or reads a clock itself.
"""

from __future__ import annotations

import contextlib
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

DEFAULT_STEP_BASE = 0.012
DEFAULT_STEP_PER_SEQ = 0.0006
DEFAULT_PREFILL_PER_TOKEN = 0.00004
PREEMPT_WATERMARK = 1.0


@dataclass(frozen=True, slots=True)
class EngineShape:
    """One engine's capacity and speed."""

    name: str
    slots: int
    kv_tokens: int
    speed: float = 1.0
    step_base: float = DEFAULT_STEP_BASE
    step_per_seq: float = DEFAULT_STEP_PER_SEQ
    prefill_per_token: float = DEFAULT_PREFILL_PER_TOKEN

    def step_seconds(self, batch: int, prefill_tokens: int) -> float:
        decode = self.step_base + self.step_per_seq * batch if batch else 0.0
        return (decode + self.prefill_per_token * prefill_tokens) / self.speed

    def full_batch_rate(self, output_tokens: float, prompt_tokens: float) -> float:
        """Requests per second when every slot is busy (the engine's capacity): a
        request holds a slot for its decode steps, and its prefill stalls the whole
        batch for one step."""
        decode = self.step_seconds(self.slots, 0) * output_tokens
        prefill = self.prefill_per_token * prompt_tokens / self.speed
        return self.slots / (decode + self.slots * prefill)


TokenSink = Callable[["EngineRequest", int, bool], None]
"""Called with (request, tokens produced this step, finished) after each step."""


@dataclass(slots=True, eq=False)
class EngineRequest:
    id: int
    prompt_tokens: int
    output_tokens: int
    arrived: float
    sink: TokenSink | None = None
    admitted: float | None = None
    """First admission (the end of its queue wait)."""
    first_token: float | None = None
    finished: float | None = None
    aborted: bool = False
    generated: int = 0
    preemptions: int = 0
    _needs_prefill: int = 0

    @property
    def queue_wait(self) -> float | None:
        return None if self.admitted is None else self.admitted - self.arrived

    @property
    def kv_size(self) -> int:
        return self.prompt_tokens + self.generated


@dataclass(slots=True)
class EngineStats:
    finished: int = 0
    aborted: int = 0
    preemptions: int = 0
    steps: int = 0
    busy_seconds: float = 0.0


@dataclass(slots=True, eq=False)
class BatchingEngine:
    shape: EngineShape
    waiting: deque[EngineRequest] = field(default_factory=deque)
    running: list[EngineRequest] = field(default_factory=list)
    stats: EngineStats = field(default_factory=EngineStats)
    records: list[EngineRequest] = field(default_factory=list)
    """Every request that arrived, in arrival order (for the benchmark's figures)."""
    _next_id: int = 0
    _step: tuple[float, list[EngineRequest]] | None = None

    # -- what vLLM publishes -------------------------------------------------------

    @property
    def name(self) -> str:
        return self.shape.name

    @property
    def num_running(self) -> int:
        return len(self.running)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    @property
    def kv_used(self) -> int:
        return sum(r.kv_size for r in self.running)

    @property
    def kv_usage(self) -> float:
        return min(1.0, self.kv_used / self.shape.kv_tokens)

    def metrics_text(self, model: str) -> str:
        """The Prometheus page a vLLM server would serve now."""
        labels = f'{{engine="0",model_name="{model}"}}'
        return (
            "# TYPE vllm:num_requests_running gauge\n"
            f"vllm:num_requests_running{labels} {self.num_running}\n"
            "# TYPE vllm:num_requests_waiting gauge\n"
            f"vllm:num_requests_waiting{labels} {self.num_waiting}\n"
            "# TYPE vllm:kv_cache_usage_perc gauge\n"
            f"vllm:kv_cache_usage_perc{labels} {self.kv_usage}\n"
            "# TYPE vllm:request_success_total counter\n"
            f'vllm:request_success_total{{engine="0",finished_reason="length",'
            f'model_name="{model}"}} {self.stats.finished}\n'
            "# TYPE vllm:num_preemptions_total counter\n"
            f"vllm:num_preemptions_total{labels} {self.stats.preemptions}\n"
        )

    # -- requests ------------------------------------------------------------------

    def submit(
        self, prompt_tokens: int, output_tokens: int, now: float, sink: TokenSink | None = None
    ) -> EngineRequest:
        self._next_id += 1
        request = EngineRequest(
            self._next_id, max(1, prompt_tokens), max(1, output_tokens), now, sink
        )
        request._needs_prefill = request.prompt_tokens
        self.waiting.append(request)
        self.records.append(request)
        return request

    def abort(self, request: EngineRequest, now: float) -> None:
        """The client went away: the request leaves the queue or the batch at once."""
        if request.finished is not None or request.aborted:
            return
        request.aborted = True
        request.finished = now
        self.stats.aborted += 1
        if request in self.running:
            self.running.remove(request)
        else:
            with contextlib.suppress(ValueError):  # already out of the queue
                self.waiting.remove(request)

    @property
    def idle(self) -> bool:
        return not self.running and not self.waiting

    # -- stepping --------------------------------------------------------------------

    def start_step(self, now: float) -> float | None:
        """Admit what fits and plan one step; its duration, or None when idle."""
        admitted = self._admit(now)
        if not self.running:
            return None
        prefill = sum(r._needs_prefill for r in admitted)
        for request in admitted:
            request._needs_prefill = 0
        seconds = self.shape.step_seconds(len(self.running), prefill)
        self._step = (seconds, list(self.running))
        return seconds

    def finish_step(self, now: float) -> None:
        """The planned step is over: every request in it produced one token."""
        if self._step is None:
            return
        seconds, batch = self._step
        self._step = None
        self.stats.steps += 1
        self.stats.busy_seconds += seconds
        for request in batch:
            if request.aborted or request not in self.running:
                continue
            request.generated += 1
            if request.first_token is None:
                request.first_token = now
            done = request.generated >= request.output_tokens
            if done:
                request.finished = now
                self.running.remove(request)
                self.stats.finished += 1
            if request.sink is not None:
                request.sink(request, 1, done)
        self._preempt_if_full()

    def _admit(self, now: float) -> list[EngineRequest]:
        admitted: list[EngineRequest] = []
        used = self.kv_used
        while self.waiting and len(self.running) < self.shape.slots:
            request = self.waiting[0]
            if used + request.kv_size > self.shape.kv_tokens and self.running:
                break  # does not fit now; it waits for a finish (an empty batch takes it)
            self.waiting.popleft()
            self.running.append(request)
            used += request.kv_size
            if request.admitted is None:
                request.admitted = now
            admitted.append(request)
        return admitted

    def _preempt_if_full(self) -> None:
        while len(self.running) > 1 and self.kv_used > self.shape.kv_tokens * PREEMPT_WATERMARK:
            victim = self.running.pop()  # the newest: least work lost
            victim.preemptions += 1
            victim._needs_prefill = victim.kv_size  # recomputed when readmitted
            self.stats.preemptions += 1
            self.waiting.appendleft(victim)
