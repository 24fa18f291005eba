"""Prints the figures of the architecture table in docs/architecture.md ("Step 12
before and after"): lines in app/server, cache invalidation calls outside services,
imports that run up the layers, and (where the workplace's ``duplicates`` command is
on PATH) repeated-code pairs in app/."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.unit.test_layers import (  # noqa: E402 - after the path is set
    APP,
    layer_violations,
    modules,
    surface_violations,
)

INVALIDATION = re.compile(r"(\w+_changed|\.changed|\.invalidate\w*)\(")
OUTSIDE_SERVICES = re.compile(r"(controllers|pages|views)\.py$|/server/")


def server_lines() -> int:
    return sum(len(p.read_text().splitlines()) for p in (APP / "server").rglob("*.py"))


def invalidation_calls_outside_services() -> list[str]:
    found = []
    for path in modules():
        relative = str(path.relative_to(ROOT))
        if not OUTSIDE_SERVICES.search(relative):
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if INVALIDATION.search(line) and "def " not in line and "_sent." not in line:
                found.append(f"{relative}:{number}")
    return found


def duplicate_pairs() -> str:
    tool = shutil.which("duplicates")
    if tool is None:
        return "n/a (duplicates not on PATH)"
    done = subprocess.run(  # noqa: S603 - fixed argv
        [tool, "--repo", str(APP), "--seconds", "300"], capture_output=True, text=True, check=False
    )
    first = done.stdout.splitlines()[0] if done.stdout else ""
    return first.split(" ", 1)[0] if first else "n/a"


def main() -> None:
    calls = invalidation_calls_outside_services()
    upward = layer_violations()
    print(f"lines in app/server: {server_lines()}")
    print(f"invalidation calls outside services: {len(calls)}")
    for call in calls:
        print(f"  {call}")
    print(f"imports up the layers: {len(upward)}")
    for edge in upward:
        print(f"  {edge}")
    between = surface_violations()
    print(f"modules importing another surface: {len(between)}")
    for edge in between:
        print(f"  {edge}")
    print(f"duplicates pairs in app/: {duplicate_pairs()}")


if __name__ == "__main__":
    main()
