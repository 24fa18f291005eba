"""One attempt's verdict on a backend: what the breaker and the cooldown learn from it.

Shared by complete calls (``service.py``) and relayed streams (``relay.py``), which
settle their attempt only when the stream ends.
"""

from __future__ import annotations

from app.routing.breaker import BreakerState
from app.routing.errors import StreamInterruptedError, UpstreamError
from app.routing.registry import BackendState
from app.routing.router import Router


def record_verdict(router: Router, state: BackendState, error: BaseException | None) -> None:
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
