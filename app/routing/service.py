"""The routing service: select, call, retry, account, relay.

One entry point per capability. A call that fails before any byte reached the client
is retried on another candidate (at most ``max_retries`` times); breaker verdicts,
cooldowns and in-flight counts are recorded exactly once per attempt, including when
the client goes away mid-stream.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, replace
from typing import TypeVar

import structlog

from app.routing.backends.base import ChatStream, VideoBackend
from app.routing.breaker import BreakerState
from app.routing.errors import NoHealthyBackendError, StreamInterruptedError, UpstreamError
from app.routing.registry import BackendRegistry, BackendState
from app.routing.router import Router, Selection
from app.routing.types import (
    Capability,
    Clock,
    RawBody,
    RouteHints,
    UpstreamCall,
    Usage,
    VideoSubmission,
    VideoTask,
    monotonic,
)
from app.routing.usage import estimated_usage

DEFAULT_MAX_RETRIES = 2
logger = structlog.get_logger()
T = TypeVar("T")
FirstTokenListener = Callable[[str, str, float], None]
"""``(model as asked, backend, ttft_ms)`` of a routed stream's first chunk."""

__all__ = [
    "DEFAULT_MAX_RETRIES",
    "CallOutcome",
    "ListedModel",
    "RelayedStream",
    "RoutingService",
    "VideoSubmission",
]


@dataclass(slots=True)
class CallOutcome:
    """A complete response and where it came from."""

    content: bytes
    usage: Usage
    backend: str
    served_model: str
    attempts: int


@dataclass(frozen=True, slots=True)
class ListedModel:
    id: str
    owned_by: str


def _settle(router: Router, state: BackendState, error: BaseException | None) -> None:
    """Record one attempt's verdict in the breaker and the cooldown; a change of
    either (breaker opened or closed, cooling started) is announced to the router's
    verdict listeners, which share it with the other replicas."""
    was_closed = state.breaker.state is BreakerState.CLOSED
    was_cooling = router.is_cooling(state)
    if isinstance(error, StreamInterruptedError) or (
        isinstance(error, UpstreamError) and error.retryable
    ):
        state.breaker.record_failure()
        router.cool_down(state)
    elif error is None or isinstance(error, UpstreamError):
        # A 4xx proves the upstream is alive; the request was at fault.
        state.breaker.record_success()
        router.clear_cooldown(state)
    else:
        state.breaker.release()  # cancelled or our own bug: no verdict on the upstream
        return
    if (state.breaker.state is BreakerState.CLOSED) != was_closed or (
        router.is_cooling(state) != was_cooling
    ):
        router.verdict_changed(state)


