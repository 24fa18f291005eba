"""``make bench`` keeps the data services off the gateway's core for a run and gives
them their cores back after it (a real child process and its threads stand in for
PostgreSQL and Redis)."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator

import pytest

from bench.procs import SUT_CPU, USABLE_CPUS
from bench.service_pinning import services_off_sut_core

# A parent with a thread of its own and a child process: every thread of the tree moves.
TREE = """
import subprocess, sys, threading, time
threading.Thread(target=time.sleep, args=(60,), daemon=True).start()
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
print(child.pid, flush=True)
time.sleep(60)
"""


@pytest.fixture
def service() -> Iterator[tuple[int, int]]:
    parent = subprocess.Popen([sys.executable, "-c", TREE], stdout=subprocess.PIPE, text=True)
    assert parent.stdout is not None
    child = int(parent.stdout.readline())
    yield parent.pid, child
    for pid in (child, parent.pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, 9)
    parent.wait()


def affinities(pid: int) -> list[set[int]]:
    return [os.sched_getaffinity(int(t)) for t in os.listdir(f"/proc/{pid}/task")]


def test_the_services_leave_the_sut_core_for_the_run_and_get_their_cores_back(
    service: tuple[int, int],
) -> None:
    parent, _ = service
    before = {pid: affinities(pid) for pid in service}
    assert len(before[parent]) >= 2  # the parent's own thread is moved too
    with services_off_sut_core([parent]) as note:
        if SUT_CPU in USABLE_CPUS and len(USABLE_CPUS) > 1:
            others = set(USABLE_CPUS) - {SUT_CPU}
            assert all(cpus == others for pid in service for cpus in affinities(pid))
            assert "pinned" in note
            assert f"core {SUT_CPU}" in note
        else:
            assert note.startswith("services not pinned")
    assert {pid: affinities(pid) for pid in service} == before


def test_a_service_gone_before_the_end_does_not_fail_the_run(service: tuple[int, int]) -> None:
    parent, child = service
    before = affinities(parent)
    with services_off_sut_core([parent]):
        os.kill(child, 9)
    assert affinities(parent) == before
