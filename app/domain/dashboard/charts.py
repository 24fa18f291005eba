"""Bar charts as server-rendered SVG: geometry here, markup in
``dashboard/partials/chart.html``. No script, no inline style: sizes are SVG
attributes and colours come from the stylesheet (``svg.chart .bar``), so the pages'
Content-Security-Policy holds. Every chart has a title and a description for screen
readers, and each bar a ``<title>`` with its exact value; the same figures are in a
table next to it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from app.domain.web.charts import compact_number

MAX_LABEL = 24


@dataclass(frozen=True, slots=True)
class Bar:
    label: str
    """Full label (in the bar's tooltip)."""
    short: str
    """Label as drawn, shortened to fit."""
    value: int
    shown: str
    x: float
    y: float
    width: float
    height: float
    label_x: float
    label_y: float
    value_x: float
    value_y: float


@dataclass(frozen=True, slots=True)
class Chart:
    id: str
    title: str
    kind: str
    """``rows`` (horizontal bars, one per label) or ``columns`` (a time series)."""
    width: int
    height: int
    bars: tuple[Bar, ...]
    axis: tuple[float, float, float, float]

    @property
    def empty(self) -> bool:
        return not any(bar.value for bar in self.bars)

    @property
    def description(self) -> str:
        """The chart's figures for screen readers (its ``<desc>``)."""
        return ", ".join(f"{bar.label}: {bar.value}" for bar in self.bars) or "no data"


def _short(label: str, limit: int = MAX_LABEL) -> str:
    return label if len(label) <= limit else label[: limit - 1] + "…"


def _r(value: float) -> float:
    return round(value, 1)


def bar_rows(
    chart_id: str,
    title: str,
    data: Sequence[tuple[str, int]],
    *,
    width: int = 640,
    row_height: int = 26,
    label_width: int = 190,
    value_width: int = 64,
) -> Chart:
    """One horizontal bar per label, longest first as given."""
    top = max((value for _, value in data), default=0) or 1
    span = width - label_width - value_width
    bars = []
    for index, (label, value) in enumerate(data):
        y = index * row_height + 4
        length = span * value / top
        bars.append(
            Bar(
                label=label,
                short=_short(label),
                value=value,
                shown=compact_number(value),
                x=label_width,
                y=y,
                width=_r(max(length, 1.0 if value else 0.0)),
                height=row_height - 8,
                label_x=label_width - 8,
                label_y=_r(y + row_height / 2),
                value_x=_r(label_width + length + 6),
                value_y=_r(y + row_height / 2),
            )
        )
    height = max(len(data), 1) * row_height + 8
    return Chart(
        id=chart_id,
        title=title,
        kind="rows",
        width=width,
        height=height,
        bars=tuple(bars),
        axis=(label_width, 0, label_width, height),
    )


def columns(
    chart_id: str,
    title: str,
    data: Sequence[tuple[str, int]],
    *,
    width: int = 640,
    height: int = 220,
    bottom: int = 28,
    top_margin: int = 18,
) -> Chart:
    """One column per point of a series (days), labels under every few columns."""
    peak = max((value for _, value in data), default=0) or 1
    slot = width / max(len(data), 1)
    plot = height - bottom - top_margin
    every = max(1, round(len(data) / 8))
    bars = []
    for index, (label, value) in enumerate(data):
        tall = plot * value / peak
        x = index * slot
        bars.append(
            Bar(
                label=label,
                short=label if index % every == 0 else "",
                value=value,
                shown=compact_number(value) if value else "",
                x=_r(x + slot * 0.15),
                y=_r(top_margin + plot - tall),
                width=_r(slot * 0.7),
                height=_r(tall),
                label_x=_r(x + slot / 2),
                label_y=height - 8,
                value_x=_r(x + slot / 2),
                value_y=_r(top_margin + plot - tall - 4),
            )
        )
    baseline = top_margin + plot
    return Chart(
        id=chart_id,
        title=title,
        kind="columns",
        width=width,
        height=height,
        bars=tuple(bars),
        axis=(0, baseline, width, baseline),
    )
