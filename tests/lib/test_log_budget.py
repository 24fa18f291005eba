"""``RepeatBudget``: the first of a kind at once, then one line per interval that says
how many were held back."""

from __future__ import annotations

from app.lib.log_budget import RepeatBudget


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_the_first_occurrence_passes_and_repeats_are_counted_until_the_interval_ends() -> None:
    clock = Clock()
    budget = RepeatBudget(interval=10.0, clock=clock)
    assert budget.admit("a") == 0
    assert [budget.admit("a") for _ in range(5)] == [None] * 5
    clock.now += 9.9
    assert budget.admit("a") is None
    clock.now += 0.1
    assert budget.admit("a") == 6  # the six held back since the last line
    assert budget.admit("a") is None
    clock.now += 10.0
    assert budget.admit("a") == 1


def test_each_key_has_its_own_window() -> None:
    clock = Clock()
    budget = RepeatBudget(interval=10.0, clock=clock)
    assert budget.admit(("POST", "/v1/chat/completions", 502)) == 0
    assert budget.admit(("POST", "/v1/embeddings", 502)) == 0
    assert budget.admit(("POST", "/v1/chat/completions", 500)) == 0
    assert budget.admit(("POST", "/v1/chat/completions", 502)) is None


def test_too_many_keys_start_the_windows_over_instead_of_growing() -> None:
    clock = Clock()
    budget = RepeatBudget(interval=10.0, max_keys=3, clock=clock)
    for key in ("a", "b", "c"):
        assert budget.admit(key) == 0
    assert budget.admit("a") is None
    assert budget.admit("d") == 0  # the table was full: it starts over
    assert budget.admit("a") == 0
    assert len(budget._windows) == 2
