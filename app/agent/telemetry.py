"""GPU telemetry from ``nvidia-smi``; a machine without it reports no GPUs.

No GPUs means "no telemetry": the panel sorts such agents last when it picks the
least loaded one.
"""

from __future__ import annotations

import asyncio
import shutil

import structlog

from app.lib.agent_frames import Gpu

QUERY = "index,name,memory.total,memory.used,utilization.gpu"
TIMEOUT_SECONDS = 5.0
logger = structlog.get_logger()


def parse_nvidia_smi(output: str) -> list[Gpu]:
    """Rows of ``--query-gpu=QUERY --format=csv,noheader,nounits``; bad rows are skipped
    ("[N/A]" readings, which some boards report, count as 0)."""
    gpus: list[Gpu] = []
    for line in output.splitlines():
        parts = [part.strip() for part in line.split(",")]
        if len(parts) != 5:
            continue
        index, name, total, used, utilization = parts
        try:
            gpus.append(
                Gpu(
                    index=int(index),
                    name=name[:200],
                    memory_total_mb=_number(total),
                    memory_used_mb=_number(used),
                    utilization_percent=float(min(100, _number(utilization))),
                )
            )
        except ValueError:
            continue
    return gpus


def _number(text: str) -> int:
    try:
        return max(0, int(float(text)))
    except ValueError:
        if text.startswith("["):  # [N/A], [Not Supported]
            return 0
        raise


async def read_gpus(binary: str = "nvidia-smi") -> list[Gpu]:
    path = shutil.which(binary)
    if path is None:
        return []
    try:
        process = await asyncio.create_subprocess_exec(
            path,
            f"--query-gpu={QUERY}",
            "--format=csv,noheader,nounits",
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL,
        )
    except OSError as exc:
        logger.warning("nvidia-smi could not start", error=repr(exc))
        return []
    try:
        async with asyncio.timeout(TIMEOUT_SECONDS):
            stdout, _ = await process.communicate()
    except TimeoutError:
        process.kill()
        await process.wait()
        logger.warning("nvidia-smi did not answer in time")
        return []
    if process.returncode != 0:
        return []
    return parse_nvidia_smi(stdout.decode(errors="replace"))
