"""A PostgreSQL server of the test's own, to stop and start under load.

The shared PostgreSQL on 5432 serves every other test and helper, so a fault test
never touches it: it initialises a throw-away cluster in a temp dir (trust auth,
listening on 127.0.0.1 only, its unix socket in the same dir) on a free port, and can
stop it (``immediate`` simulates a crash: no shutdown checkpoint, clients cut off)
and start it again on the same port and data dir.

PostgreSQL refuses to run as root; when the tests run as root the binaries run as
the ``postgres`` OS user (``runuser``) and the temp dir is handed to that user. The
binaries are the newest version under ``/etc/postgresql`` (Debian's layout:
``/usr/lib/postgresql/<version>/bin``), which the CI image has because it runs the
shared server the same way.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Literal

PG_USER = "postgres"
START_TIMEOUT_SECONDS = 60
STOP_TIMEOUT_SECONDS = 60

StopMode = Literal["immediate", "fast", "smart"]


def postgres_bin_dir() -> Path:
    """``/usr/lib/postgresql/<v>/bin`` of the newest version configured on this host."""
    versions = sorted(
        (p.name for p in Path("/etc/postgresql").iterdir() if p.name.split(".")[0].isdigit()),
        key=lambda v: tuple(int(part) for part in v.split(".")),
    )
    for version in reversed(versions):
        candidate = Path("/usr/lib/postgresql") / version / "bin"
        if (candidate / "pg_ctl").exists():
            return candidate
    raise RuntimeError(f"no PostgreSQL binaries for versions {versions} under /usr/lib/postgresql")


class PostgresInstance:
    """One cluster in a temp dir; ``start`` / ``stop`` may be called repeatedly."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.bin_dir = postgres_bin_dir()
        # Not pytest's tmp_path: it lives under a root-only (0700) directory the
        # postgres user could not traverse.
        self.root = Path(tempfile.mkdtemp(prefix="arona-pg-"))
        self.data_dir = self.root / "data"
        self.log_file = self.root / "server.log"
        self._as_root = os.geteuid() == 0
        if self._as_root:
            user = pwd.getpwnam(PG_USER)
            os.chown(self.root, user.pw_uid, user.pw_gid)
        self._run(
            "initdb",
            "-D",
            str(self.data_dir),
            "-U",
            PG_USER,
            "-A",
            "trust",
            "--no-sync",
            "-E",
            "UTF8",
        )

    # -------------------------------------------------------------- addresses

    @property
    def admin_dsn(self) -> str:
        return f"postgresql://{PG_USER}@127.0.0.1:{self.port}/postgres"

    def dsn(self, database: str) -> str:
        return f"postgresql://{PG_USER}@127.0.0.1:{self.port}/{database}"

    def sqlalchemy_url(self, database: str) -> str:
        return f"postgresql+asyncpg://{PG_USER}@127.0.0.1:{self.port}/{database}"

    # -------------------------------------------------------------- lifecycle

    def start(self) -> None:
        """Start (or restart) on the same port and data dir; waits until it accepts
        connections (crash recovery included, after an ``immediate`` stop)."""
        options = " ".join(
            [
                f"-p {self.port}",
                f"-k {self.root}",
                "-c listen_addresses=127.0.0.1",
                # Only the server's crash is simulated, not the machine's: WAL written
                # to the OS cache survives it, so skipping fsync loses nothing and
                # saves time. (synchronous_commit stays on: with it off, a commit
                # acknowledged just before an immediate stop would be lost.)
                "-c fsync=off",
                "-c max_connections=200",
            ]
        )
        self._run(
            "pg_ctl",
            "-D",
            str(self.data_dir),
            "-l",
            str(self.log_file),
            "-o",
            options,
            "-w",
            "-t",
            str(START_TIMEOUT_SECONDS),
            "start",
        )

    def stop(self, mode: StopMode = "immediate") -> None:
        """``immediate``: a crash as clients see it (connections reset, recovery on
        the next start); ``fast``: a clean shutdown that disconnects clients."""
        self._run(
            "pg_ctl",
            "-D",
            str(self.data_dir),
            "-m",
            mode,
            "-w",
            "-t",
            str(STOP_TIMEOUT_SECONDS),
            "stop",
        )

    def running(self) -> bool:
        result = self._run("pg_ctl", "-D", str(self.data_dir), "status", check=False)
        return result.returncode == 0

    def close(self) -> None:
        """Stop if running and delete everything."""
        try:
            if self.running():
                self.stop("immediate")
        finally:
            shutil.rmtree(self.root, ignore_errors=True)

    def log(self) -> str:
        return self.log_file.read_text(errors="replace") if self.log_file.exists() else ""

    # -------------------------------------------------------------- internals

    def _run(self, tool: str, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        command = [str(self.bin_dir / tool), *args]
        if self._as_root:
            command = ["runuser", "-u", PG_USER, "--", *command]
        result = subprocess.run(
            command,
            cwd=self.root,
            capture_output=True,
            text=True,
            timeout=START_TIMEOUT_SECONDS + 30,
            check=False,
        )
        if check and result.returncode != 0:
            raise RuntimeError(
                f"{tool} failed ({result.returncode}):\n{result.stdout}\n{result.stderr}\n"
                f"server log:\n{self.log()}"
            )
        return result
