"""The whole benchmark: set up the systems, warm them up, run the interleaved
repetitions, tear everything down (also on errors and Ctrl-C), report."""

from __future__ import annotations

import atexit
import contextlib
import resource
import secrets
import shutil
import signal
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

from bench.arona_sut import AronaDeployment, start_arona
from bench.baseline import prepare as prepare_baseline
from bench.litellm_sut import LiteLLMInstall, ensure_installed, start_litellm
from bench.machine import machine_info
from bench.procs import BenchError, Supervisor, pin_self_to_load_cpu
from bench.procstat import rss_mb
from bench.report import ReportContext, render, write
from bench.results import MEMORY, Results
from bench.scenarios import SCENARIOS, Measurer, Sample, Scenario
from bench.service_pinning import services_off_sut_core
from bench.systems import SYSTEM_ORDER, FakeUpstream, System, start_fake
from bench.wrkload import ensure_wrk, wrk_version

FD_LIMIT = 65536
WARMUP_SCENARIOS = ("chat-c16", "stream-c16", "embed-c16")


@dataclass(frozen=True, slots=True)
class Options:
    seconds: float
    runs: int
    warmup_seconds: float
    hold_seconds: float
    systems: tuple[str, ...]
    scenarios: tuple[str, ...]
    command: str
    suffix: str = ""
    """Appended to the results file names, so a smoke check does not replace the day's
    full run."""
    baseline: str | None = None
    """A git ref run as ``arona-before`` beside this checkout (``bench.baseline``)."""


def raise_fd_limit() -> int:
    # Children inherit the limit: the SUTs, the fake and the client each hold ~1,000+
    # sockets in the slow-stream scenario.
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = FD_LIMIT if hard == resource.RLIM_INFINITY else min(FD_LIMIT, hard)
    if wanted > soft:
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
    return max(wanted, soft)


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    # Turn SIGTERM into an exception so the finally blocks stop every child.
    raise SystemExit(128 + signum)


def say(text: str) -> None:
    print(text, flush=True)


def _progress(run: int, runs: int, scenario: Scenario, system: System, sample: Sample) -> None:
    m = sample.metrics
    if scenario.kind == "hold":
        figures = (
            f"open {m.get('opened', 0):5.0f}  {m.get('kb_per_stream', 0):6.1f} KB/stream  "
            f"RSS {m.get('rss_open_mb', 0):6.1f} MB"
        )
    else:
        figures = (
            f"{m.get('rps', 0):8,.0f}/s  p50 {m.get('p50_ms', 0):8.2f} ms  "
            f"p99 {m.get('p99_ms', 0):8.2f} ms  CPU {m.get('cpu_ms_per_req', 0):6.3f} ms"
        )
    flag = f"  ERRORS {sample.errors}" if sample.errors else ""
    say(f"  [{run}/{runs}] {scenario.key:<10} {system.label:<8} {figures}{flag}")


def _litellm(
    supervisor: Supervisor, install: LiteLLMInstall | None, fake: FakeUpstream, run_dir: Path
) -> tuple[System | None, dict[str, Any]]:
    if install is None:
        return None, {"status": "skipped (--skip-litellm or --only)"}
    info: dict[str, Any] = {
        "version": install.version,
        "install_seconds": round(install.seconds, 1),
        "install_reused": install.reused,
    }
    if not install.ok:
        info["status"] = f"unavailable: install failed: {install.reason}"
        return None, info
    try:
        system = start_litellm(supervisor, install, fake, run_dir)
    except BenchError as exc:
        info["status"] = f"unavailable: start-up failed: {exc}"
        return None, info
    how = "reused an install made earlier, which took" if install.reused else "installed in"
    info["startup_seconds"] = round(system.startup_seconds or 0.0, 1)
    info["status"] = (
        f"{install.version} ({how} {install.seconds:.0f} s; started in "
        f"{system.startup_seconds or 0:.1f} s; no database, 1 worker, master key)"
    )
    return system, info


