"""Fake upstream servers (OpenAI-compatible, Ollama) for tests, the demo and benchmarks."""

from app.fakes.common import FakeControl, FakeStats, RecordedRequest
from app.fakes.ollama_upstream import FakeOllama
from app.fakes.openai_upstream import FakeOpenAI
from app.fakes.serve import serve_asgi

__all__ = [
    "FakeControl",
    "FakeOllama",
    "FakeOpenAI",
    "FakeStats",
    "RecordedRequest",
    "serve_asgi",
]
