"""Figures and Markdown tables of the routing benchmark.

Every row, simulated or live, is reduced to one ``Fate`` per arrival, read from the
engine's own record of the request (engine seconds):

- queue wait: from reaching the engine to its first admission into the batch; a
  request abandoned while still queued counts the time until it was abandoned;
- TTFT: from reaching the engine to its first token; an abandoned request counts as
  ``FIRST_TOKEN_DEADLINE`` (so a p99 of 30.0 means at least 1 % timed out);
- timeouts: requests abandoned at the deadline without a first token (the client
  disconnected and the engine dropped them); errors: any other failure (live only);
- share: requests per engine; same engine as previous: consecutive arrivals (in
  arrival order) that went to the same engine, a sign of herding when far above
  what the shares alone give (the sum of the squared shares);
- gateway CPU: user + system time of every Arona process over the run, per request;
- scrapes: ``/metrics`` requests each engine answered, per backend and engine second.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from bench.routing.live import LiveRun
from bench.routing.simulate import Outcome
from bench.routing.workload import FIRST_TOKEN_DEADLINE

RESULTS_DIR = Path(__file__).resolve().parent.parent / "results"
TARGET_RATIO = 1.2
ABSOLUTE_SLACK = 0.05
"""Engine seconds under which a p99 difference is not a miss (a few engine steps):
when the oracle's p99 is itself a few milliseconds, a ratio says nothing."""
SEED_ORACLE = "oracle (seed score, fresh)"
CAPACITY_ORACLE = "oracle (capacity-aware, fresh)"
LEAST_IN_FLIGHT = "least-in-flight"
LIVE_DIRECT = "live, no gateway"


@dataclass(frozen=True, slots=True)
class Fate:
    engine: int | None
    queue_wait: float | None
    ttft: float | None
    """None: timed out or failed."""
    timed_out: bool = False
    error: bool = False


@dataclass(slots=True)
class Row:
    label: str
    source: str
    """``sim`` (virtual time), ``live`` (through Arona), ``live, no gateway``."""
    family: str | None
    """``seed`` or ``capacity``: the oracle this row is held against."""
    engines: list[str]
    fates: list[Fate]
    scrapes_per_second: float | None = None
    """Per backend, per engine second."""
    scrapes_per_wall_second: float | None = None
    cpu_ms_per_request: float | None = None
    live: LiveRun | None = None

    @property
    def key(self) -> str:
        return f"{self.label} [{self.source}]"


@dataclass(slots=True)
class Cell:
    pool: str
    load: float
    seed: int
    arrivals: int
    rate: float
    rows: list[Row] = field(default_factory=list)

    def find(self, label: str, source: str = "sim") -> Row | None:
        for row in self.rows:
            if row.label == label and row.source == source:
                return row
        return None


def fate_of(
    request_arrived: float,
    admitted: float | None,
    first: float | None,
    finished: float | None,
    aborted: bool,
) -> tuple[float | None, float | None]:
    if admitted is not None:
        wait: float | None = admitted - request_arrived
    elif finished is not None:
        wait = finished - request_arrived
    else:
        wait = None
    ttft = None if first is None else first - request_arrived
    return wait, ttft


def sim_row(outcome: Outcome, family: str | None) -> Row:
    queues = [list(engine.records) for engine in outcome.engines]
    taken = [0] * len(queues)
    fates: list[Fate] = []
    for index in outcome.choices:
        request = queues[index][taken[index]]
        taken[index] += 1
        wait, ttft = fate_of(
            request.arrived,
            request.admitted,
            request.first_token,
            request.finished,
            request.aborted,
        )
        timed_out = request.aborted and request.first_token is None
        fates.append(Fate(index, wait, None if timed_out else ttft, timed_out))
    scrapes = None
    if outcome.scrapes:
        scrapes = outcome.scrapes / outcome.duration / len(outcome.engines)
    return Row(
        outcome.policy,
        "sim",
        family,
        [e.name for e in outcome.engines],
        fates,
        scrapes_per_second=scrapes,
    )


