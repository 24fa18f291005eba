"""A fake vLLM server: the OpenAI-compatible fake plus a Prometheus ``/metrics`` page.

Tests and the demo set its load directly: ``running``, ``waiting``, ``kv_cache`` (per
engine), ``engines`` (how many ``engine`` label values the gauges are split over),
``old_names`` (``vllm:gpu_cache_usage_perc`` instead of ``vllm:kv_cache_usage_perc``)
and ``metrics_status`` (answer ``/metrics`` with that error status instead).
"""

from __future__ import annotations

from collections.abc import Iterable

from app.fakes.asgi_io import send_bytes
from app.fakes.common import FakeRequest
from app.fakes.openai_upstream import FakeOpenAI

PROMETHEUS_CONTENT_TYPE = [(b"content-type", b"text/plain; version=0.0.4; charset=utf-8")]


class FakeVllm(FakeOpenAI):
    def __init__(
        self,
        name: str = "fake-vllm",
        *,
        models: Iterable[str] = ("qwen3-8b",),
        chunks: int = 5,
    ) -> None:
        super().__init__(name, models=models, chunks=chunks)
        self.running = 0.0
        self.waiting = 0.0
        self.kv_cache = 0.0
        self.engines = 1
        self.old_names = False
        self.metrics_status: int | None = None
        self.metrics_scrapes = 0
        self.route("GET", "/metrics", self._metrics)

    def metrics_text(self) -> str:
        model = self.control.models[0] if self.control.models else "model"
        cache_name = "vllm:gpu_cache_usage_perc" if self.old_names else "vllm:kv_cache_usage_perc"
        lines: list[str] = []
        for name, total in (
            ("vllm:num_requests_running", self.running),
            ("vllm:num_requests_waiting", self.waiting),
        ):
            lines.append(f"# TYPE {name} gauge")
            share = total / self.engines
            for engine in range(self.engines):
                lines.append(f'{name}{{engine="{engine}",model_name="{model}"}} {share}')
        lines.append(f"# TYPE {cache_name} gauge")
        for engine in range(self.engines):
            lines.append(f'{cache_name}{{engine="{engine}",model_name="{model}"}} {self.kv_cache}')
        return "\n".join(lines) + "\n"

    async def _metrics(self, request: FakeRequest) -> None:
        self.metrics_scrapes += 1
        if self.metrics_status is not None:
            await send_bytes(request.send, self.metrics_status, b"metrics unavailable", [])
            return
        await send_bytes(request.send, 200, self.metrics_text().encode(), PROMETHEUS_CONTENT_TYPE)
