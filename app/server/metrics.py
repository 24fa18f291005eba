"""Prometheus metrics, in a registry owned by the app (no process-global registry)."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest


class HttpMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self._requests = Counter(
            "arona_http_requests_total",
            "HTTP requests by route template and status.",
            ("method", "route", "status"),
            registry=self.registry,
        )
        self._latency = Histogram(
            "arona_http_request_duration_seconds",
            "HTTP request latency by route template and status.",
            ("method", "route", "status"),
            registry=self.registry,
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
        )
        # ``labels()`` validates and locks on every call; the label sets are few
        # (route templates, not paths), so their children are looked up once.
        self._children: dict[tuple[str, str, int], tuple[Any, Any]] = {}

    def observe(self, method: str, route: str, status: int, seconds: float) -> None:
        key = (method, route, status)
        children = self._children.get(key)
        if children is None:
            label = str(status)
            children = (
                self._requests.labels(method, route, label),
                self._latency.labels(method, route, label),
            )
            self._children[key] = children
        children[0].inc()
        children[1].observe(seconds)

    def observed(self) -> set[tuple[str, str, int]]:
        """Every (method, route template, status) answered so far."""
        return set(self._children)

    def render(self) -> bytes:
        return generate_latest(self.registry)