def live_row(run: LiveRun, family: str | None, gateway: bool) -> Row:
    fates: list[Fate] = []
    for record in run.records:
        request = record.request
        seen = record.seen
        error = bool(seen.error) and not seen.timed_out
        if request is None:
            fates.append(Fate(None, None, None, seen.timed_out, error or not seen.timed_out))
            continue
        wait, ttft = fate_of(
            request.arrived,
            request.admitted,
            request.first_token,
            request.finished,
            request.aborted,
        )
        if seen.timed_out or error:
            ttft = None
        fates.append(Fate(record.engine, wait, ttft, seen.timed_out, error))
    count = len(run.records) or 1
    engines = len(run.engines) or 1
    return Row(
        run.label,
        "live" if gateway else LIVE_DIRECT,
        family,
        run.engines,
        fates,
        scrapes_per_second=sum(run.scrapes) / engines / run.engine_seconds
        if gateway and run.engine_seconds
        else None,
        scrapes_per_wall_second=sum(run.scrapes) / engines / run.wall_seconds
        if gateway and run.wall_seconds
        else None,
        cpu_ms_per_request=None
        if run.gateway_cpu_seconds is None
        else 1000 * run.gateway_cpu_seconds / count,
        live=run,
    )


# -- figures ----------------------------------------------------------------------------


