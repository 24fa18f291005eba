"""``python -m bench.routing``: routing quality, policies side by side on the same traffic.

For every pool, load and seed: the baselines and the fresh-metrics oracles in virtual
time (``bench.routing.simulate``), the capacity oracle again live without a gateway
(the harness's own deviation), then Arona through its real HTTP path: ``/v1/chat/
completions`` with ``ARONA_ROUTING_SCORE`` seed and capacity, 1 and 3 replicas, and
``/api/runtime/chat`` (capacity, 1 replica, a new conversation per request). ``make
bench-routing`` runs it all (~40 min); ``--quick`` one pool, two loads, one seed, one
replica (~2.5 min). The report goes to stdout and ``bench/results/routing-<date>.md``.
"""

from __future__ import annotations

import argparse
import asyncio
import atexit
import secrets
import shlex
import shutil
import signal
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

from app import __version__
from bench.arona_sut import AronaDeployment
from bench.choices import comma_choices
from bench.machine import machine_info
from bench.procs import BenchError, Supervisor, pin_self_to_load_cpu
from bench.routing.live import (
    CHUNK_TOKENS,
    AronaCluster,
    EngineHost,
    LiveRun,
    OpenLoopClient,
    ScoreKind,
    Surface,
    Target,
    create_conversations,
    run_live,
)
from bench.routing.report import (
    CAPACITY_ORACLE,
    Cell,
    ReportContext,
    Row,
    figures,
    live_row,
    render,
    sim_row,
    write,
)
from bench.routing.simulate import (
    CapacityOracle,
    EstimatorPolicy,
    LeastInFlight,
    Policy,
    RandomPolicy,
    RoundRobin,
    SeedOracle,
    simulate,
)
from bench.routing.workload import FIRST_TOKEN_DEADLINE, LOADS, POOLS, Workload
from bench.runner import raise_fd_limit

PAUSE_SECONDS = 0.5
"""Between live runs: the gateway flushes usage, connections go idle."""


@dataclass(frozen=True, slots=True)
class Options:
    pools: tuple[str, ...]
    loads: tuple[float, ...]
    seeds: tuple[int, ...]
    replicas: tuple[int, ...]
    duration: float
    time_scale: float
    live: bool
    calibrate: bool
    runtime: bool
    command: str
    suffix: str


def _numbers(raw: str, kind: type[float] | type[int]) -> tuple[float, ...]:
    try:
        values = tuple(kind(v) for v in raw.split(",") if v.strip())
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc
    if not values:
        raise argparse.ArgumentTypeError("give at least one value")
    return values


