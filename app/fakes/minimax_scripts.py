"""Scripted lifecycles of the fake MiniMax server's tasks (``app.fakes.minimax_upstream``):
the markers a prompt carries (``[fail]``, ``[stuck]``, ``[slow:N]``, ``[poll-error:1002*2]``,
...) turned into a ``Script``, and a ``FakeTask`` that walks it one poll at a time."""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from typing import Any

_MARKER = re.compile(r"\[([a-z0-9-]+)(?::([^\]*]*))?(?:\*(\d+))?\]")


@dataclass(slots=True)
class Fault:
    """How one step answers instead of normally: ``error`` (a ``base_resp`` code),
    ``http500`` or ``malformed``; ``times`` None means every time."""

    kind: str
    code: int = 0
    times: int | None = None

    def fires(self) -> bool:
        if self.times is None:
            return True
        if self.times <= 0:
            return False
        self.times -= 1
        return True


@dataclass(slots=True)
class Script:
    processing_polls: int
    fail_message: str | None = None
    stuck: bool = False
    no_file: bool = False
    create: Fault | None = None
    poll: Fault | None = None
    retrieve: Fault | None = None


@dataclass(slots=True)
class FakeTask:
    task_id: str
    model: str
    body: dict[str, Any]
    script: Script
    file_id: str
    polls: int = 0
    """Polls answered for this task (faulted ones included)."""
    step: int = 0
    """Where the lifecycle stands: polls answered normally."""
    created_at: float = field(default_factory=time.time)

    def status(self) -> str:
        """The status of the current poll, then advance."""
        step = self.step
        self.step += 1
        if step == 0:
            return "Preparing"
        if step == 1:
            return "Queueing"
        if self.script.stuck or step < 2 + self.script.processing_polls:
            return "Processing"
        return "Fail" if self.script.fail_message is not None else "Success"


def script_of(text: str, processing_polls: int) -> Script:
    """The lifecycle the markers in ``text`` ask for (see the module docstring)."""
    script = Script(processing_polls=processing_polls)
    for name, arg, count in _MARKER.findall(text):
        times = int(count) if count else None
        if name == "fail":
            script.fail_message = arg or "fake generation failed"
        elif name == "stuck":
            script.stuck = True
        elif name == "slow" and arg.isdigit():
            script.processing_polls = int(arg)
        elif name == "nofile":
            script.no_file = True
        elif name in ("error", "http500", "malformed"):
            script.create = _fault(name, arg, None)
        elif name.startswith("poll-"):
            script.poll = _fault(name.removeprefix("poll-"), arg, times)
        elif name.startswith("retrieve-"):
            script.retrieve = _fault(name.removeprefix("retrieve-"), arg, times)
    return script


def _fault(kind: str, arg: str, times: int | None) -> Fault | None:
    if kind == "error":
        return Fault("error", int(arg), times) if arg.isdigit() else None
    if kind in ("http500", "malformed"):
        return Fault(kind, 0, times)
    return None
