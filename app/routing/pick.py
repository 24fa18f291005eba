"""The lowest score wins; near-ties share the load in turn.

Scores within ``margin`` of the lowest are ties: the ``turn``-th of them (in a stable
order) is chosen, so two engines a fraction of a request apart both get traffic rather
than one getting every request until a scrape says otherwise. ``turn`` is a counter
the caller advances once per decision.
"""

from __future__ import annotations

from collections.abc import Sequence


def near_ties(scores: Sequence[float], margin: float) -> list[int]:
    """Indexes of the scores within ``margin`` of the lowest, in index order."""
    lowest = min(scores)
    return [i for i, value in enumerate(scores) if value <= lowest + margin]


def pick_lowest(scores: Sequence[float], turn: int, *, margin: float) -> int:
    ties = near_ties(scores, margin)
    return ties[turn % len(ties)]
