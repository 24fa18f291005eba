"""The routing service: select, call, retry, account; streams relay in ``relay.py``.

One entry point per capability. A call that fails before any byte reached the client
is retried on another candidate (at most ``max_retries`` times); breaker verdicts,
cooldowns and in-flight counts are recorded exactly once per attempt, including when
the client goes away mid-stream.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import KW_ONLY, dataclass, field, replace
from typing import TypeVar

import structlog

from app.routing.backends.base import ChatStream, VideoBackend
from app.routing.errors import NoHealthyBackendError, UpstreamError
from app.routing.registry import BackendRegistry, BackendState
from app.routing.relay import RelayedStream
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
from app.routing.verdict import record_verdict

DEFAULT_MAX_RETRIES = 2
logger = structlog.get_logger()
T = TypeVar("T")
FirstTokenListener = Callable[[str, str, float], None]
"""``(model as asked, backend, ttft_ms)`` of a routed stream's first chunk."""

__all__ = [
    "DEFAULT_MAX_RETRIES",
    "CallOutcome",
    "ListedModel",
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


@dataclass(slots=True, eq=False)
class RoutingService:
    registry: BackendRegistry
    router: Router
    _: KW_ONLY
    max_retries: int = DEFAULT_MAX_RETRIES
    clock: Clock = monotonic
    _first_token_listeners: list[FirstTokenListener] = field(default_factory=list, init=False)

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

    async def connect_stream(
        self,
        model: str,
        hints: RouteHints,
        connect: Callable[[Selection], Awaitable[ChatStream]],
        *,
        max_attempts: int,
        target: BackendState | None = None,
    ) -> tuple[ChatStream, int]:
        """Open a chat stream with ``connect`` on selected backends, retrying failures
        to connect within ``max_attempts``; returns the stream and the attempts used.

        The attempt that opened stays counted in flight with no breaker verdict yet:
        the relay ends it with ``end_stream`` once the stream is over.
        """
        return await self._with_retries(
            model,
            "chat",
            hints,
            connect,
            keep_in_flight=True,
            max_attempts=max_attempts,
            target=target,
        )

    def end_stream(self, state: BackendState, error: BaseException | None) -> None:
        """A stream opened by ``connect_stream`` is over: no longer in flight, and its
        verdict (``error`` None for a clean end) goes to the breaker and the cooldown."""
        state.load.finished()
        record_verdict(self.router, state, error)

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
                record_verdict(self.router, state, exc)
                if not exc.retryable or (target is not None and exc.upstream_status is not None):
                    raise
                failures[:] = [exc]
                excluded.add(state.name)
                continue
            except BaseException as exc:
                state.load.finished()
                record_verdict(self.router, state, exc)
                raise
            if not keep_in_flight:
                state.load.finished()
                record_verdict(self.router, state, None)
            return result, attempt
        if not failures:
            raise NoHealthyBackendError(resolved, "retry budget spent")
        raise failures.pop()


def _direct(target: BackendState, model: str) -> Selection:
    """The one backend of a custom LLM; its breaker still fails fast when it is down."""
    if not target.breaker.acquire():
        raise NoHealthyBackendError(model, f"{target.name}: circuit breaker open")
    return Selection(target, target.served_name(model) or model)
