"""``python -m bench``: Arona side by side with the direct upstream and the LiteLLM proxy.

``make bench`` runs the full benchmark (3 runs of 5 s per scenario and system);
``--quick`` is a smoke check (1 run of 2 s). See docs/performance.md.
"""

from __future__ import annotations

import argparse
import shlex
import sys

from bench.choices import comma_choices
from bench.procs import BenchError
from bench.runner import Options, run
from bench.scenarios import SCENARIOS
from bench.systems import DEFAULT_SYSTEMS, SYSTEM_ORDER


def parse_args(argv: list[str]) -> Options:
    scenario_keys = tuple(s.key for s in SCENARIOS)
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument(
        "--duration", type=float, default=None, help="seconds per measured run (default 5)"
    )
    parser.add_argument("--runs", type=int, default=None, help="repetitions (default 3)")
    parser.add_argument("--quick", action="store_true", help="smoke check: 1 run of 2 s")
    parser.add_argument("--skip-litellm", action="store_true", help="no LiteLLM peer")
    parser.add_argument(
        "--only",
        type=lambda raw: comma_choices(raw, SYSTEM_ORDER, "system"),
        default=None,
        help="comma-separated systems to run: " + ", ".join(SYSTEM_ORDER),
    )
    parser.add_argument(
        "--scenarios",
        type=lambda raw: comma_choices(raw, scenario_keys, "scenario"),
        default=scenario_keys,
        help="comma-separated scenarios (default all): " + ", ".join(scenario_keys),
    )
    parser.add_argument(
        "--baseline",
        metavar="REF",
        default=None,
        help="also run the Arona of git commit REF (as arona-before, with its request "
        "quota) in the same run: before/after figures from one machine state",
    )
    args = parser.parse_args(argv)
    seconds = args.duration if args.duration is not None else (2.0 if args.quick else 5.0)
    runs = args.runs if args.runs is not None else (1 if args.quick else 3)
    if seconds < 1 or runs < 1:
        parser.error("--duration must be at least 1 and --runs at least 1")
    systems: tuple[str, ...] = args.only or DEFAULT_SYSTEMS
    if args.baseline is not None and "arona-before" not in systems:
        systems = tuple(s for s in SYSTEM_ORDER if s in systems or s == "arona-before")
    if "arona-before" in systems and args.baseline is None:
        parser.error("arona-before needs --baseline REF")
    if args.skip_litellm:
        systems = tuple(s for s in systems if s != "litellm")
    if not systems:
        parser.error("no system left to run")
    full = not args.quick and systems == DEFAULT_SYSTEMS and args.scenarios == scenario_keys
    suffix = "" if full else ("-quick" if args.quick else "-partial")
    return Options(
        seconds=seconds,
        runs=runs,
        warmup_seconds=1.0 if args.quick else 2.0,
        hold_seconds=4.0 if args.quick else 10.0,
        systems=systems,
        scenarios=args.scenarios,
        command=" ".join(["python -m bench", shlex.join(argv)]).strip(),
        suffix=suffix,
        baseline=args.baseline,
    )


def main(argv: list[str] | None = None) -> int:
    options = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        return run(options)
    except BenchError as exc:  # raised before any process was started (wrk missing)
        print(f"benchmark failed: {exc}", flush=True)
        return 1
    except KeyboardInterrupt:
        print("interrupted: every process the benchmark started was stopped", flush=True)
        return 130


if __name__ == "__main__":
    sys.exit(main())
