"""Fake upstream servers (OpenAI-compatible, vLLM, Ollama) for tests, the demo and benchmarks."""

from app.fakes.common import FakeControl, FakeStats, RecordedRequest
from app.fakes.ollama_upstream import FakeOllama
from app.fakes.openai_upstream import FakeOpenAI
from app.fakes.serve import serve_asgi
from app.fakes.vllm_upstream import FakeVllm

__all__ = [
    "FakeControl",
    "FakeOllama",
    "FakeOpenAI",
    "FakeStats",
    "FakeVllm",
    "RecordedRequest",
    "serve_asgi",
]
