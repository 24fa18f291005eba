"""What a system under test is to the load generators, and the fake upstream behind them."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from app import __version__
from app.lib.ports import free_port
from bench.procs import LOAD_CPU, BenchError, Child, Supervisor, wait_http

CHAT_MODEL = "bench-chat"
EMBED_MODEL = "bench-embed"
STREAM_CHUNKS = 20
FAKE_KEY = "sk-fake"
"""The fake checks no key; LiteLLM insists on sending one."""

SYSTEM_ORDER = ("direct", "arona-before", "arona", "arona-quota", "arona-limits", "litellm")
DEFAULT_SYSTEMS = tuple(s for s in SYSTEM_ORDER if s != "arona-before")
"""What runs without ``--only``; ``arona-before`` runs with ``--baseline REF``."""
LABELS = {
    "direct": "direct",
    "arona-before": "Arona before (baseline) + request quota",
    "arona": "Arona",
    "arona-quota": "Arona + request quota",
    "arona-limits": "Arona + limits",
    "litellm": "LiteLLM",
}


@dataclass(slots=True)
class System:
    """A running system under test: where to send load and which process to measure."""

    key: str
    base_url: str
    """``http://127.0.0.1:PORT``; requests go to ``base_url + /v1/...``."""
    api_key: str
    pid: int
    """Root of the process tree whose CPU and memory are measured."""
    version: str
    startup_seconds: float | None = None
    """From spawning the server to its first healthy answer (None for the fake)."""
    child: Child | None = None

    def check_alive(self) -> None:
        if self.child is not None:
            self.child.check_alive()

    @property
    def label(self) -> str:
        return LABELS[self.key]

    @property
    def host_port(self) -> tuple[str, int]:
        host, _, port = self.base_url.removeprefix("http://").partition(":")
        return host, int(port)


@dataclass(slots=True)
class FakeUpstream:
    child: Child
    url: str

    def control(self, **switches: Any) -> None:
        """Flip switches of the fake (``POST /__fake/control``)."""
        try:
            with httpx.Client(timeout=5.0, trust_env=False) as client:
                client.post(f"{self.url}/__fake/control", json=switches).raise_for_status()
        except httpx.HTTPError as exc:
            raise BenchError(f"the fake upstream refused {switches}: {exc!r}") from exc

    def stats(self) -> dict[str, Any]:
        """The fake's counters (``GET /__fake/stats``)."""
        try:
            with httpx.Client(timeout=5.0, trust_env=False) as client:
                answer = client.get(f"{self.url}/__fake/stats")
                answer.raise_for_status()
        except httpx.HTTPError as exc:
            raise BenchError(f"the fake upstream's stats could not be read: {exc!r}") from exc
        stats: dict[str, Any] = answer.json()["stats"]
        return stats

    def as_system(self) -> System:
        # The floor: the same requests straight to the fake, no gateway in between.
        version = f"app.fakes {__version__}"
        return System("direct", self.url, FAKE_KEY, self.child.pid, version, child=self.child)


def start_fake(supervisor: Supervisor, run_dir: Path) -> FakeUpstream:
    port = free_port()
    argv = [
        sys.executable,
        "-m",
        "app.fakes",
        "--kind",
        "openai",
        "--port",
        str(port),
        "--models",
        f"{CHAT_MODEL},{EMBED_MODEL}",
        "--chunks",
        str(STREAM_CHUNKS),
    ]
    child = supervisor.start("fake upstream", argv, cpu=LOAD_CPU, log=run_dir / "fake.log")
    url = f"http://127.0.0.1:{port}"
    wait_http(f"{url}/__fake/stats", child, timeout=30)
    fake = FakeUpstream(child, url)
    # Recording keeps request bodies around; a benchmark wants none of that work.
    fake.control(record_requests=False)
    return fake
