"""An earlier Arona as one more system of the same run (``--baseline REF``).

A figure like "CPU per request within +10 % of what it was" is only honest when the
old code is measured beside the new one, in the same minutes on the same machine:
figures of different days on this shared machine differ by more than that. The
baseline is the commit ``REF`` exported (``git archive``, so nothing of the checkout
changes) to ``bench/.peers/arona-<sha>`` with its own locked environment (``uv sync
--frozen``), kept for later runs. It runs with the request quota every Arona has
had (a project's requests per minute and day), on its own database.
"""

from __future__ import annotations

import shutil
import subprocess
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

from bench.procs import BenchError

ROOT = Path(__file__).resolve().parent.parent
PEERS = ROOT / "bench" / ".peers"
SYNC_TIMEOUT_SECONDS = 900


@dataclass(frozen=True, slots=True)
class Baseline:
    sha: str
    executable: str
    """The baseline's ``arona`` entry point, in its own environment."""

    @property
    def short(self) -> str:
        return self.sha[:9]


def _git(*argv: str) -> str:
    git = shutil.which("git")
    if git is None:
        raise BenchError("git is needed for --baseline")
    try:
        done = subprocess.run(  # noqa: S603 - fixed program, arguments from the user's ref
            [git, "-C", str(ROOT), *argv], capture_output=True, text=True, check=False
        )
    except OSError as exc:
        raise BenchError(f"git is needed for --baseline: {exc}") from exc
    if done.returncode != 0:
        raise BenchError(f"git {' '.join(argv)}: {done.stderr.strip()}")
    return done.stdout.strip()


def _uv() -> str:
    found = shutil.which("uv") or str(ROOT / ".tools" / "bin" / "uv")
    if not Path(found).exists():
        raise BenchError("uv is needed for --baseline (run `make install` first)")
    return found


def prepare(ref: str) -> Baseline:
    """The baseline for ``ref`` (a commit, tag or branch), exported and installed on
    first use."""
    sha = _git("rev-parse", "--verify", f"{ref}^{{commit}}")
    tree = PEERS / f"arona-{sha[:12]}"
    executable = tree / ".venv" / "bin" / "arona"
    if executable.exists():
        return Baseline(sha, str(executable))
    shutil.rmtree(tree, ignore_errors=True)
    tree.mkdir(parents=True)
    with tempfile.TemporaryDirectory() as tmp:
        archive = Path(tmp) / "tree.tar"
        _git("archive", "--format=tar", f"--output={archive}", sha)
        with tarfile.open(archive) as tar:
            tar.extractall(tree, filter="data")
    log = PEERS / f"arona-{sha[:12]}-install.log"
    with log.open("w") as out:
        try:
            done = subprocess.run(  # noqa: S603 - fixed program and arguments
                [_uv(), "sync", "--frozen", "--no-dev"],
                cwd=tree,
                stdout=out,
                stderr=subprocess.STDOUT,
                timeout=SYNC_TIMEOUT_SECONDS,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise BenchError(f"installing the baseline {sha[:9]} failed: {exc}") from exc
    if done.returncode != 0 or not executable.exists():
        shutil.rmtree(tree, ignore_errors=True)
        raise BenchError(f"installing the baseline {sha[:9]} failed: see {log}")
    return Baseline(sha, str(executable))
