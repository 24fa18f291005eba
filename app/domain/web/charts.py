"""What the console's and the dashboard's server-drawn charts share (their geometry
differs: the console draws value axes, the dashboard labels each bar)."""

from __future__ import annotations


def compact_number(value: float) -> str:
    """``950``, ``1.2k``, ``3.4M``: axis and bar labels stay short."""
    for size, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= size:
            text = f"{value / size:.1f}".rstrip("0").rstrip(".")
            return text + suffix
    return str(int(value))