def percentile(values: Sequence[float], fraction: float) -> float | None:
    """Nearest rank."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(fraction * len(ordered)))
    return ordered[rank - 1]


@dataclass(frozen=True, slots=True)
class Figures:
    requests: int
    qw_p50: float | None
    qw_p99: float | None
    ttft_p50: float | None
    ttft_p99: float | None
    timeouts: int
    errors: int
    share: list[float]
    same_as_previous: float | None
    herding_baseline: float | None
    """What the same-engine rate would be if choices were independent with these shares."""


def figures(row: Row) -> Figures:
    fates = row.fates
    waits = [f.queue_wait for f in fates if f.queue_wait is not None]
    ttfts = [
        FIRST_TOKEN_DEADLINE if f.timed_out else f.ttft
        for f in fates
        if f.timed_out or f.ttft is not None
    ]
    counts = [0] * len(row.engines)
    for fate in fates:
        if fate.engine is not None:
            counts[fate.engine] += 1
    routed = sum(counts)
    share = [100.0 * c / routed if routed else 0.0 for c in counts]
    pairs = [
        (a.engine, b.engine)
        for a, b in itertools.pairwise(fates)
        if a.engine is not None and b.engine is not None
    ]
    same = 100.0 * sum(1 for a, b in pairs if a == b) / len(pairs) if pairs else None
    baseline = sum(s * s for s in share) / 100.0 if routed else None
    return Figures(
        requests=len(fates),
        qw_p50=percentile(waits, 0.5),
        qw_p99=percentile(waits, 0.99),
        ttft_p50=percentile([t for t in ttfts if t is not None], 0.5),
        ttft_p99=percentile([t for t in ttfts if t is not None], 0.99),
        timeouts=sum(1 for f in fates if f.timed_out),
        errors=sum(1 for f in fates if f.error),
        share=share,
        same_as_previous=same,
        herding_baseline=baseline,
    )


def oracle_of(cell: Cell, row: Row) -> Row | None:
    if row.family == "seed":
        return cell.find(SEED_ORACLE)
    if row.family == "capacity":
        return cell.find(CAPACITY_ORACLE)
    return None


def _ratio(value: float | None, reference: float | None) -> str:
    if value is None or reference is None:
        return "—"
    if reference <= 0:
        return "—" if value > 0 else "1.00x"
    return f"{value / reference:.2f}x"


def _s(value: float | None) -> str:
    if value is None:
        return "—"
    return f"{value:.3f}" if value < 10 else f"{value:.1f}"


def _opt(value: float | None, fmt: str) -> str:
    return "—" if value is None else fmt.format(value)


TABLE_HEADER = (
    "| policy | source | p50 queue wait (s) | p99 queue wait (s) | p50 TTFT (s) "
    "| p99 TTFT (s) | timeouts | errors | share per engine (%) | same engine as previous (%) "
    "| p99 wait ÷ its oracle | p99 wait ÷ least-in-flight | gateway CPU ms/req "
    "| scrapes/s per backend (engine s) |"
)


def cell_table(cell: Cell) -> list[str]:
    lines = [TABLE_HEADER, "|" + "---|" * 14]
    lif = cell.find(LEAST_IN_FLIGHT)
    lif_p99 = figures(lif).qw_p99 if lif is not None else None
    for row in cell.rows:
        f = figures(row)
        oracle = oracle_of(cell, row)
        oracle_p99 = figures(oracle).qw_p99 if oracle is not None else None
        share = " / ".join(f"{name} {s:.0f}" for name, s in zip(row.engines, f.share, strict=True))
        same = (
            "—"
            if f.same_as_previous is None
            else f"{f.same_as_previous:.0f} ({_opt(f.herding_baseline, '{:.0f}')})"
        )
        lines.append(
            "| "
            + " | ".join(
                [
                    row.label,
                    row.source,
                    _s(f.qw_p50),
                    _s(f.qw_p99),
                    _s(f.ttft_p50),
                    _s(f.ttft_p99),
                    str(f.timeouts),
                    str(f.errors) if row.source != "sim" else "—",
                    share,
                    same,
                    _ratio(f.qw_p99, oracle_p99) if oracle is not None else "—",
                    _ratio(f.qw_p99, lif_p99),
                    _opt(row.cpu_ms_per_request, "{:.2f}"),
                    _opt(row.scrapes_per_second, "{:.2f}"),
                ]
            )
            + " |"
        )
    return lines


@dataclass(frozen=True, slots=True)
class Verdict:
    cell: Cell
    row: Row
    oracle_p99: float | None
    p99: float | None
    timeouts: int
    errors: int

    @property
    def ratio_ok(self) -> bool | None:
        if self.p99 is None or self.oracle_p99 is None:
            return None
        return (
            self.p99 <= TARGET_RATIO * self.oracle_p99
            or self.p99 - self.oracle_p99 <= ABSOLUTE_SLACK
        )

    @property
    def timeouts_ok(self) -> bool | None:
        return self.timeouts == 0 if self.cell.load >= 0.95 else None


def verdicts(cells: Sequence[Cell]) -> list[Verdict]:
    out: list[Verdict] = []
    for cell in cells:
        for row in cell.rows:
            if row.source != "live":
                continue
            oracle = oracle_of(cell, row)
            f = figures(row)
            out.append(
                Verdict(
                    cell,
                    row,
                    figures(oracle).qw_p99 if oracle is not None else None,
                    f.qw_p99,
                    f.timeouts,
                    f.errors,
                )
            )
    return out


def _mark(ok: bool | None) -> str:
    return "—" if ok is None else ("met" if ok else "**missed**")


def targets_table(cells: Sequence[Cell]) -> list[str]:
    lines = [
        "| pool | load | seed | Arona row | p99 queue wait (s) | its oracle's p99 (s) | ratio "
        f"| ≤ {TARGET_RATIO}x (or within {ABSOLUTE_SLACK * 1000:.0f} ms) | timeouts "
        "| zero timeouts at 95 % | live capacity oracle, no gateway: p99 (s) "
        "| capacity rows ÷ it |",
        "|" + "---|" * 12,
    ]
    for v in verdicts(cells):
        live = v.cell.find(CAPACITY_ORACLE, LIVE_DIRECT)
        live_p99 = figures(live).qw_p99 if live is not None else None
        held = _ratio(v.p99, live_p99) if v.row.family == "capacity" else "—"
        lines.append(
            f"| {v.cell.pool} | {v.cell.load:.2f} | {v.cell.seed} | {v.row.label} "
            f"| {_s(v.p99)} | {_s(v.oracle_p99)} | {_ratio(v.p99, v.oracle_p99)} "
            f"| {_mark(v.ratio_ok)} | {v.timeouts} | {_mark(v.timeouts_ok)} "
            f"| {_s(live_p99)} | {held} |"
        )
    return lines


def target_summary(cells: Sequence[Cell]) -> list[str]:
    found = verdicts(cells)
    by_label: dict[str, list[Verdict]] = {}
    for v in found:
        by_label.setdefault(v.row.label, []).append(v)
    lines = []
    for label, items in by_label.items():
        ratio = [v for v in items if v.ratio_ok is not None]
        met = sum(1 for v in ratio if v.ratio_ok)
        heavy = [v for v in items if v.timeouts_ok is not None]
        clean = sum(1 for v in heavy if v.timeouts_ok)
        lines.append(
            f"- {label}: p99 queue wait target met in {met}/{len(ratio)} cells; "
            f"zero timeouts at 95 % in {clean}/{len(heavy)} cells"
        )
    return lines


def fidelity_table(cells: Sequence[Cell]) -> list[str]:
    lines = [
        "| pool | load | seed | live row | wall (s) | engine s | pace (taken ÷ planned busy "
        "time, worst engine) | client to engine p50 / p99 (wall ms) | engine's first token "
        "to client p50 / p99 (wall ms) | fastest full step (wall ms) | scrapes/s per backend "
        "(wall) | left on engines after cut | harness CPU (% of a core) |",
        "|" + "---|" * 13,
    ]
    for cell in cells:
        for row in cell.rows:
            run = row.live
            if run is None:
                continue
            to_engine, back = path_times(run)
            lines.append(
                f"| {cell.pool} | {cell.load:.2f} | {cell.seed} | {row.label} "
                f"| {run.wall_seconds:.1f} | {run.engine_seconds:.1f} | {run.pace:.3f} "
                f"| {_ms_pair(to_engine)} | {_ms_pair(back)} "
                f"| {run.step_wall_ms:.1f} | {_opt(row.scrapes_per_wall_second, '{:.2f}')} "
                f"| {run.unsettled} | {run.harness_cpu_percent:.0f} |"
            )
    return lines


def path_times(run: LiveRun) -> tuple[list[float], list[float]]:
    """Wall seconds from each request's send time to its arrival on the engine, and from
    its first token on the engine to the client reading it."""
    to_engine: list[float] = []
    back: list[float] = []
    for record in run.records:
        request = record.request
        if request is None or record.engine is None or not run.origins:
            continue
        reached = run.origins[record.engine] + request.arrived / run.time_scale
        to_engine.append(reached - record.seen.sent_at)
        first = record.seen.first_byte
        if first is not None and request.first_token is not None:
            produced = run.origins[record.engine] + request.first_token / run.time_scale
            back.append(record.seen.sent_at + first - produced)
    return to_engine, back


def _ms_pair(values: list[float]) -> str:
    p50, p99 = percentile(values, 0.5), percentile(values, 0.99)
    if p50 is None or p99 is None:
        return "—"
    return f"{1000 * p50:.1f} / {1000 * p99:.1f}"


@dataclass(slots=True)
class ReportContext:
    date: str
    command: str
    wall_seconds: float
    settings: list[str]
    machine: dict[str, str]
    notes: list[str]


def render(context: ReportContext, cells: Sequence[Cell]) -> str:
    out = [
        f"# Routing benchmark, {context.date}",
        "",
        f"`{context.command}`: wall time {context.wall_seconds / 60:.1f} min.",
        "",
        "## Settings",
        "",
        *(f"- {line}" for line in context.settings),
        "",
        "## Machine",
        "",
        *(f"- {name}: {value}" for name, value in context.machine.items()),
    ]
    if any(row.source == "live" for cell in cells for row in cell.rows):
        out += [
            "",
            "## Targets (live Arona rows against the simulated oracle of their score)",
            "",
            *target_summary(cells),
            "",
            *targets_table(cells),
        ]
    for cell in cells:
        out += [
            "",
            f"## {cell.pool}, load {cell.load:.0%}, seed {cell.seed} "
            f"({cell.arrivals} arrivals, {cell.rate:.2f}/s engine time)",
            "",
            *cell_table(cell),
        ]
    if any(row.live is not None for cell in cells for row in cell.rows):
        out += ["", "## Harness fidelity (live runs)", "", *fidelity_table(cells)]
    if context.notes:
        out += ["", "## Notes", "", *(f"- {note}" for note in context.notes)]
    return "\n".join(out) + "\n"


def write(name: str, markdown: str) -> Path:
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    path = RESULTS_DIR / f"{name}.md"
    path.write_text(markdown)
    return path
