"""The price book's rules without a server: which price applies, exact cost in
integers, amounts parsed and shown exactly, and a table served from memory."""

from __future__ import annotations

import datetime
import uuid

import pytest

from app.domain.calls.metering import CallRecord
from app.domain.prices import amounts
from app.domain.prices.book import PLATFORM, Price, PriceBook, PriceTable
from app.lib.errors import BadRequestError
from app.routing.types import Usage

T0 = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)
HOUR = datetime.timedelta(hours=1)
MINUTE = datetime.timedelta(minutes=1)


def price(
    model: str,
    *,
    backend: str | None = None,
    at: datetime.datetime = T0,
    input_micros: int = 1_000_000,
    output_micros: int = 2_000_000,
    cached: int | None = None,
    embedding: int | None = None,
) -> Price:
    return Price(
        id=uuid.uuid4(),
        model=model,
        backend=backend,
        input_micros=input_micros,
        cached_input_micros=cached,
        output_micros=output_micros,
        embedding_micros=embedding,
        currency="USD",
        effective_from=at,
    )


def test_the_latest_row_not_after_the_moment_is_in_force() -> None:
    old, new, future = price("m"), price("m", at=T0 + HOUR), price("m", at=T0 + 2 * HOUR)
    table = PriceTable([future, old, new])
    assert table.in_force("m", None, T0 - HOUR) is None
    assert table.in_force("m", None, T0) is old
    assert table.in_force("m", None, T0 + HOUR) is new
    assert table.in_force("m", None, T0 + 90 * datetime.timedelta(minutes=1)) is new
    assert table.in_force("m", None, T0 + 2 * HOUR) is future
    assert table.size == 3


def test_a_backends_price_beats_every_model_wide_one_then_names_go_in_order() -> None:
    alias, base, on_b = price("alias"), price("base"), price("base", backend="b")
    table = PriceTable([alias, base, on_b])
    at = T0 + HOUR
    assert table.match(["alias", "profile", "base"], "b", at) is on_b
    assert table.match(["alias", "profile", "base"], "other", at) is alias
    assert table.match(["profile", "base"], None, at) is base
    assert table.match(["nothing"], "b", at) is None


def test_the_dearest_price_follows_prices_taking_effect_while_memoized() -> None:
    """Admission asks the same names on every call (memoized): a price that takes
    effect later, or a moment before the memo's, still decides."""
    usage = Usage(prompt_tokens=1_000_000, completion_tokens=0, estimated=True)
    cheap = price("m", input_micros=1_000_000)
    dear_later = price("m", backend="b", at=T0 + HOUR, input_micros=3_000_000)
    table = PriceTable([cheap, dear_later, price("other", input_micros=9_000_000)])
    assert table.dearest(["m"], usage, T0, embedding=False) == 1_000_000
    assert table.dearest(["m"], usage, T0 + 30 * MINUTE, embedding=False) == 1_000_000
    assert table.dearest(["m"], usage, T0 + HOUR, embedding=False) == 3_000_000
    assert table.dearest(["m"], usage, T0 - HOUR, embedding=False) == 0  # back in time
    assert table.dearest(["m"], usage, T0 + 2 * HOUR, embedding=False) == 3_000_000
    assert table.dearest(["m", "other"], usage, T0 + 2 * HOUR, embedding=False) == 9_000_000
    assert table.dearest(["nothing"], usage, T0 + 2 * HOUR, embedding=False) == 0


def test_cost_is_exact_and_rounded_half_up_in_micro_units() -> None:
    p = price("m", input_micros=1_500_000, output_micros=3_000_001, cached=500_000)
    # 7 uncached x 1.5 + 3 cached x 0.5 + 2 x 3.000001 = 10.5 + 1.5 + 6.000002 = 18.000002
    usage = Usage(prompt_tokens=10, completion_tokens=2, cached_tokens=3)
    assert p.cost_micros(usage, embedding=False) == 18
    half = price("m", input_micros=500_000, output_micros=0)
    assert half.cost_micros(Usage(prompt_tokens=1), embedding=False) == 1  # 0.5 -> 1
    assert half.cost_micros(Usage(prompt_tokens=0), embedding=False) == 0
    # Without a cached price cached tokens cost the input price; embeddings likewise.
    plain = price("m", input_micros=2_000_000, output_micros=0)
    assert plain.cost_micros(Usage(10, 0, cached_tokens=4), embedding=False) == 20
    assert plain.cost_micros(Usage(10, 0), embedding=True) == 20
    embed = price("m", input_micros=2_000_000, embedding=100_000)
    assert embed.cost_micros(Usage(10, 5), embedding=True) == 1
    # A trillion tokens at a large price stays exact (Python integers).
    big = price("m", input_micros=10**15, output_micros=0)
    assert big.cost_micros(Usage(10**12, 0), embedding=False) == 10**21


