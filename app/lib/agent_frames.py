"""The ``/ws/agent`` wire protocol: one JSON object per text frame, tagged by ``type``.

Framework-free (msgspec only): the panel and the reference agent (``app.agent``)
share these definitions. Field names are snake_case, as the agent protocol was
specified.

Agent -> panel::

    {"type": "register", "machine_name", "version", "host", "gpus": [Gpu...]}
    {"type": "heartbeat", "gpus": [Gpu...], "models": ["<model id>"...]}
    {"type": "deploy_progress", "model_id", "progress": 0-100, "message"}
    {"type": "deploy_result", "model_id", "ok", "port", "error"}
    {"type": "stop_result", "model_id", "ok", "error"}

Panel -> agent::

    {"type": "registered", "agent_id", "name"}      (the answer to ``register``)
    {"type": "deploy", "model_id"}
    {"type": "stop", "model_id"}
    {"type": "error", "code", "message"}            (a frame the panel refused)

``register`` must come first. ``heartbeat.models`` lists the models the agent serves
right now; a deployment the panel thinks is running but the agent no longer lists is
marked stopped. An empty ``host`` means "the address you see me connecting from".
Fields a side does not know are ignored (a newer agent may send more); an unknown
``type`` or a known field of the wrong shape is refused with an ``error`` frame.
"""

from __future__ import annotations

from typing import Annotated

import msgspec

MAX_FRAME_BYTES = 256 * 1024
MAX_GPUS = 64
MAX_MODELS = 256

ModelId = Annotated[str, msgspec.Meta(min_length=1, max_length=200, pattern=r"^\S+$")]
ShortText = Annotated[str, msgspec.Meta(max_length=200)]
Message = Annotated[str, msgspec.Meta(max_length=500)]
ErrorText = Annotated[str, msgspec.Meta(max_length=4000)]
Port = Annotated[int, msgspec.Meta(ge=1, le=65535)]
Percent = Annotated[float, msgspec.Meta(ge=0, le=100)]
Megabytes = Annotated[int, msgspec.Meta(ge=0)]


class Gpu(msgspec.Struct):
    index: Annotated[int, msgspec.Meta(ge=0)]
    name: ShortText
    memory_total_mb: Megabytes
    memory_used_mb: Megabytes
    utilization_percent: Percent


Gpus = Annotated[list[Gpu], msgspec.Meta(max_length=MAX_GPUS)]


class _Frame(msgspec.Struct, tag_field="type"):
    """Unknown fields are ignored, so agents and panels of different versions mix."""


# ----------------------------------------------------------------- agent -> panel


class Register(_Frame, tag="register"):
    machine_name: ShortText
    version: Annotated[str, msgspec.Meta(max_length=64)]
    host: Annotated[str, msgspec.Meta(max_length=255)] = ""
    gpus: Gpus = []


class Heartbeat(_Frame, tag="heartbeat"):
    gpus: Gpus = []
    models: Annotated[list[ModelId], msgspec.Meta(max_length=MAX_MODELS)] = []


class DeployProgress(_Frame, tag="deploy_progress"):
    model_id: ModelId
    progress: Annotated[int, msgspec.Meta(ge=0, le=100)]
    message: Message = ""


class DeployResult(_Frame, tag="deploy_result"):
    model_id: ModelId
    ok: bool
    port: Port | None = None
    error: ErrorText | None = None


class StopResult(_Frame, tag="stop_result"):
    model_id: ModelId
    ok: bool
    error: ErrorText | None = None


AgentFrame = Register | Heartbeat | DeployProgress | DeployResult | StopResult

# ----------------------------------------------------------------- panel -> agent


class Registered(_Frame, tag="registered"):
    agent_id: str
    name: str


class Deploy(_Frame, tag="deploy"):
    model_id: ModelId


class Stop(_Frame, tag="stop"):
    model_id: ModelId


class Error(_Frame, tag="error"):
    code: str
    message: str


PanelFrame = Registered | Deploy | Stop | Error
Command = Deploy | Stop

agent_frame_decoder = msgspec.json.Decoder(AgentFrame)
panel_frame_decoder = msgspec.json.Decoder(PanelFrame)
command_decoder = msgspec.json.Decoder(Command)
_encoder = msgspec.json.Encoder()


def encode(frame: msgspec.Struct) -> str:
    return _encoder.encode(frame).decode()


def average_utilization(gpus: list[Gpu]) -> float | None:
    """The mean GPU utilization; None when the agent reports no GPUs (no telemetry)."""
    if not gpus:
        return None
    return sum(g.utilization_percent for g in gpus) / len(gpus)