def run(options: Options) -> int:
    started = time.monotonic()
    pin_self_to_load_cpu()
    fd_limit = raise_fd_limit()
    signal.signal(signal.SIGTERM, _on_sigterm)
    wrk = ensure_wrk()
    run_id = secrets.token_hex(4)
    run_dir = Path(tempfile.mkdtemp(prefix=f"arona-bench-{run_id}-"))
    supervisor = Supervisor()
    deployment = AronaDeployment(run_id)
    limited = AronaDeployment(f"{run_id}_limits")
    quota = AronaDeployment(f"{run_id}_quota")
    before = AronaDeployment(f"{run_id}_before")
    # Backstops for an exit that skips the finally below (they are no-ops after it).
    atexit.register(deployment.close)
    atexit.register(limited.close)
    atexit.register(quota.close)
    atexit.register(before.close)
    atexit.register(supervisor.stop_all)
    scenarios = [s for s in SCENARIOS if s.key in options.scenarios]
    results = Results()
    notes = [
        f"open-file limit for every process: {fd_limit} (raised by the harness, inherited)",
        "errors: wrk counts responses with status >= 400 plus socket errors and "
        "timeouts (10 s); the streaming client counts non-200 answers, broken streams "
        "and streams without `data: [DONE]`",
        "slow-1000 runs once per system, in the first repetition: the processes keep "
        "the memory of the first 1,000 streams, so a second round would measure ~0 KB",
        "Arona meters every call (usage records batched to PostgreSQL); LiteLLM runs "
        "without a database, so it writes no spend logs",
    ]
    failed = False
    pins = contextlib.ExitStack()
    try:
        install = None
        if "litellm" in options.systems:
            say("LiteLLM: preparing bench/.peers/litellm (pip install on first use)...")
            install = ensure_installed()
        fake = start_fake(supervisor, run_dir)
        systems: list[System] = []
        if "direct" in options.systems:
            systems.append(fake.as_system())
        if "arona-before" in options.systems and options.baseline is not None:
            say(f"Arona before: exporting and installing {options.baseline} (once per commit)...")
            baseline = prepare_baseline(options.baseline)
            notes.append(
                f"Arona before (baseline) is commit {baseline.short} ({options.baseline}), "
                "with the request quota it had (project requests per minute and day)"
            )
            systems.append(start_arona(supervisor, before, fake, run_dir, baseline=baseline))
        if "arona" in options.systems:
            say("Arona: creating the database, migrating, starting, registering the fake...")
            systems.append(start_arona(supervisor, deployment, fake, run_dir))
        if "arona-quota" in options.systems:
            say("Arona + request quota: the limits Arona had before Step 13 (requests, key rpm)...")
            systems.append(start_arona(supervisor, quota, fake, run_dir, limits="quota"))
        if "arona-limits" in options.systems:
            say("Arona + limits: a second Arona with budgets, token limits and key limits on...")
            systems.append(start_arona(supervisor, limited, fake, run_dir, limits="all"))
        litellm, litellm_info = _litellm(supervisor, install, fake, run_dir)
        if litellm is not None:
            systems.append(litellm)
        elif "litellm" in options.systems:
            say(f"LiteLLM {litellm_info['status']}")
            notes.append(f"LiteLLM {litellm_info['status']}")
        systems.sort(key=lambda s: SYSTEM_ORDER.index(s.key))
        measurer = Measurer(wrk, fake, run_dir, options.hold_seconds)
        notes.append(pins.enter_context(services_off_sut_core(measurer.services)))
        warm = [s for s in SCENARIOS if s.key in WARMUP_SCENARIOS]
        warmed: dict[str, float] = {}
        for system in systems:
            say(f"warming up {system.label} ({options.warmup_seconds:g} s per load)...")
            for scenario in warm:
                measurer.run(scenario, system, options.warmup_seconds)
            warmed[system.key] = rss_mb(system.pid)
        for run_index in range(1, options.runs + 1):
            for scenario in scenarios:
                if scenario.kind == "hold" and run_index > 1:
                    # Once only: Python keeps the memory of the first 1,000 streams, so a
                    # second round would find it already there and measure ~0 KB each.
                    continue
                for system in systems:
                    sample = measurer.run(scenario, system, options.seconds)
                    results.add(scenario.key, system.key, sample)
                    _progress(run_index, options.runs, scenario, system, sample)
        for system in systems:
            figures = {
                "rss_after_warmup_mb": warmed[system.key],
                "rss_after_load_mb": rss_mb(system.pid),
            }
            if system.startup_seconds is not None:
                figures["startup_s"] = system.startup_seconds
            results.add(MEMORY, system.key, Sample(figures))
        versions = {s.key: s.version for s in systems}
    except BenchError as exc:
        failed = True
        say(f"benchmark failed: {exc}\n(logs kept in {run_dir})")
        return 1
    finally:
        pins.close()
        say("stopping every process the benchmark started...")
        supervisor.stop_all()
        closed = [*deployment.close(), *limited.close(), *quota.close(), *before.close()]
        for problem in closed:
            say(f"cleanup: {problem}")
        if not failed:
            shutil.rmtree(run_dir, ignore_errors=True)
    results.derive_added_latency()
    context = ReportContext(
        date=time.strftime("%Y-%m-%d"),
        name=time.strftime("%Y-%m-%d") + options.suffix,
        command=options.command,
        wall_seconds=time.monotonic() - started,
        runs=options.runs,
        seconds=options.seconds,
        machine=machine_info(
            {
                "arona": versions.get("arona", "not run"),
                "direct (fake upstream)": versions.get("direct", "not run"),
                "litellm": versions.get("litellm", "not run"),
                "wrk": wrk_version(wrk),
            }
        ),
        litellm=litellm_info,
        results=results,
        notes=notes,
    )
    markdown = render(context)
    say("\n" + markdown)
    md_path, json_path = write(context, markdown)
    say(f"written: {md_path} and {json_path}")
    return 0