def parse_args(argv: list[str]) -> Options:
    parser = argparse.ArgumentParser(prog="python -m bench.routing", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="skewed pool, 80 and 95 %%, 1 seed")
    parser.add_argument(
        "--pools",
        type=lambda raw: comma_choices(raw, tuple(POOLS), "pool"),
        default=None,
        help="comma-separated pools (default all): " + ", ".join(POOLS),
    )
    parser.add_argument(
        "--loads",
        type=lambda raw: _numbers(raw, float),
        default=None,
        help="comma-separated fractions of capacity (default 0.6,0.8,0.95)",
    )
    parser.add_argument(
        "--seeds", type=lambda raw: _numbers(raw, int), default=None, help="default 1,2"
    )
    parser.add_argument(
        "--replicas",
        type=lambda raw: _numbers(raw, int),
        default=None,
        help="Arona replica counts (default 1,3; --quick 1)",
    )
    parser.add_argument(
        "--duration",
        type=float,
        default=None,
        help="engine seconds of arrivals per run (default 60; --quick 40)",
    )
    parser.add_argument(
        "--time-scale",
        type=float,
        default=3.0,
        help="engine seconds per wall second in live runs (default 3)",
    )
    parser.add_argument("--sim-only", action="store_true", help="no live runs (seconds)")
    parser.add_argument(
        "--no-calibration", action="store_true", help="skip the live oracle without a gateway"
    )
    parser.add_argument("--no-runtime", action="store_true", help="skip /api/runtime/chat rows")
    args = parser.parse_args(argv)
    pools: tuple[str, ...] = args.pools or (("skewed",) if args.quick else tuple(POOLS))
    loads = args.loads or ((0.8, 0.95) if args.quick else LOADS)
    seeds = tuple(int(s) for s in (args.seeds or ((1,) if args.quick else (1, 2))))
    replicas = tuple(int(r) for r in (args.replicas or ((1,) if args.quick else (1, 3))))
    duration = args.duration if args.duration is not None else (40.0 if args.quick else 60.0)
    if duration < 5 or not 0.5 <= args.time_scale <= 20:
        parser.error("--duration must be at least 5 and --time-scale within 0.5..20")
    if any(not 0 < load < 1.5 for load in loads) or any(r < 1 for r in replicas):
        parser.error("loads are fractions of capacity (0..1.5); replicas at least 1")
    defaults = (
        args.pools is None
        and args.loads is None
        and args.seeds is None
        and args.replicas is None
        and args.duration is None
        and not args.sim_only
    )
    suffix = "-quick" if args.quick else ("" if defaults else "-partial")
    return Options(
        pools=pools,
        loads=tuple(float(x) for x in loads),
        seeds=seeds,
        replicas=replicas,
        duration=duration,
        time_scale=args.time_scale,
        live=not args.sim_only,
        calibrate=not args.no_calibration,
        runtime=not args.no_runtime,
        command=" ".join(["python -m bench.routing", shlex.join(argv)]).strip(),
        suffix=suffix,
    )


def say(text: str) -> None:
    print(text, flush=True)


def arona_in_virtual_time(workload: Workload, options: Options) -> list[tuple[Policy, str, int]]:
    """Arona's own estimator and scores (``app.routing.load``) driven in virtual time:
    what the router decides without the HTTP path's latencies, with the capacity
    learned from the metrics and with ``max_concurrency`` set by the operator."""
    size = len(workload.pool)
    slots = [shape.slots for shape in workload.pool]
    rows: list[tuple[Policy, str, int]] = []
    for replicas in sorted(options.replicas):
        suffix = f"{replicas} replica{'s' if replicas > 1 else ''}"
        variants: list[tuple[ScoreKind, list[int] | None, str]] = [
            ("capacity", None, "learned"),
            ("capacity", slots, "maxConcurrency set"),
            ("seed", None, "learned"),
        ]
        for kind, capacities, how in variants:
            name = f"Arona {kind}, {suffix}, {how} (estimator)"
            policy = EstimatorPolicy(
                size, kind=kind, replicas=replicas, lazy=True, capacities=capacities, name=name
            )
            rows.append((policy, kind, replicas))
    return rows


def simulated_cells(options: Options) -> list[Cell]:
    cells: list[Cell] = []
    for pool in options.pools:
        for load in options.loads:
            for seed in options.seeds:
                workload = Workload(pool, load, seed, options.duration)
                size = len(workload.pool)
                cell = Cell(pool, load, seed, len(workload.arrivals()), workload.rate)
                baselines: list[tuple[Policy, str | None]] = [
                    (RandomPolicy(seed), None),
                    (RoundRobin(), None),
                    (LeastInFlight(size), None),
                    (SeedOracle(), "seed"),
                    (CapacityOracle(), "capacity"),
                ]
                for policy, family in baselines:
                    cell.rows.append(sim_row(simulate(workload, policy), family))
                for policy, family, replicas in arona_in_virtual_time(workload, options):
                    cell.rows.append(sim_row(simulate(workload, policy, replicas), family))
                cells.append(cell)
    return cells


def arona_label(score: ScoreKind, replicas: int, surface: Surface) -> str:
    path = "/v1" if surface == "v1" else "runtime chat"
    return f"Arona {score}, {replicas} replica{'s' if replicas > 1 else ''}, {path}"


def live_settings(options: Options) -> list[tuple[ScoreKind, int]]:
    # Capacity with one replica first: the runtime rows go with it.
    order: list[tuple[ScoreKind, int]] = []
    for replicas in sorted(options.replicas):
        order += [("capacity", replicas), ("seed", replicas)]
    return order