@pytest.mark.parametrize(
    ("raw", "micros"),
    [("0.15", 150_000), (0.15, 150_000), (2, 2_000_000), ("0.000001", 1), (" 1.5 ", 1_500_000)],
)
def test_amounts_are_read_exactly(raw: str | float, micros: int) -> None:
    assert amounts.micros("input", raw) == micros


@pytest.mark.parametrize("raw", ["-0.01", "0.0000001", "abc", "NaN", "Infinity", "1e20", True])
def test_bad_amounts_name_the_field(raw: str | bool) -> None:
    with pytest.raises(BadRequestError) as caught:
        amounts.micros("output", raw)
    assert caught.value.param == "output"
    assert caught.value.code == "invalid_amount"


def test_amounts_are_shown_as_their_shortest_exact_decimal() -> None:
    assert [amounts.text(n) for n in (0, 1, 150_000, 2_000_000, 1_234_567)] == [
        "0",
        "0.000001",
        "0.15",
        "2",
        "1.234567",
    ]
    assert amounts.label(350_000, "USD") == "0.35 USD"
    assert amounts.label(0, None) == "0"
    assert (
        amounts.label(5, None, estimated=True) == "0.000005 (mixed currencies) (estimated in part)"
    )


async def test_tables_are_read_once_per_owner_and_custom_calls_use_only_the_project() -> None:
    project = uuid.uuid4()
    reads: list[uuid.UUID] = []
    tables = {
        PLATFORM: PriceTable([price("m"), price("custom:x")]),
        project: PriceTable([price("custom:x", input_micros=7_000_000)]),
    }

    async def load(owner: uuid.UUID) -> PriceTable:
        reads.append(owner)
        return tables.get(owner, PriceTable([]))

    book = PriceBook(load)
    at = T0 + HOUR
    for _ in range(3):
        assert await book.price_for("m", "m", None, "b", project, False, at) is not None
    custom = await book.price_for("custom:x", "served", None, None, project, True, at)
    assert custom is not None
    assert custom.input_micros == 7_000_000
    assert await book.price_for("m", "m", None, None, project, True, at) is None
    assert await book.price_for("custom:x", None, None, None, None, True, at) is None
    assert reads == [PLATFORM, project]
    book.invalidate(project)
    await book.price_for("custom:x", None, None, None, project, True, at)
    assert reads == [PLATFORM, project, project]


async def test_a_book_that_cannot_be_read_leaves_calls_unpriced_and_a_stale_table_serves() -> None:
    failing = False

    async def load(owner: uuid.UUID) -> PriceTable:
        if failing:
            raise ConnectionError("database away")
        return PriceTable([price("m")])

    book = PriceBook(load)
    call = CallRecord(endpoint="chat", model_requested="m", usage=Usage(1_000_000, 0))
    assert await book.cost_of(call, T0 + HOUR) == (1_000_000, "USD")
    failing = True
    book.invalidate(PLATFORM)
    # The table held before the change is served while it cannot be read again.
    assert await book.cost_of(call, T0 + HOUR) == (1_000_000, "USD")
    project_call = CallRecord(
        endpoint="chat",
        model_requested="m",
        usage=Usage(10, 0),
        project_id=uuid.uuid4(),
        is_custom=True,
    )
    assert await book.cost_of(project_call, T0 + HOUR) == (None, None)
    unmetered = CallRecord(endpoint="chat", model_requested="m")
    assert await book.cost_of(unmetered, T0 + HOUR) == (None, None)
