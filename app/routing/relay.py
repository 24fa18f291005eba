"""The client-facing relay of a routed chat stream (``RoutingService.open_chat_stream``).

It opens the upstream through the service's public retry step (``connect_stream``),
holds the first chunk until the upstream proved it can answer, and accounts for the
attempt exactly once when the stream ends (``end_stream``), including when the client
goes away mid-stream.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import replace
from typing import TYPE_CHECKING

from app.routing.backends.base import ChatStream
from app.routing.errors import NoHealthyBackendError, StreamInterruptedError, UpstreamError
from app.routing.registry import BackendState
from app.routing.router import Selection
from app.routing.types import RawBody, RouteHints, UpstreamCall, Usage
from app.routing.usage import estimated_usage

if TYPE_CHECKING:
    from app.routing.service import RoutingService


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
        cuts: list[StreamInterruptedError] = []  # popped when raised: no reference cycle
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

        service = self._service
        upstream, attempts = await service.connect_stream(
            self._model,
            hints,
            run_and_note,
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
            self._service.end_stream(state, error)

    async def aclose(self) -> None:
        """Called when the relay ends for any reason, including a client disconnect."""
        await self._finish(_ClientGone() if self._state is not None else None)


class _ClientGone(Exception):
    """No verdict on the upstream: the client left before the stream finished."""
