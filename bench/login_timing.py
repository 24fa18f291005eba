"""``python -m bench.login_timing``: does a failed login tell whether the email exists?

A wrong password for a real account and any password for an unknown email must get the
same answer (tested) and take about as long: otherwise the response time alone lists
which addresses have accounts. This measures both through the real app (in process, on
SQLite with in-memory state, the default argon2id parameters), interleaved so machine
noise hits both alike, with a correct login for reference. It prints figures and the
ratio of the medians; it asserts nothing (the machine is shared and noisy).
"""

from __future__ import annotations

import argparse
import asyncio
import secrets
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from litestar.testing import AsyncTestClient

from app.db.migrate import upgrade
from app.lib.settings import load_settings
from app.lib.vault import generate_key_spec
from app.server.app import create_app


async def _timed(call: Callable[[], Awaitable[int]], expected: int) -> float:
    started = time.perf_counter()
    status = await call()
    elapsed = time.perf_counter() - started
    if status != expected:
        raise SystemExit(f"unexpected status {status} (wanted {expected})")
    return elapsed


def _line(name: str, samples: list[float]) -> str:
    ordered = sorted(samples)
    p90 = ordered[int(0.9 * (len(ordered) - 1))]
    return (
        f"  {name:<22} median {statistics.median(samples) * 1000:7.1f} ms"
        f"   p90 {p90 * 1000:7.1f} ms   min {ordered[0] * 1000:7.1f} ms"
    )


async def measure(rounds: int, data_dir: Path) -> dict[str, list[float]]:
    settings = load_settings(
        {
            "ARONA_DATABASE_URL": f"sqlite+aiosqlite:///{data_dir / 'bench.db'}",
            "ARONA_JWT_SECRET": secrets.token_urlsafe(48),
            "ARONA_VAULT_KEYS": generate_key_spec("bench"),
            "ARONA_REGISTRATION_OPEN": "true",
            # Every attempt must reach the password check, not the rate limiter.
            "ARONA_LOGIN_MAX_ATTEMPTS": str(rounds * 10),
            "ARONA_LOG_LEVEL": "WARNING",
            "ARONA_DATA_DIR": str(data_dir),
        }
    )
    await asyncio.to_thread(upgrade, settings)
    samples: dict[str, list[float]] = {"wrong password": [], "unknown email": [], "correct": []}
    password = secrets.token_urlsafe(16)
    async with AsyncTestClient(app=create_app(settings)) as client:
        email = "known@bench.arona.local"
        registered = await client.post(
            "/api/auth/register", json={"email": email, "password": password, "name": "b"}
        )
        if registered.status_code != 201:
            raise SystemExit(f"registration failed: {registered.text}")

        async def login(address: str, password: str) -> int:
            response = await client.post(
                "/api/auth/login", json={"email": address, "password": password}
            )
            return response.status_code

        calls: dict[str, tuple[Callable[[], Awaitable[int]], int]] = {
            "wrong password": (lambda: login(email, "not the password"), 401),
            "unknown email": (lambda: login(f"{secrets.token_hex(6)}@bench.local", "x" * 12), 401),
            "correct": (lambda: login(email, password), 200),
        }
        for call, expected in calls.values():  # warm-up: caches, first connections
            await _timed(call, expected)
        for n in range(rounds):
            order = list(calls) if n % 2 == 0 else list(reversed(calls))
            for name in order:
                call, expected = calls[name]
                samples[name].append(await _timed(call, expected))
    return samples


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.login_timing", description=__doc__)
    parser.add_argument("--rounds", type=int, default=40, help="logins per kind (default 40)")
    args = parser.parse_args(argv)
    if args.rounds < 5:
        parser.error("--rounds must be at least 5")
    with tempfile.TemporaryDirectory(prefix="arona-login-bench-") as tmp:
        samples = asyncio.run(measure(args.rounds, Path(tmp)))
    print(f"Login timing, {args.rounds} interleaved rounds (argon2id, default parameters)")
    for name, values in samples.items():
        print(_line(name, values))
    wrong = statistics.median(samples["wrong password"])
    unknown = statistics.median(samples["unknown email"])
    print(f"  unknown / wrong-password median ratio: {unknown / wrong:.3f} (1.000 = no signal)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
