"""The report: one Markdown table per figure set (terminal and file) and a JSON twin."""

from __future__ import annotations

import dataclasses
import json
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.results import MEMORY, Results, verdicts
from bench.scenarios import SCENARIOS, Kind
from bench.systems import DEFAULT_SYSTEMS, LABELS, SYSTEM_ORDER

RESULTS_DIR = Path(__file__).resolve().parent / "results"
NO_RATIO = frozenset(
    {"load_core_busy_pct", "sut_core_busy_pct", "usage_pct", "opened", "sut_cpu_pct"}
)
"""Figures whose Arona/LiteLLM ratio says nothing (they describe the run, not the SUT)."""

Row = tuple[str, str, str]
"""metric key, label, format."""

COMMON_TAIL: tuple[Row, ...] = (
    ("services_cpu_ms_per_req", "PostgreSQL + Redis CPU ms per request (any user)", "{:.3f}"),
    ("sut_cpu_pct", "SUT CPU use (% of one core)", "{:.0f}"),
    ("sut_core_busy_pct", "SUT core (CPU 0) busy %, all processes", "{:.0f}"),
    ("rss_mb", "SUT RSS after the run (MB)", "{:.0f}"),
    ("load_core_busy_pct", "load core (CPU 1) busy %", "{:.0f}"),
)
ROWS: dict[Kind | str, tuple[Row, ...]] = {
    "wrk": (
        ("rps", "requests/s", "{:,.0f}"),
        ("p50_ms", "p50 latency (ms)", "{:.2f}"),
        ("p90_ms", "p90 latency (ms)", "{:.2f}"),
        ("p99_ms", "p99 latency (ms)", "{:.2f}"),
        ("added_p50_ms", "added p50 over direct (ms)", "{:.2f}"),
        ("cpu_ms_per_req", "SUT CPU ms per request", "{:.3f}"),
        *COMMON_TAIL,
    ),
    "stream": (
        ("rps", "streams/s", "{:,.0f}"),
        ("ttfb_p50_ms", "time to first byte p50 (ms)", "{:.2f}"),
        ("ttfb_p99_ms", "time to first byte p99 (ms)", "{:.2f}"),
        ("p50_ms", "whole stream p50 (ms)", "{:.2f}"),
        ("p90_ms", "whole stream p90 (ms)", "{:.2f}"),
        ("p99_ms", "whole stream p99 (ms)", "{:.2f}"),
        ("added_p50_ms", "added p50 over direct (ms)", "{:.2f}"),
        ("cpu_ms_per_req", "SUT CPU ms per stream", "{:.3f}"),
        ("usage_pct", "streams with a usage chunk (%)", "{:.0f}"),
        *COMMON_TAIL,
    ),
    "hold": (
        ("opened", "streams open at once", "{:,.0f}"),
        ("rss_before_mb", "SUT RSS before (MB)", "{:.1f}"),
        ("rss_open_mb", "SUT RSS while open (MB, median)", "{:.1f}"),
        ("kb_per_stream", "RSS per open stream (KB)", "{:.1f}"),
        ("cpu_ms_per_req", "SUT CPU ms per stream (open, idle, close)", "{:.2f}"),
        ("services_cpu_ms_per_req", "PostgreSQL + Redis CPU ms per stream (any user)", "{:.2f}"),
        ("load_core_busy_pct", "load core (CPU 1) busy %", "{:.0f}"),
    ),
    MEMORY: (
        ("rss_after_warmup_mb", "RSS after warm-up (MB)", "{:.1f}"),
        ("rss_after_load_mb", "RSS after all scenarios (MB)", "{:.1f}"),
        ("startup_s", "start-up to first healthy answer (s)", "{:.1f}"),
    ),
}


@dataclass(slots=True)
class ReportContext:
    date: str
    name: str
    """The results file name without extension: the date, plus a suffix for partial runs."""
    command: str
    wall_seconds: float
    runs: int
    seconds: float
    machine: dict[str, str]
    litellm: dict[str, Any]
    results: Results
    notes: list[str]


def _cell(values: Sequence[float], fmt: str) -> str:
    if not values:
        return "—"
    if len(values) == 1:
        return fmt.format(values[0])
    middle = statistics.median(values)
    return f"{fmt.format(middle)} ({fmt.format(min(values))}..{fmt.format(max(values))})"


def _ratio(arona: float | None, litellm: float | None) -> str:
    if arona is None or litellm is None or litellm == 0:
        return "—"
    return f"{arona / litellm:.2f}x"