def _progress(step: int, total: int, cell: Cell, run: LiveRun, row: Row) -> None:
    f = figures(row)
    qw = "—" if f.qw_p99 is None else f"{f.qw_p99:.3f}"
    say(
        f"  [{step}/{total}] {cell.pool} {cell.load:.2f} seed {cell.seed} {row.label} "
        f"({row.source}): p99 queue wait {qw} s, timeouts {f.timeouts}, errors {f.errors}, "
        f"pace {run.pace:.3f}, {run.wall_seconds:.1f} s wall"
    )


async def live_runs(
    options: Options,
    cells: list[Cell],
    supervisor: Supervisor,
    deployment: AronaDeployment,
    run_dir: Path,
) -> None:
    host = EngineHost(options.time_scale)
    client = OpenLoopClient(options.time_scale)
    settings = live_settings(options)
    runtime_cells = [c for c in cells if c.seed == options.seeds[0]] if options.runtime else []
    total = len(cells) * len(settings) + len(runtime_cells)
    total += len(cells) if options.calibrate else 0
    step = 0

    def workload(cell: Cell) -> Workload:
        return Workload(cell.pool, cell.load, cell.seed, options.duration)

    async def one(cell: Cell, target: Target, cluster: AronaCluster | None, family: str) -> None:
        nonlocal step
        step += 1
        run = await run_live(host, client, workload(cell), target, cluster)
        row = live_row(run, family, gateway=cluster is not None)
        cell.rows.append(row)
        _progress(step, total, cell, run, row)
        await asyncio.sleep(PAUSE_SECONDS)

    try:
        async with host.serving(options.pools):
            if options.calibrate:
                say("live, no gateway: the capacity oracle reading the engines in-process...")
                for cell in cells:
                    target = Target(CAPACITY_ORACLE, policy=CapacityOracle())
                    await one(cell, target, None, "capacity")
            say("Arona: creating the database, migrating, starting, registering the engines...")
            cluster = AronaCluster(supervisor, deployment, run_dir, options.time_scale)
            await cluster.prepare(host)
            assert cluster.credentials is not None
            names = [name for name, _, _ in host.backends()]
            for score, replicas in settings:
                await cluster.start(score, replicas)
                await cluster.wait_healthy(names)
                say(f"Arona: score {score}, {replicas} replica(s) on {', '.join(cluster.urls)}")
                key = {"Authorization": f"Bearer {cluster.credentials.api_key}"}
                for cell in cells:
                    target = Target(arona_label(score, replicas, "v1"), "v1", cluster.urls, key)
                    await one(cell, target, cluster, score)
                if (score, replicas) != ("capacity", 1):
                    continue
                runtime = {"Authorization": f"Bearer {cluster.credentials.runtime_token}"}
                for cell in runtime_cells:
                    count = cell.arrivals
                    conversations = await create_conversations(cluster, cell.pool, count)
                    target = Target(
                        arona_label(score, replicas, "runtime"),
                        "runtime",
                        cluster.urls,
                        runtime,
                        conversations,
                    )
                    await one(cell, target, cluster, score)
            cluster.stop()
    finally:
        await client.close()


def _row_order(row: Row) -> tuple[int, str]:
    rank = {"sim": 0, "live, no gateway": 1, "live": 2}
    return (rank.get(row.source, 3), "" if row.source == "sim" else row.label)


