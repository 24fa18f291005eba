"""What admission reserves for a call: its token estimate and its dearest cost."""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from uuid import UUID, uuid4

import msgspec

from app.domain.calls.estimate import CallEstimator, CallShape, output_tokens, requested_output
from app.domain.prices.book import PLATFORM, Price, PriceBook, PriceTable
from app.routing.types import RawBody

LONG_AGO = datetime.datetime(2020, 1, 1, tzinfo=datetime.UTC)
FUTURE = datetime.datetime(2999, 1, 1, tzinfo=datetime.UTC)


def body(**fields: object) -> RawBody:
    return {name: msgspec.Raw(msgspec.json.encode(value)) for name, value in fields.items()}


def price(
    model: str,
    backend: str | None = None,
    *,
    output: int = 0,
    input_: int = 0,
    embedding: int | None = None,
    since: datetime.datetime = LONG_AGO,
) -> Price:
    return Price(
        id=uuid4(),
        model=model,
        backend=backend,
        input_micros=input_,
        cached_input_micros=None,
        output_micros=output,
        embedding_micros=embedding,
        currency="USD",
        effective_from=since,
    )


def book_of(tables: dict[UUID, Sequence[Price]]) -> PriceBook:
    async def load(owner: UUID) -> PriceTable:
        return PriceTable(tables.get(owner, ()))

    return PriceBook(load)


def test_the_asked_output_counts_capped_by_the_model() -> None:
    assert requested_output(body(max_tokens=300)) == 300
    assert requested_output(body(max_completion_tokens=200, max_tokens=900)) == 200
    assert requested_output(body(max_tokens="many")) is None
    assert requested_output(body(max_tokens=True)) is None
    assert requested_output(body()) is None
    assert output_tokens(CallShape(body(max_tokens=300), output_cap=256), 1024) == 256
    assert output_tokens(CallShape(body(max_tokens=100), output_cap=256), 1024) == 100
    assert output_tokens(CallShape(body(), output_cap=256), 1024) == 256
    assert output_tokens(CallShape(body()), 1024) == 1024
    assert output_tokens(CallShape(body(max_tokens=50), embedding=True), 1024) == 0


async def test_the_estimate_is_prompt_plus_output_at_the_dearest_backend() -> None:
    prices = book_of(
        {
            PLATFORM: [
                price("m", output=2_000_000),  # 2 per million output tokens
                price("m", "pricey", output=5_000_000),
                price("m", "later", output=9_000_000, since=FUTURE),  # not in force yet
                price("other", output=50_000_000),
            ]
        }
    )
    estimator = CallEstimator(prices, default_output_tokens=1024)
    shape = CallShape(body(messages=[{"role": "user", "content": "x" * 400}], max_tokens=1000))
    estimate = await estimator.estimate(shape, ["m"], uuid4(), is_custom_or_override=False)
    assert estimate.tokens >= 1000 + 100  # 400 characters are ~100 tokens
    assert estimate.cost_micros == 5_000  # 1000 output tokens at the dearest (5/M)


async def test_custom_and_override_calls_take_the_projects_own_prices() -> None:
    project = uuid4()
    prices = book_of({PLATFORM: [price("m", output=9_000_000)], project: [price("m", output=1)]})
    estimator = CallEstimator(prices)
    shape = CallShape(body(messages=[{"role": "user", "content": "hi"}], max_tokens=1_000_000))
    own = await estimator.estimate(shape, ["m"], project, is_custom_or_override=True)
    assert own.cost_micros == 1
    unpriced = await estimator.estimate(shape, ["nobody"], project, is_custom_or_override=False)
    assert unpriced.cost_micros == 0


async def test_embeddings_are_priced_per_input_token() -> None:
    prices = book_of({PLATFORM: [price("e", embedding=1_000_000)]})
    estimator = CallEstimator(prices)
    shape = CallShape(body(input="y" * 4_000), embedding=True)
    estimate = await estimator.estimate(shape, ["e"], uuid4(), is_custom_or_override=False)
    assert estimate.tokens == 1_000
    assert estimate.cost_micros == 1_000


async def test_an_unreadable_price_book_estimates_no_cost() -> None:
    async def broken(owner: UUID) -> PriceTable:
        raise ConnectionError("database down")

    estimator = CallEstimator(PriceBook(broken))
    shape = CallShape(body(messages=[{"role": "user", "content": "hi"}]))
    estimate = await estimator.estimate(shape, ["m"], uuid4(), is_custom_or_override=False)
    assert estimate.cost_micros == 0
    assert estimate.tokens > 1024
