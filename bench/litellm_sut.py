"""The LiteLLM proxy as the peer: installed into its own venv under ``bench/.peers/``.

The install is reused while its stamp names the pinned version; a failed or partial
install has no stamp and is redone. The proxy runs without a database (no spend logs),
one worker, a master key, and the same fake upstream as Arona.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from app.lib.ports import free_port
from bench.procs import SUT_CPU, BenchError, Supervisor, tail, wait_http
from bench.systems import CHAT_MODEL, EMBED_MODEL, FAKE_KEY, FakeUpstream, System

LITELLM_VERSION = "1.108.7"
"""The newest 1.108.x whose ``[proxy]`` extra resolves on PyPI (1.108.8 and later pin a
``litellm-proxy-extras`` release that was never published)."""
REQUIREMENT = f"litellm[proxy]=={LITELLM_VERSION}"
PEERS = Path(__file__).resolve().parent / ".peers"
VENV = PEERS / "litellm"
STAMP = VENV / ".bench-installed.json"
INSTALL_LOG = PEERS / "litellm-install.log"
INSTALL_TIMEOUT_SECONDS = 600
READY_TIMEOUT_SECONDS = 180


@dataclass(frozen=True, slots=True)
class LiteLLMInstall:
    ok: bool
    version: str
    seconds: float
    """Wall time of the pip install (of the earlier one when reused)."""
    reused: bool
    reason: str = ""


def _read_stamp() -> LiteLLMInstall | None:
    try:
        stamp = json.loads(STAMP.read_text())
    except (OSError, ValueError):
        return None
    if stamp.get("version") != LITELLM_VERSION or not (VENV / "bin" / "litellm").exists():
        return None
    return LiteLLMInstall(True, LITELLM_VERSION, float(stamp.get("seconds", 0.0)), reused=True)


def ensure_installed() -> LiteLLMInstall:
    """Install the pinned LiteLLM into its venv unless a finished install is there."""
    existing = _read_stamp()
    if existing is not None:
        return existing
    shutil.rmtree(VENV, ignore_errors=True)
    PEERS.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    steps = [
        [sys.executable, "-m", "venv", str(VENV)],
        [
            str(VENV / "bin" / "pip"),
            "install",
            "--quiet",
            "--disable-pip-version-check",
            REQUIREMENT,
        ],
    ]
    with INSTALL_LOG.open("w") as out:
        for argv in steps:
            try:
                done = subprocess.run(  # noqa: S603 - argv built above
                    argv,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    timeout=INSTALL_TIMEOUT_SECONDS,
                    check=False,
                )
            except (OSError, subprocess.TimeoutExpired) as exc:
                return _failed(f"{argv[0]} failed: {exc}", started)
            if done.returncode != 0:
                return _failed(f"{' '.join(argv[-2:])} exited with {done.returncode}", started)
    seconds = time.monotonic() - started
    STAMP.write_text(json.dumps({"version": LITELLM_VERSION, "seconds": round(seconds, 1)}))
    return LiteLLMInstall(True, LITELLM_VERSION, seconds, reused=False)


def _failed(reason: str, started: float) -> LiteLLMInstall:
    # pip prints the real cause last; keep it (without the noise of ignored find-links).
    lines = [line for line in tail(INSTALL_LOG, 60).splitlines() if "is ignored" not in line]
    detail = "\n".join(line if len(line) < 300 else line[:300] + "..." for line in lines[-8:])
    return LiteLLMInstall(
        False,
        LITELLM_VERSION,
        time.monotonic() - started,
        reused=False,
        reason=f"{reason} (log: {INSTALL_LOG})\n{detail}".strip(),
    )


def _config(fake: FakeUpstream, master_key: str) -> str:
    def entry(model: str) -> dict[str, object]:
        params = {"model": f"openai/{model}", "api_base": f"{fake.url}/v1", "api_key": FAKE_KEY}
        return {"model_name": model, "litellm_params": params}

    config = {
        "model_list": [entry(CHAT_MODEL), entry(EMBED_MODEL)],
        "litellm_settings": {"set_verbose": False, "telemetry": False},
        "general_settings": {"master_key": master_key},
    }
    # JSON is YAML: no YAML writer needed for a file LiteLLM reads with yaml.safe_load.
    return json.dumps(config, indent=2)


def start_litellm(
    supervisor: Supervisor, install: LiteLLMInstall, fake: FakeUpstream, run_dir: Path
) -> System:
    port = free_port()
    master_key = f"sk-bench-{secrets.token_hex(8)}"
    workdir = run_dir / "litellm"
    workdir.mkdir(parents=True, exist_ok=True)
    config = workdir / "config.yaml"
    config.write_text(_config(fake, master_key))
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "LITELLM_LOG")}
    env.update(
        # Without these it tries to fetch the model price map from the internet at start.
        LITELLM_LOCAL_MODEL_COST_MAP="True",
        LITELLM_LOG="ERROR",
        # Its upstream pool defaults to 500 connections per host: it would queue half of
        # the 1,000 slow streams. Arona's pool allows 1,000; give LiteLLM as many.
        AIOHTTP_CONNECTOR_LIMIT="2000",
        AIOHTTP_CONNECTOR_LIMIT_PER_HOST="2000",
        PYTHONUNBUFFERED="1",
    )
    argv = [
        str(VENV / "bin" / "litellm"),
        "--config",
        str(config),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--num_workers",
        "1",
    ]
    started = time.monotonic()
    child = supervisor.start(
        "litellm", argv, cpu=SUT_CPU, log=workdir / "litellm.log", env=env, cwd=workdir
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_http(f"{url}/health/liveliness", child, timeout=READY_TIMEOUT_SECONDS)
        startup = time.monotonic() - started
        _smoke(url, master_key)
    except BenchError:
        # The run goes on without LiteLLM: a half-started one must not keep CPU 0 busy.
        supervisor.stop(child)
        raise
    version = f"litellm {install.version}"
    return System("litellm", url, master_key, child.pid, version, startup, child)


def _smoke(url: str, key: str) -> None:
    body = {"model": CHAT_MODEL, "messages": [{"role": "user", "content": "ping"}]}
    try:
        with httpx.Client(timeout=30.0, trust_env=False) as client:
            response = client.post(
                f"{url}/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"}
            )
    except httpx.HTTPError as exc:
        raise BenchError(f"LiteLLM did not answer a test chat: {exc!r}") from exc
    if not response.is_success:
        raise BenchError(f"LiteLLM answered {response.status_code}: {response.text[:500]}")
