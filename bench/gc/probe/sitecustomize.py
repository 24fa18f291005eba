"""Loaded by the Arona process the GC benchmark starts (``PYTHONPATH`` points here).

It forces the collector thresholds under test (the server's own ``tune_gc`` call is
redirected to them) and records every collection's pause, written out as JSON lines
when the process exits. Nothing here is imported by Arona itself.
"""

from __future__ import annotations

import atexit
import gc
import json
import os
import threading
import time
from typing import Any


def _install(log_path: str, thresholds: tuple[int, ...]) -> None:
    set_threshold = gc.set_threshold
    set_threshold(*thresholds)
    gc.set_threshold = lambda *_ignored: set_threshold(*thresholds)
    pauses: list[tuple[float, int, float, int]] = []
    started = [0.0]

    def on_collection(phase: str, info: dict[str, Any]) -> None:
        now = time.perf_counter()
        if phase == "start":
            started[0] = now
        else:
            pauses.append((time.time(), info["generation"], now - started[0], info["collected"]))

    def write_out() -> None:
        # Appends what was recorded since the last call: the server may be killed
        # rather than exit, so the flusher thread writes as it goes.
        taken = pauses[:]
        del pauses[: len(taken)]
        with open(log_path, "a", encoding="utf-8") as out:
            for at, generation, seconds, collected in taken:
                out.write(json.dumps({"at": at, "gen": generation, "s": seconds, "n": collected}))
                out.write("\n")

    def flush_every_second() -> None:
        while True:
            time.sleep(1.0)
            write_out()

    gc.callbacks.append(on_collection)
    atexit.register(write_out)
    threading.Thread(target=flush_every_second, name="gc-probe", daemon=True).start()


_LOG = os.environ.get("ARONA_BENCH_GC_LOG")
if _LOG:
    _install(_LOG, tuple(int(p) for p in os.environ["ARONA_BENCH_GC_THRESHOLDS"].split(",")))