class RoutingService:
    def __init__(
        self,
        registry: BackendRegistry,
        router: Router,
        *,
        max_retries: int = DEFAULT_MAX_RETRIES,
        clock: Clock = monotonic,
    ) -> None:
        self.registry = registry
        self.router = router
        self.max_retries = max_retries
        self.clock = clock
        self._first_token_listeners: list[FirstTokenListener] = []

    def on_first_token(self, listener: FirstTokenListener) -> None:
        """Call ``listener(model, backend, ttft_ms)`` when a routed stream's first chunk
        arrives (retries included in the time; a project's custom LLM is not routed
        and not reported). Latency failover feeds on it."""
        self._first_token_listeners.append(listener)

    def first_token(self, model: str, backend: str, ttft_ms: float) -> None:
        for listener in self._first_token_listeners:
            try:
                listener(model, backend, ttft_ms)
            except Exception as exc:  # a sample lost must not cut the stream that made it
                logger.warning("first_token_listener_failed", error=repr(exc))

    async def chat(
        self, model: str, body: RawBody, hints: RouteHints, *, target: BackendState | None = None
    ) -> CallOutcome:
        """A complete chat answer. With ``target`` (a project's custom LLM) that backend
        alone is used: no selection, and only network errors are retried, on it."""

        async def run(selection: Selection) -> CallOutcome:
            call = UpstreamCall(model=selection.served_model, body=body, api_key=hints.api_key)
            result = await selection.state.adapter.chat(call)
            usage = result.usage or estimated_usage(body, result.completion_text_chars)
            return CallOutcome(result.content, usage, selection.state.name, call.model, 0)

        outcome, attempts = await self._with_retries(model, "chat", hints, run, target=target)
        outcome.attempts = attempts
        return outcome

    async def embed(
        self, model: str, body: RawBody, hints: RouteHints, *, target: BackendState | None = None
    ) -> CallOutcome:
        async def run(selection: Selection) -> CallOutcome:
            call = UpstreamCall(model=selection.served_model, body=body, api_key=hints.api_key)
            result = await selection.state.adapter.embed(call)
            usage = result.usage or estimated_usage(body, 0)
            return CallOutcome(result.content, usage, selection.state.name, call.model, 0)

        outcome, attempts = await self._with_retries(model, "embeddings", hints, run, target=target)
        outcome.attempts = attempts
        return outcome

    async def open_chat_stream(
        self,
        model: str,
        body: RawBody,
        hints: RouteHints,
        *,
        include_usage: bool,
        target: BackendState | None = None,
    ) -> RelayedStream:
        """Open an upstream stream (retrying failures to open it) and return the relay."""
        relay = RelayedStream(self, model, body, hints, include_usage, target)
        await relay.open()
        return relay

    async def submit_video(self, model: str, task: VideoTask, hints: RouteHints) -> VideoSubmission:
        """Create a generation on a video backend, retrying retryable failures elsewhere.

        Only backends with the ``video`` capability are candidates (chat backends never
        are, and video backends never serve chat). ``task.model`` is replaced by the
        name the chosen backend advertises. Raises ``NotAVideoModelError`` (400) for a
        model only chat or embeddings backends advertise, ``ModelNotFoundError`` (404)
        when nobody advertises it, ``NoHealthyBackendError`` when its video backends are
        all down, and the last ``UpstreamError`` when every attempt failed. Polls are
        not routed: they go to the backend that created the task (``video_backend``).
        """

        async def run(selection: Selection) -> VideoSubmission:
            adapter = selection.state.adapter
            if not isinstance(adapter, VideoBackend):  # capability filtering guarantees it
                raise TypeError(f"{selection.state.name} is not a video backend")
            served = selection.served_model
            task_id = await adapter.submit_video(replace(task, model=served))
            return VideoSubmission(selection.state.name, served, task_id)

        submission, _ = await self._with_retries(model, "video", hints, run)
        return submission

    def video_backend(self, name: str) -> VideoBackend | None:
        """The current adapter of backend ``name`` if it is a video backend (a task is
        polled where it was created); None when it is gone or of another kind."""
        state = self.registry.get(name)
        if state is None or not isinstance(state.adapter, VideoBackend):
            return None
        return state.adapter

    def list_models(self) -> list[ListedModel]:
        listed: dict[str, ListedModel] = {}
        for state in self.registry:
            if state.health.healthy:
                for name in state.models:
                    listed.setdefault(name, ListedModel(name, state.name))
        for alias, target in self.router.alias_items():
            if alias not in listed and self._routable(target):
                listed[alias] = ListedModel(alias, "alias")
        return sorted(listed.values(), key=lambda m: m.id)

    def _routable(self, model: str) -> bool:
        return any(
            state.health.healthy and state.served_name(model) is not None for state in self.registry
        )

    async def _with_retries(
        self,
        model: str,
        capability: Capability,
        hints: RouteHints,
        run: Callable[[Selection], Awaitable[T]],
        *,
        keep_in_flight: bool = False,
        max_attempts: int | None = None,
        target: BackendState | None = None,
    ) -> tuple[T, int]:
        """Run ``run`` on selected backends until one succeeds or retries run out.

        With ``keep_in_flight`` the successful attempt stays counted in flight (a stream
        that is still open) and its breaker verdict is left to the caller. With
        ``target`` every attempt goes to that backend, and only failures that never
        reached it (network errors) are retried.
        """
        resolved = model if target is not None else self.router.resolve(model)
        excluded = set(hints.exclude)
        # The last failure waits in a list, not a local: it is raised with ``pop()``,
        # so this frame (which its traceback holds) does not hold it back, and a failed
        # call leaves no reference cycle for the collector (whose pauses stall every
        # stream in flight).
        failures: list[UpstreamError] = []
        allowed = self.max_retries + 1 if max_attempts is None else max_attempts
        for attempt in range(1, allowed + 1):
            try:
                if target is not None:
                    selection = _direct(target, resolved)
                else:
                    selection = await self.router.select(
                        resolved, capability, replace(hints, exclude=frozenset(excluded))
                    )
            except NoHealthyBackendError:
                if failures:
                    raise failures.pop() from None  # what the attempts said, not "none left"
                raise
            state = selection.state
            state.load.dispatched()
            try:
                result = await run(selection)
            except UpstreamError as exc:
                state.load.finished()
                _settle(self.router, state, exc)
                if not exc.retryable or (target is not None and exc.upstream_status is not None):
                    raise
                failures[:] = [exc]
                excluded.add(state.name)
                continue
            except BaseException as exc:
                state.load.finished()
                _settle(self.router, state, exc)
                raise
            if not keep_in_flight:
                state.load.finished()
                _settle(self.router, state, None)
            return result, attempt
        if not failures:
            raise NoHealthyBackendError(resolved, "retry budget spent")
        raise failures.pop()


def _direct(target: BackendState, model: str) -> Selection:
    """The one backend of a custom LLM; its breaker still fails fast when it is down."""
    if not target.breaker.acquire():
        raise NoHealthyBackendError(model, f"{target.name}: circuit breaker open")
    return Selection(target, target.served_name(model) or model)


