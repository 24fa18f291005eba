"""vLLM servers: OpenAI-compatible, plus load read from their Prometheus ``/metrics``."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from urllib.parse import urlsplit, urlunsplit

from app.lib.http import UpstreamHttp
from app.routing.backends.openai import OpenAICompatibleBackend
from app.routing.backends.transport import probe_get
from app.routing.types import BackendSpec


def metrics_url(base_url: str) -> str:
    """vLLM serves ``/metrics`` at the server root, whatever API path the base names."""
    parts = urlsplit(base_url.strip())
    return urlunsplit((parts.scheme, parts.netloc, "/metrics", "", ""))


class VllmBackend(OpenAICompatibleBackend):
    kind = "vllm"

    def __init__(self, spec: BackendSpec, http: UpstreamHttp) -> None:
        super().__init__(spec, http)
        self._metrics_url = metrics_url(spec.url)

    def metrics_source(self) -> Callable[[], Awaitable[str]]:
        return self.scrape_metrics

    async def scrape_metrics(self) -> str:
        """The exposition text; raises ``MetricsUnavailableError`` with the reason."""
        answer = await probe_get(self._http, self._metrics_url, self._auth)
        if isinstance(answer, str):
            raise MetricsUnavailableError(answer)
        if answer.status != 200:
            raise MetricsUnavailableError(f"metrics status {answer.status}")
        return answer.body.decode("utf-8", errors="replace")


class MetricsUnavailableError(Exception):
    pass