def _columns(results: Results) -> tuple[str, ...]:
    """Every default system (a dash when it did not run), and the baseline if it ran."""
    ran = {system for by_system in results.samples.values() for system in by_system}
    return tuple(s for s in SYSTEM_ORDER if s in DEFAULT_SYSTEMS or s in ran)


def _table(results: Results, scenario: str, rows: tuple[Row, ...]) -> list[str]:
    columns = _columns(results)
    header = ["figure", *(LABELS[s] for s in columns), "Arona/LiteLLM"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for metric, label, fmt in rows:
        cells = [_cell(results.values(scenario, s, metric), fmt) for s in columns]
        if all(c == "—" for c in cells):
            continue
        ratio = (
            "—"
            if metric in NO_RATIO
            else _ratio(
                results.median(scenario, "arona", metric),
                results.median(scenario, "litellm", metric),
            )
        )
        lines.append("| " + " | ".join([label, *cells, ratio]) + " |")
    errors = [
        sum(s.errors for s in results.samples.get(scenario, {}).get(system, []))
        for system in columns
    ]
    if any(errors):
        lines.append("| **errors (all runs)** | " + " | ".join(str(e) for e in errors) + " | — |")
    return lines


def _targets(results: Results) -> list[str]:
    lines = [
        "| target | limit | Arona | LiteLLM (for reference) | Arona result |",
        "|---|---|---|---|---|",
    ]
    for verdict in verdicts(results):
        spec = verdict.spec
        sign = "≤" if spec.better == "lower" else "≥"
        fmt = "{:,.0f}" if spec.unit == "/s" else "{:.2f}"

        def show(value: float | None, fmt: str = fmt, unit: str = spec.unit) -> str:
            return "—" if value is None else f"{fmt.format(value)} {unit}"

        lines.append(
            f"| {spec.label} ({spec.where}) | {sign} {fmt.format(spec.limit)} {spec.unit} | "
            f"{show(verdict.arona)} | {show(verdict.litellm)} | {verdict.text} |"
        )
    return lines


def render(context: ReportContext) -> str:
    results = context.results
    machine = context.machine
    out = [
        f"# Benchmark results, {context.date}",
        "",
        f"`{context.command}`: {context.runs} run(s) of {context.seconds:g} s per scenario "
        f"and system, interleaved (direct, Arona, LiteLLM in turn); wall time "
        f"{context.wall_seconds / 60:.1f} min. Cells: median (min..max over runs).",
        "",
        "## Machine",
        "",
        *(f"- {name}: {value}" for name, value in machine.items()),
        f"- LiteLLM: {context.litellm.get('status', 'not run')}",
        "",
        "## Targets (Arona, same run as LiteLLM)",
        "",
        *_targets(results),
    ]
    for scenario in SCENARIOS:
        if scenario.key not in results.samples:
            continue
        out += ["", f"## {scenario.title}", "", *_table(results, scenario.key, ROWS[scenario.kind])]
    if MEMORY in results.samples:
        out += ["", "## Memory and start-up", "", *_table(results, MEMORY, ROWS[MEMORY])]
    flagged = results.flagged()
    notes = [*context.notes, *flagged]
    if notes:
        out += ["", "## Notes and flagged runs", "", *(f"- {note}" for note in notes)]
    return "\n".join(out) + "\n"


def write(context: ReportContext, markdown: str) -> tuple[Path, Path]:
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    md_path = RESULTS_DIR / f"{context.name}.md"
    json_path = RESULTS_DIR / f"{context.name}.json"
    md_path.write_text(markdown)
    results = context.results
    payload = {
        "date": context.date,
        "command": context.command,
        "wall_seconds": round(context.wall_seconds, 1),
        "runs": context.runs,
        "seconds_per_run": context.seconds,
        "machine": context.machine,
        "litellm": context.litellm,
        "notes": context.notes,
        "flagged": results.flagged(),
        "targets": [
            {
                **dataclasses.asdict(v.spec),
                "arona": v.arona,
                "litellm": v.litellm,
                "result": v.text,
            }
            for v in verdicts(results)
        ],
        "summary": results.summary(),
        "samples": {
            scenario: {
                system: [dataclasses.asdict(s) for s in samples]
                for system, samples in by_system.items()
            }
            for scenario, by_system in results.samples.items()
        },
    }
    json_path.write_text(json.dumps(payload, indent=2) + "\n")
    return md_path, json_path
