"""A fake MiniMax Open Platform video API: real HTTP, scripted task lifecycles.

Endpoints (Bearer key required when ``api_key`` is set; a missing or wrong key is
answered like MiniMax does, HTTP 200 with ``base_resp.status_code`` 1004):

- ``POST /v1/video_generation`` -> ``{"task_id", "base_resp"}``;
- ``GET /v1/query/video_generation?task_id=`` -> ``{"task_id", "status", "file_id",
  "base_resp"}``; an unknown task is code 2013;
- ``GET /v1/files/retrieve?file_id=`` -> ``{"file": {..., "download_url"}, "base_resp"}``
  whose URL points at the fake itself;
- ``GET /files/{file_id}.mp4`` -> a few bytes of "video" (no key: a signed URL).

A task's lifecycle, one step per poll: ``Preparing``, ``Queueing``, then
``Processing`` for ``processing_polls`` polls, then ``Success`` with a file. Markers in
the prompt (or queued for the next tasks with ``control.next_markers``) change it:

- ``[fail]`` / ``[fail:message]``: ends in ``Fail`` with ``error_message``;
- ``[stuck]``: ``Processing`` forever; ``[slow:N]``: N ``Processing`` polls;
- ``[nofile]``: ``Success`` without a ``file_id``;
- ``[error:CODE]``: the create answers ``base_resp`` CODE (no task is made);
  ``[http500]``, ``[malformed]``: the create answers HTTP 500 / a body that is not JSON;
- ``[poll-error:CODE]``, ``[poll-http500]``, ``[poll-malformed]``: every poll of the
  task fails so (the task does not advance); ``[retrieve-error:CODE]``,
  ``[retrieve-http500]``, ``[retrieve-malformed]``: its file's retrieve fails so. A
  ``*N`` suffix limits a poll or retrieve fault to the first N attempts
  (``[poll-error:1002*2]``).

Switches for every call (``control``, or ``POST /__fake/control`` from another
process): ``fail_status`` (every API call answers that HTTP status), ``create_error``
(every create answers that ``base_resp`` code), ``malformed`` (every API call answers a
body that is not JSON), ``hang`` (calls never answer until released),
``processing_polls``, ``models`` (a create for another model is code 2013; empty
accepts any), ``next_markers`` (markers for the next creates, one entry each; a create
refused by ``create_error`` or ``fail_status`` does not use one).
``fail_code`` puts a ``base_resp`` with that code in the ``fail_status`` answers and
``retry_after`` a ``Retry-After`` header on them (a throttling upstream's 429);
``poll_error`` / ``retrieve_error`` make every poll / retrieve (the probe's poll too)
answer that ``base_resp`` code. ``GET /__fake/stats`` shows the counters.

Requests are recorded (path with query, headers, JSON body), and each task keeps its
poll count, so a test can tell how many times a job was polled.
"""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, NamedTuple
from urllib.parse import parse_qs

import msgspec

from app.fakes.asgi_io import (
    JSON_HEADERS,
    Receive,
    Scope,
    Send,
    parse_json,
    read_body,
    send_bytes,
    send_json,
)
from app.fakes.common import MAX_RECORDED_REQUESTS, RecordedRequest
from app.fakes.minimax_scripts import FakeTask, Fault, script_of

DEFAULT_MODELS = ("MiniMax-Hailuo-02", "T2V-01-Director", "I2V-01")
DURATIONS = (6, 10)
RESOLUTIONS = ("512P", "720P", "768P", "1080P")
VIDEO_BYTES = b"\x00\x00\x00\x18ftypmp42\x00\x00\x00\x00mp42isomfake-video"
AUTH_MESSAGE = "login fail: Please carry the API secret key in the 'Authorization' field"


class _Call(NamedTuple):
    send: Send
    body: dict[str, Any]
    query: dict[str, str]
    host: str
    """The Host the client used: download URLs point back at it."""


class MinimaxControl(msgspec.Struct, forbid_unknown_fields=True):
    """The switches (see the module docstring); ``POST /__fake/control`` patches them."""

    models: list[str]
    processing_polls: int = 2
    fail_status: int | None = None
    fail_code: int | None = None
    retry_after: str | None = None
    create_error: int | None = None
    poll_error: int | None = None
    retrieve_error: int | None = None
    malformed: bool = False
    hang: bool = False
    next_markers: list[str] = msgspec.field(default_factory=list)
    record_requests: bool = True


@dataclass(slots=True)
class MinimaxStats:
    requests: int = 0
    creates: int = 0
    """Tasks created (refused creates not counted)."""
    polls: int = 0
    retrieves: int = 0
    downloads: int = 0
    unauthorized: int = 0
    faults: int = 0
    """Calls answered with a scripted fault or a switch (errors, 500s, bad JSON)."""