class RelayedStream:
    """The client-facing stream: SSE bytes relayed from the chosen upstream.

    ``open`` returns once an upstream sent its first chunk: a backend that fails
    before that (refused, an error status, a stream cut before its first byte) is
    replaced by the next candidate within the retry budget, so ``backend`` names the
    one that serves and a call nobody could serve fails with its error status before
    the client saw any header. Once a byte went out, a failure ends the relay with
    ``StreamInterruptedError`` and the caller sends the SSE error event.
    """

    def __init__(
        self,
        service: RoutingService,
        model: str,
        body: RawBody,
        hints: RouteHints,
        include_usage: bool,
        target: BackendState | None = None,
    ) -> None:
        self._service = service
        self._target = target
        self._model = model
        self._body = body
        self._hints = hints
        self._include_usage = include_usage
        self._excluded: set[str] = set(hints.exclude)
        self._attempts_used = 0
        self._upstream: ChatStream | None = None
        self._chunks: AsyncIterator[bytes] | None = None
        self._first: bytes | None = None
        self._state: BackendState | None = None
        self.backend: str = ""
        self.served_model: str = ""
        self.usage: Usage = Usage()
        self.first_byte_at: float | None = None
        self.failed = False
        """The relay ended in an upstream failure (the error itself was raised)."""
        self._completion_chars = 0
        self._opened_at = service.clock()

    @property
    def attempts(self) -> int:
        return self._attempts_used

    async def open(self) -> None:
        """Connect and wait for the first chunk, on another candidate after a failure."""
        cuts: list[StreamInterruptedError] = []  # popped when raised: no cycle (``_with_retries``)
        while True:
            try:
                await self._connect()
            except NoHealthyBackendError:
                if not cuts:
                    raise
                self.failed = True
                raise cuts.pop() from None  # nobody left: report what went wrong
            except UpstreamError:
                self.failed = True
                raise
            try:
                await self._read_first()
                return
            except StreamInterruptedError as exc:
                await self._give_up_on_current(exc)
                if not self._can_retry():
                    self.failed = True
                    raise
                cuts[:] = [exc]
                self._excluded.add(self.backend)

    async def _connect(self) -> None:
        service = self._service

        async def run(selection: Selection) -> ChatStream:
            call = UpstreamCall(
                model=selection.served_model,
                body=self._body,
                stream=True,
                include_usage=self._include_usage,
                api_key=self._hints.api_key,
            )
            return await selection.state.adapter.chat_stream(call)

        hints = replace(self._hints, exclude=frozenset(self._excluded))
        selected: list[Selection] = []

        async def run_and_note(selection: Selection) -> ChatStream:
            selected.append(selection)
            return await run(selection)

        upstream, attempts = await service._with_retries(
            self._model,
            "chat",
            hints,
            run_and_note,
            keep_in_flight=True,
            max_attempts=service.max_retries + 1 - self._attempts_used,
            target=self._target,
        )
        self._attempts_used += attempts
        self._excluded.update(s.state.name for s in selected[:-1])
        self._upstream = upstream
        self._chunks = aiter(upstream)
        self._state = selected[-1].state
        upstream.count_text = not self._state.reports_usage
        self.backend = self._state.name
        self.served_model = selected[-1].served_model

    async def _read_first(self) -> None:
        assert self._chunks is not None
        try:
            self._first = await anext(self._chunks)
        except StopAsyncIteration:
            self._first = None  # an empty stream: it ends at once in ``__aiter__``
            return
        self.first_byte_at = self._service.clock()
        if self._target is None:
            ttft_ms = (self.first_byte_at - self._opened_at) * 1000
            self._service.first_token(self._model, self.backend, ttft_ms)

    async def _give_up_on_current(self, error: StreamInterruptedError) -> None:
        """The current upstream failed before its first byte: account for it."""
        if self._upstream is not None:
            self._completion_chars += self._upstream.completion_text_chars
        self._chunks = None
        await self._finish(error)
        self._settle_usage(produced=False)

    async def __aiter__(self) -> AsyncGenerator[bytes, None]:
        upstream, chunks = self._upstream, self._chunks
        if upstream is None or chunks is None:
            return
        try:
            if self._first is not None:
                first, self._first = self._first, None
                yield first
                async for chunk in chunks:
                    yield chunk
        except StreamInterruptedError as exc:
            self._completion_chars += upstream.completion_text_chars
            await self._finish(exc)
            self.failed = True
            self._settle_usage(produced=True)
            raise
        self._completion_chars += upstream.completion_text_chars
        if upstream.usage is not None:
            self.usage = upstream.usage
            if self._state is not None:
                self._state.reports_usage = True
        else:
            if self._state is not None:
                self._state.reports_usage = False  # count text again next time
            self._settle_usage(produced=True)
        await self._finish(None)

    def _can_retry(self) -> bool:
        return self._attempts_used <= self._service.max_retries

    def _settle_usage(self, *, produced: bool) -> None:
        if produced:
            self.usage = estimated_usage(self._body, self._completion_chars)
        else:
            self.usage = Usage()

    async def _finish(self, error: BaseException | None) -> None:
        """Account for the current upstream once: in-flight, breaker, connection."""
        state, upstream = self._state, self._upstream
        self._state = None
        self._upstream = None
        if upstream is not None:
            await upstream.aclose()
        if state is not None:
            state.load.finished()
            _settle(self._service.router, state, error)

    async def aclose(self) -> None:
        """Called when the relay ends for any reason, including a client disconnect."""
        await self._finish(_ClientGone() if self._state is not None else None)


class _ClientGone(Exception):
    """No verdict on the upstream: the client left before the stream finished."""
