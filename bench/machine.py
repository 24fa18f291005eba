"""What the benchmark ran on: CPU, kernel, interpreter and the versions of everything."""

from __future__ import annotations

import asyncio
import contextlib
import os
import platform
import sys
from pathlib import Path

import asyncpg
import redis

from bench.arona_sut import PG_ADMIN_DSN, REDIS_URL
from bench.procs import LOAD_CPU, SUT_CPU, pinning_available


def cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def memory_total() -> str:
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return f"{int(line.split()[1]) / 1024 / 1024:.1f} GiB"
    return "unknown"


async def _postgres_version() -> str:
    connection = await asyncpg.connect(PG_ADMIN_DSN)
    try:
        version: str = await connection.fetchval("SHOW server_version")
        return version
    finally:
        await connection.close()


def service_versions() -> dict[str, str]:
    versions = {"postgresql": "unavailable", "redis": "unavailable"}
    with contextlib.suppress(OSError, asyncpg.PostgresError):
        versions["postgresql"] = asyncio.run(_postgres_version())
    with contextlib.suppress(redis.RedisError):
        client = redis.Redis.from_url(REDIS_URL)
        try:
            info = client.info("server")
            versions["redis"] = str(info.get("redis_version", "unknown"))
        finally:
            client.close()
    return versions


def pinning_text() -> str:
    if not pinning_available():
        return "none (fewer than 2 usable cores or no taskset): figures are not comparable"
    return (
        f"system under test on CPU {SUT_CPU}; fake upstream, wrk, the streaming client and "
        f"the harness on CPU {LOAD_CPU} (taskset)"
    )


def machine_info(versions: dict[str, str]) -> dict[str, str]:
    info = {
        "cpu": cpu_model(),
        "cores": str(os.cpu_count() or 0),
        "memory": memory_total(),
        "kernel": f"{platform.system()} {platform.release()}",
        "python": sys.version.split()[0],
        "pinning": pinning_text(),
    }
    info.update(versions)
    info.update(service_versions())
    return info