class FakeMinimax:
    def __init__(
        self,
        name: str = "fake-minimax",
        *,
        models: Iterable[str] = DEFAULT_MODELS,
        api_key: str | None = None,
        processing_polls: int = 2,
    ) -> None:
        self.name = name
        self.api_key = api_key
        self._defaults = MinimaxControl(models=list(models), processing_polls=processing_polls)
        self.control = self._default_control()
        self.stats = MinimaxStats()
        self.requests: deque[RecordedRequest] = deque(maxlen=MAX_RECORDED_REQUESTS)
        self.tasks: dict[str, FakeTask] = {}
        self._files: dict[str, FakeTask] = {}
        self._release = asyncio.Event()

    # -- test helpers --------------------------------------------------------------

    def reset(self) -> None:
        """Restore the switches, forget tasks, records and counters, free hung calls."""
        self.release()
        self._release = asyncio.Event()
        self.control = self._default_control()
        self.stats = MinimaxStats()
        self.requests.clear()
        self.tasks.clear()
        self._files.clear()

    def release(self) -> None:
        self._release.set()

    def _default_control(self) -> MinimaxControl:
        defaults = self._defaults
        return msgspec.structs.replace(
            defaults, models=list(defaults.models), next_markers=list(defaults.next_markers)
        )

    def requests_for(self, path: str) -> list[RecordedRequest]:
        """Recorded requests whose path (before the query) is ``path``."""
        return [r for r in self.requests if r.path.split("?", 1)[0] == path]

    def task_for(self, prompt_part: str) -> FakeTask | None:
        """The newest task whose prompt contains ``prompt_part``."""
        for task in reversed(list(self.tasks.values())):
            if prompt_part in str(task.body.get("prompt", "")):
                return task
        return None

    def snapshot(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "stats": dataclasses.asdict(self.stats),
            "control": msgspec.structs.asdict(self.control),
            "tasks": {t.task_id: {"polls": t.polls, "model": t.model} for t in self.tasks.values()},
            "recorded": len(self.requests),
        }

    # -- ASGI ---------------------------------------------------------------------------

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        raw = await read_body(receive)
        path: str = scope["path"]
        method: str = scope["method"]
        raw_query: str = scope.get("query_string", b"").decode("latin-1")
        query = {k: v[0] for k, v in parse_qs(raw_query).items()}
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        body = parse_json(raw)
        if path.startswith("/__fake/"):
            await self._control_endpoint(method, path, body, send)
            return
        if method == "GET" and path.startswith("/files/") and path.endswith(".mp4"):
            await self._download(path.removeprefix("/files/").removesuffix(".mp4"), send)
            return
        self.stats.requests += 1
        if self.control.record_requests:
            shown = f"{path}?{raw_query}" if raw_query else path
            self.requests.append(RecordedRequest(shown, headers, body))
        handler = {
            ("POST", "/v1/video_generation"): self._create,
            ("GET", "/v1/query/video_generation"): self._query,
            ("GET", "/v1/files/retrieve"): self._retrieve,
        }.get((method, path))
        if handler is None:
            await send_json(send, 404, {"error": f"no route for {method} {path}"})
            return
        if self.api_key is not None and headers.get("authorization") != f"Bearer {self.api_key}":
            self.stats.unauthorized += 1
            await send_json(send, 200, _resp({}, 1004, AUTH_MESSAGE))
            return
        if self.control.hang:
            await self._release.wait()
            await send_json(send, 503, {"error": "fake released a hung request"})
            return
        if self.control.fail_status is not None:
            self.stats.faults += 1
            code = self.control.fail_code
            answer = {"error": "fake failure"} if code is None else _resp({}, code, "fake failure")
            retry_after = self.control.retry_after
            throttle = () if retry_after is None else ((b"retry-after", retry_after.encode()),)
            encoded = msgspec.json.encode(answer)
            await send_bytes(send, self.control.fail_status, encoded, JSON_HEADERS + throttle)
            return
        if self.control.malformed:
            self.stats.faults += 1
            await send_bytes(send, 200, b"{not json", JSON_HEADERS)
            return
        host = headers.get("host", "127.0.0.1")
        await handler(_Call(send, body if isinstance(body, dict) else {}, query, host))

    async def _create(self, call: _Call) -> None:
        send, body = call.send, call.body
        if self.control.create_error is not None:
            await self._fault_answer(send, Fault("error", self.control.create_error))
            return
        prompt = body.get("prompt")
        markers = self.control.next_markers.pop(0) if self.control.next_markers else ""
        script = script_of(f"{markers} {prompt or ''}", self.control.processing_polls)
        if await self._scripted_fault(send, script.create):
            return
        problem = self._invalid(body)
        if problem is not None:
            await send_json(send, 200, _resp({}, 2013, f"invalid params, {problem}"))
            return
        task_id = uuid.uuid4().hex[:18]
        task = FakeTask(task_id, str(body["model"]), body, script, file_id=uuid.uuid4().hex[:16])
        self.tasks[task_id] = task
        self._files[task.file_id] = task
        self.stats.creates += 1
        await send_json(send, 200, _resp({"task_id": task_id}))

    def _invalid(self, body: dict[str, Any]) -> str | None:
        model = body.get("model")
        if not isinstance(model, str) or (self.control.models and model not in self.control.models):
            return f"model {model!r} is not supported"
        prompt = body.get("prompt")
        if not isinstance(prompt, str) or not prompt.strip():
            return "prompt is required"
        if "duration" in body and body["duration"] not in DURATIONS:
            return f"duration {body['duration']!r} is not supported"
        if "resolution" in body and body["resolution"] not in RESOLUTIONS:
            return f"resolution {body['resolution']!r} is not supported"
        image = body.get("first_frame_image")
        if image is not None and not (
            isinstance(image, str) and image.startswith(("data:image/", "http://", "https://"))
        ):
            return "first_frame_image must be a URL or a data URL"
        return None

    async def _query(self, call: _Call) -> None:
        send = call.send
        self.stats.polls += 1
        task = await self._lookup(call, self.control.poll_error, self.tasks, "task_id", "task")
        if task is None:
            return
        task.polls += 1
        if await self._scripted_fault(send, task.script.poll):
            return
        status = task.status()
        answer: dict[str, Any] = {"task_id": task.task_id, "status": status, "file_id": ""}
        if status == "Success" and not task.script.no_file:
            answer["file_id"] = task.file_id
        if status == "Fail":
            answer["error_message"] = task.script.fail_message
        await send_json(send, 200, _resp(answer))

    async def _retrieve(self, call: _Call) -> None:
        send = call.send
        self.stats.retrieves += 1
        task = await self._lookup(call, self.control.retrieve_error, self._files, "file_id", "file")
        if task is None:
            return
        if await self._scripted_fault(send, task.script.retrieve):
            return
        file = {
            "file_id": task.file_id,
            "bytes": len(VIDEO_BYTES),
            "created_at": int(task.created_at),
            "filename": f"{task.file_id}.mp4",
            "purpose": "video_generation",
            "download_url": f"http://{call.host}/files/{task.file_id}.mp4",
        }
        await send_json(send, 200, _resp({"file": file}))

    async def _lookup(
        self, call: _Call, error: int | None, table: dict[str, FakeTask], param: str, what: str
    ) -> FakeTask | None:
        """The task the query's ``param`` names, or None once answered with the
        switched-on ``error`` or with MiniMax's "not found" (code 2013 under a 200, as
        the real API does)."""
        send = call.send
        if error is not None:
            await self._fault_answer(send, Fault("error", error))
            return None
        task = table.get(call.query.get(param, ""))
        if task is None:
            await send_json(send, 200, _resp({}, 2013, f"invalid params, {what} not found"))
        return task

    async def _download(self, file_id: str, send: Send) -> None:
        if file_id not in self._files:
            await send_json(send, 404, {"error": "no such file"})
            return
        self.stats.downloads += 1
        await send_bytes(send, 200, VIDEO_BYTES, ((b"content-type", b"video/mp4"),))

    async def _scripted_fault(self, send: Send, fault: Fault | None) -> bool:
        """Answer with the prompt's scripted ``fault`` for this step if it fires now;
        True when it did (the step is then answered)."""
        if fault is None or not fault.fires():
            return False
        await self._fault_answer(send, fault)
        return True

    async def _fault_answer(self, send: Send, fault: Fault) -> None:
        self.stats.faults += 1
        if fault.kind == "http500":
            await send_json(send, 500, {"error": "fake internal server error"})
        elif fault.kind == "malformed":
            await send_bytes(send, 200, b"<html>not json", JSON_HEADERS)
        else:
            await send_json(send, 200, _resp({}, fault.code, f"fake error {fault.code}"))

    async def _control_endpoint(self, method: str, path: str, body: Any, send: Send) -> None:
        if method == "GET" and path == "/__fake/stats":
            await send_json(send, 200, self.snapshot())
            return
        if method == "POST" and path == "/__fake/control":
            changes = dict(body) if isinstance(body, dict) else {}
            reset = changes.pop("reset", False) is True
            base = self._default_control() if reset else self.control
            try:
                control = msgspec.convert(
                    {**msgspec.structs.asdict(base), **changes}, MinimaxControl
                )
            except msgspec.ValidationError as exc:
                await send_json(send, 400, {"error": str(exc)})
                return
            if reset:
                self.reset()
            self.control = control
            await send_json(send, 200, self.snapshot())
            return
        await send_json(send, 404, {"error": "unknown control endpoint"})


def _resp(fields: dict[str, Any], code: int = 0, message: str = "success") -> dict[str, Any]:
    return {**fields, "base_resp": {"status_code": code, "status_msg": message}}