def settings_text(options: Options) -> list[str]:
    scale = options.time_scale
    lines = [
        f"pools: {', '.join(options.pools)}; loads: "
        f"{', '.join(f'{x:.0%}' for x in options.loads)} of capacity; seeds: "
        f"{', '.join(str(s) for s in options.seeds)}",
        f"{options.duration:g} engine seconds of open-loop Poisson arrivals per run; a request "
        f"without a first token {FIRST_TOKEN_DEADLINE:g} engine s after its arrival is "
        "abandoned (a timeout): the client disconnects and the engine drops it",
        "all times are engine seconds; sim rows run in virtual time with the same "
        "arrivals, engines and deadline",
    ]
    if options.live:
        lines += [
            f"live: engine time runs {scale:g}x wall time (a run of {options.duration:g} "
            f"engine s of arrivals takes ~{options.duration / scale:.0f} s of wall time); "
            f"engines stream {CHUNK_TOKENS} tokens per SSE frame (the first alone); the "
            "client streams every request and reads it to the end",
            f"Arona: `arona serve` on PostgreSQL + Redis, engines registered as `vllm` "
            f"backends; ARONA_VLLM_METRICS_BUSY/FRESH/EXPIRE_SECONDS = "
            f"{0.25 / scale:.3g} / {2 / scale:.3g} / {10 / scale:.3g} and "
            f"ARONA_BACKEND_COOLDOWN_SECONDS = {30 / scale:.3g} (the defaults ÷ {scale:g}, the "
            "same cadence in engine time); 3 replicas share the database and Redis, arrivals "
            "go to them in turn",
            "runtime chat rows: a new conversation per request (created before the run), so "
            "conversation affinity never applies; the rows run for the first seed only",
            "gateway CPU ms/req: user + system CPU of every Arona process over the run "
            "(including the drain) ÷ arrivals, in wall (real) CPU time",
        ]
    return lines


NOTES = [
    "p99 TTFT of 30.0 means at least 1 % of the requests timed out; a queue wait of an "
    "abandoned request that never left the queue is the time until it was abandoned",
    "same engine as previous: % of consecutive arrivals sent to the same engine; in "
    "parentheses what independent choices with the same shares would give",
    "'÷ its oracle': seed rows against the simulated seed oracle, capacity rows (and the "
    "live capacity oracle) against the simulated capacity oracle",
    "target check: a row meets the 1.2x target when its p99 queue wait is at most 1.2x its "
    "oracle's or within 50 ms (engine) of it; the oracles are simulated (the live oracle "
    "row without a gateway shows how far the harness itself is from the simulation)",
    "scrapes/s per backend: `/metrics` requests each engine answered over the run, per "
    "engine second (the fidelity table has the same per wall second)",
]


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    options = parse_args(sys.argv[1:] if argv is None else argv)
    started = time.monotonic()
    say("simulating the baselines and oracles...")
    cells = simulated_cells(options)
    say(f"  {len(cells)} cells in {time.monotonic() - started:.1f} s")
    notes = list(NOTES)
    failed = False
    if options.live:
        pin_self_to_load_cpu()
        raise_fd_limit()
        signal.signal(signal.SIGTERM, _on_sigterm)
        run_id = secrets.token_hex(4)
        run_dir = Path(tempfile.mkdtemp(prefix=f"arona-routing-{run_id}-"))
        supervisor = Supervisor()
        deployment = AronaDeployment(run_id)
        atexit.register(deployment.close)
        atexit.register(supervisor.stop_all)
        try:
            asyncio.run(live_runs(options, cells, supervisor, deployment, run_dir))
        except BenchError as exc:
            failed = True
            say(f"live runs failed: {exc}\n(logs kept in {run_dir})")
            notes.append(f"live runs stopped early: {exc}")
        except KeyboardInterrupt:
            say("interrupted: every process the benchmark started was stopped")
            return 130
        finally:
            supervisor.stop_all()
            for problem in deployment.close():
                say(f"cleanup: {problem}")
            if not failed:
                shutil.rmtree(run_dir, ignore_errors=True)
    for cell in cells:
        cell.rows.sort(key=_row_order)
    date = time.strftime("%Y-%m-%d")
    context = ReportContext(
        date=date,
        command=options.command,
        wall_seconds=time.monotonic() - started,
        settings=settings_text(options),
        machine=machine_info({"arona": f"arona {__version__}"}),
        notes=notes,
    )
    markdown = render(context, cells)
    say("\n" + markdown)
    path = write(f"routing-{date}{options.suffix}", markdown)
    say(f"written: {path}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
