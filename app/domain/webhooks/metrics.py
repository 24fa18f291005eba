"""Webhook delivery figures on ``/metrics``, read at scrape time from the dispatcher's
own counters (nothing extra per attempt)."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from app.domain.webhooks.dispatcher import WebhookDispatcher


class WebhookMetrics(Collector):
    def __init__(self, dispatcher: WebhookDispatcher) -> None:
        self._dispatcher = dispatcher

    def collect(self) -> Iterator[Metric]:
        dispatcher = self._dispatcher
        yield GaugeMetricFamily(
            "arona_webhook_alerts_queued",
            "Threshold alerts held in this process's memory, not yet written as deliveries.",
            value=dispatcher.queued,
        )
        yield CounterMetricFamily(
            "arona_webhook_alerts_dropped",
            "Threshold alerts this process could not queue (the queue was full).",
            value=dispatcher.dropped_alerts,
        )
        attempts = CounterMetricFamily(
            "arona_webhook_attempts",
            "Webhook delivery attempts made by this process, by what they led to: "
            "delivered, retry (due again later) or failed (no attempt left).",
            labels=("result",),
        )
        for result in ("delivered", "retry", "failed"):
            attempts.add_metric((result,), dispatcher.results.get(result, 0))
        yield attempts
