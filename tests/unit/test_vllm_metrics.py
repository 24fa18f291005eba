"""vLLM load parsing, scoring and the fresh / stale / expired metrics cache."""

from __future__ import annotations

import asyncio

import pytest

from app.routing.load import BackendLoad, Reading, seed_score
from app.routing.vllm_metrics import (
    MetricsFormatError,
    VllmLoad,
    VllmMetricsCache,
    parse_vllm_metrics,
)
from tests.support.routing_fakes import FakeClock

NEW_NAMES = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="qwen"} 3.0
vllm:num_requests_running{engine="1",model_name="qwen"} 2.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="qwen"} 1.0
vllm:num_requests_waiting{engine="1",model_name="qwen"} 0.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="qwen"} 0.25
vllm:kv_cache_usage_perc{engine="1",model_name="qwen"} 0.75
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{model_name="qwen"} 1234.0
"""

OLD_NAMES = """\
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="llama"} 4.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name="llama"} 2.0
# TYPE vllm:gpu_cache_usage_perc gauge
vllm:gpu_cache_usage_perc{model_name="llama"} 0.5
# TYPE vllm:cpu_cache_usage_perc gauge
vllm:cpu_cache_usage_perc{model_name="llama"} 0.1
"""


def test_counts_are_summed_across_engines_and_cache_is_the_fullest_engine() -> None:
    assert parse_vllm_metrics(NEW_NAMES) == VllmLoad(5.0, 1.0, 0.75, None)


def test_older_metric_names_are_understood() -> None:
    assert parse_vllm_metrics(OLD_NAMES) == VllmLoad(4.0, 2.0, 0.5, 0.1)


def test_samples_of_other_models_are_ignored_when_a_model_is_given() -> None:
    both = NEW_NAMES + 'vllm:num_requests_running{engine="0",model_name="other"} 40.0\n'
    assert parse_vllm_metrics(both, model="qwen").running == 5.0
    assert parse_vllm_metrics(both).running == 45.0


@pytest.mark.parametrize(
    "text",
    ["", "# TYPE up gauge\nup 1\n", "<html>not metrics</html>", "vllm:num_requests_running{ 1"],
)
def test_text_without_vllm_gauges_is_a_format_error(text: str) -> None:
    with pytest.raises(MetricsFormatError):
        parse_vllm_metrics(text)


def test_finished_requests_are_summed_over_their_reasons() -> None:
    text = NEW_NAMES + (
        "# TYPE vllm:request_success_total counter\n"
        'vllm:request_success_total{finished_reason="stop",model_name="qwen"} 7.0\n'
        'vllm:request_success_total{finished_reason="length",model_name="qwen"} 3.0\n'
    )
    load = parse_vllm_metrics(text)
    assert load.finished_total == 10.0
    assert load.reading() == Reading(5.0, 1.0, 0.75, 10.0)


class Endpoint:
    """A scrape target whose answers the test sets; counts the scrapes."""

    def __init__(self, text: str = NEW_NAMES) -> None:
        self.text = text
        self.calls = 0
        self.fail: Exception | None = None
        self.gate: asyncio.Event | None = None

    async def scrape(self) -> str:
        self.calls += 1
        if self.gate is not None:
            await self.gate.wait()
        if self.fail is not None:
            raise self.fail
        return self.text


async def test_fresh_readings_are_used_without_scraping() -> None:
    clock, endpoint = FakeClock(), Endpoint()
    cache = VllmMetricsCache(clock=clock)
    assert await cache.load("a", endpoint.scrape, BackendLoad()) == VllmLoad(5.0, 1.0, 0.75)
    clock.advance(1.9)
    for _ in range(5):
        assert (await cache.load("a", endpoint.scrape, BackendLoad())) is not None
    assert endpoint.calls == 1


async def test_stale_readings_are_used_while_exactly_one_refresh_runs() -> None:
    clock, endpoint = FakeClock(), Endpoint()
    cache = VllmMetricsCache(clock=clock)
    await cache.load("a", endpoint.scrape, BackendLoad())
    clock.advance(5)
    endpoint.text = OLD_NAMES
    endpoint.gate = asyncio.Event()
    stale = await asyncio.gather(
        *(cache.load("a", endpoint.scrape, BackendLoad()) for _ in range(10))
    )
    assert all(load == VllmLoad(5.0, 1.0, 0.75) for load in stale)
    assert endpoint.calls == 2  # one background refresh for ten callers
    endpoint.gate.set()
    await asyncio.sleep(0.01)
    assert await cache.load("a", endpoint.scrape, BackendLoad()) == VllmLoad(4.0, 2.0, 0.5, 0.1)


async def test_expired_readings_count_as_unavailable_and_never_block_long() -> None:
    clock, endpoint = FakeClock(), Endpoint()
    cache = VllmMetricsCache(clock=clock, wait_seconds=0.01)
    await cache.load("a", endpoint.scrape, BackendLoad())
    clock.advance(10.5)
    endpoint.gate = asyncio.Event()  # the endpoint hangs
    assert await cache.load("a", endpoint.scrape, BackendLoad()) is None
    endpoint.gate.set()
    await asyncio.sleep(0.01)
    assert await cache.load("a", endpoint.scrape, BackendLoad()) == VllmLoad(5.0, 1.0, 0.75)


async def test_a_failing_endpoint_ages_into_unavailable_and_says_why() -> None:
    clock, endpoint = FakeClock(), Endpoint()
    cache = VllmMetricsCache(clock=clock)
    await cache.load("a", endpoint.scrape, BackendLoad())
    endpoint.fail = ConnectionRefusedError("connection refused")
    clock.advance(3)
    assert await cache.load("a", endpoint.scrape, BackendLoad()) is not None  # stale, still used
    await asyncio.sleep(0)
    assert cache.last_error("a") == "connection refused"
    clock.advance(8)
    assert await cache.load("a", endpoint.scrape, BackendLoad()) is None
    endpoint.fail = None
    endpoint.text = "<html>oops</html>"
    clock.advance(1)
    assert await cache.load("a", endpoint.scrape, BackendLoad()) is None
    assert "not Prometheus text" in cache.last_error("a")


async def test_never_read_backend_waits_briefly_for_its_first_scrape() -> None:
    endpoint = Endpoint()
    cache = VllmMetricsCache(clock=FakeClock())
    assert await cache.load("new", endpoint.scrape, BackendLoad()) == VllmLoad(5.0, 1.0, 0.75)
    cache.forget("new")
    endpoint.gate = asyncio.Event()
    quick = VllmMetricsCache(clock=FakeClock(), wait_seconds=0.01)
    assert await quick.load("new", endpoint.scrape, BackendLoad()) is None
    endpoint.gate.set()
    await asyncio.sleep(0.01)  # let the late scrape land before the test ends


async def test_routing_refreshes_busy_backends_more_often_and_feeds_their_load() -> None:
    clock, endpoint = FakeClock(), Endpoint()
    cache = VllmMetricsCache(clock=clock, busy_seconds=0.25, fresh_seconds=2.0)
    load = BackendLoad()
    await cache.prepare("a", endpoint.scrape, load)  # never read: waits for it
    assert load.reading == Reading(5.0, 1.0, 0.75, None)
    assert load.read_at == clock.now
    # The reading shows requests: busy, refreshed after a quarter of a second...
    clock.advance(0.2)
    await cache.prepare("a", endpoint.scrape, load)
    assert endpoint.calls == 1
    clock.advance(0.1)
    load.dispatched()  # sent between the scrape's start and its answer
    await cache.prepare("a", endpoint.scrape, load)
    await asyncio.sleep(0)
    assert endpoint.calls == 2
    estimate = load.estimate()
    assert estimate is not None
    assert estimate.added == 0  # the scrape started after it was sent: it is in it
    # ...while an idle one waits two seconds.
    endpoint.text = NEW_NAMES.replace(" 3.0", " 0.0").replace(" 2.0", " 0.0")
    endpoint.text = endpoint.text.replace(" 1.0", " 0.0")
    idle = BackendLoad()
    await cache.prepare("b", endpoint.scrape, idle)
    clock.advance(1.0)
    await cache.prepare("b", endpoint.scrape, idle)
    assert cache.scrapes("b") == 1
    clock.advance(1.1)
    await cache.prepare("b", endpoint.scrape, idle)
    assert cache.scrapes("b") == 2


async def test_an_expired_reading_makes_the_backend_unavailable_to_routing() -> None:
    clock, endpoint = FakeClock(), Endpoint()
    cache = VllmMetricsCache(clock=clock, wait_seconds=0.01)
    load = BackendLoad()
    await cache.prepare("a", endpoint.scrape, load)
    assert load.estimate() is not None
    endpoint.gate = asyncio.Event()  # hangs from now on
    clock.advance(10.5)
    await cache.prepare("a", endpoint.scrape, load)
    assert load.estimate() is None
    endpoint.gate.set()
    await asyncio.sleep(0.01)
    assert load.estimate() is not None


async def test_a_reading_a_page_asked_for_feeds_the_routing_estimate() -> None:
    # The dashboard may be the first to read a backend nobody routed to yet: its
    # score must be the reading's, not the "metrics unavailable" penalty.
    cache, endpoint, target = VllmMetricsCache(clock=FakeClock()), Endpoint(), BackendLoad()
    await cache.load("a", endpoint.scrape, target)
    assert seed_score(target.estimate()) == 5 + 10 * 1
