"""Bar charts drawn on the server: the geometry of an inline <svg>, no script.

The templates (``console/partials/charts.html``) turn a chart into ``<rect
class="bar">`` elements with x/y/width/height attributes, axis lines and labels, each
bar with a ``<title>`` (its exact value); the stylesheet colours them. The numbers
beside the chart are in a table, which is also what screen readers get.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from app.domain.web.charts import compact_number

WIDTH = 640
HEIGHT = 240
LEFT = 48  # room for the value axis labels
RIGHT = 8
TOP = 12
BOTTOM = 28  # room for the category labels
MAX_LABELS = 8
LABEL_WIDTH = 150  # horizontal charts: room for the category names
ROW_HEIGHT = 26
RIGHT_H = 20  # horizontal charts: room for the last value label


@dataclass(frozen=True, slots=True)
class Bar:
    x: float
    y: float
    width: float
    height: float
    label: str
    value: int
    title: str

    @classmethod
    def of(
        cls, label: str, value: int, unit: str, *, x: float, y: float, width: float, height: float
    ) -> Bar:
        """The bar of ``value``, titled with it exactly."""
        title = f"{label}: {value:,} {unit}"
        return cls(x=x, y=y, width=width, height=height, label=label, value=value, title=title)


@dataclass(frozen=True, slots=True)
class Tick:
    position: float
    """y of a horizontal grid line (vertical charts), x of a vertical one (horizontal)."""
    label: str


@dataclass(frozen=True, slots=True)
class Label:
    x: float
    y: float
    text: str


@dataclass(frozen=True, slots=True)
class Chart:
    width: int
    height: int
    left: float
    top: float
    right: float
    bottom: float
    bars: tuple[Bar, ...]
    ticks: tuple[Tick, ...]
    labels: tuple[Label, ...]
    horizontal: bool = False

    @property
    def empty(self) -> bool:
        return not any(b.value for b in self.bars)


def nice_ceiling(value: int) -> int:
    """The smallest of 1, 2, 2.5, 5 times a power of ten that is >= ``value``."""
    if value <= 0:
        return 1
    power = int(10 ** math.floor(math.log10(value)))
    for step in (1, 2, 2.5, 5):
        candidate = step * power
        if candidate >= value and candidate == int(candidate):
            return int(candidate)
    return 10 * power


def _round_step(step: int) -> bool:
    """1, 2 or 5 times a power of ten."""
    while step >= 10 and step % 10 == 0:
        step //= 10
    return step in (1, 2, 5)


def _value_ticks(top_value: int) -> list[tuple[float, str]]:
    """(fraction of the axis, label) of the value axis' grid lines: an even split of
    ``top_value`` into whole steps."""
    whole = [n for n in (4, 5, 3, 2, 1) if top_value % n == 0]
    count = next((n for n in whole if _round_step(top_value // n)), whole[0])
    return [(i / count, compact_number(top_value * i // count)) for i in range(count + 1)]


def _ticks(top_value: int, origin: float, span: float) -> tuple[Tick, ...]:
    """The grid lines of the value axis, which runs from ``origin`` over ``span``."""
    return tuple(
        Tick(position=round(origin + span * fraction, 2), label=text)
        for fraction, text in _value_ticks(top_value)
    )


def column_chart(
    points: Sequence[tuple[str, int]], *, unit: str, short_labels: Sequence[str] | None = None
) -> Chart:
    """Vertical bars, one per point, in order (days, oldest first)."""
    plot_w = WIDTH - LEFT - RIGHT
    plot_h = HEIGHT - TOP - BOTTOM
    base = TOP + plot_h
    top_value = nice_ceiling(max((v for _, v in points), default=0))
    slot = plot_w / max(1, len(points))
    gap = min(4.0, slot * 0.2)
    bars: list[Bar] = []
    for i, (label, value) in enumerate(points):
        height = plot_h * value / top_value
        bars.append(
            Bar.of(
                label,
                value,
                unit,
                x=round(LEFT + i * slot + gap / 2, 2),
                y=round(base - height, 2),
                width=round(max(1.0, slot - gap), 2),
                height=round(height, 2),
            )
        )
    names = list(short_labels) if short_labels is not None else [p[0] for p in points]
    every = max(1, math.ceil(len(points) / MAX_LABELS))
    labels = tuple(
        Label(x=round(LEFT + i * slot + slot / 2, 2), y=HEIGHT - 8, text=names[i])
        for i in range(0, len(points), every)
    )
    return Chart(
        width=WIDTH,
        height=HEIGHT,
        left=LEFT,
        top=TOP,
        right=WIDTH - RIGHT,
        bottom=base,
        bars=tuple(bars),
        ticks=_ticks(top_value, base, -plot_h),
        labels=labels,
    )


def bar_chart(points: Sequence[tuple[str, int]], *, unit: str) -> Chart:
    """Horizontal bars, one row per point (models, busiest first)."""
    rows = max(1, len(points))
    height = TOP + rows * ROW_HEIGHT + BOTTOM
    plot_w = WIDTH - LABEL_WIDTH - RIGHT_H
    top_value = nice_ceiling(max((v for _, v in points), default=0))
    bars: list[Bar] = []
    labels: list[Label] = []
    for i, (label, value) in enumerate(points):
        y = TOP + i * ROW_HEIGHT
        bars.append(
            Bar.of(
                label,
                value,
                unit,
                x=LABEL_WIDTH,
                y=y + 4,
                width=round(plot_w * value / top_value, 2),
                height=ROW_HEIGHT - 8,
            )
        )
        shown = label if len(label) <= 22 else label[:21] + "…"
        labels.append(Label(x=LABEL_WIDTH - 6, y=y + ROW_HEIGHT / 2 + 4, text=shown))
    bottom = TOP + rows * ROW_HEIGHT
    return Chart(
        width=WIDTH,
        height=height,
        left=LABEL_WIDTH,
        top=TOP,
        right=WIDTH - RIGHT_H,
        bottom=bottom,
        bars=tuple(bars),
        ticks=_ticks(top_value, LABEL_WIDTH, plot_w),
        labels=tuple(labels),
        horizontal=True,
    )
