#!/usr/local/bin/python3
"""Container health check: exit 0 when the local Arona answers ``GET <path>`` with 200.

Usage: ``arona-healthcheck [/path]`` (default ``/healthz``). The image's HEALTHCHECK
uses ``/healthz`` (liveness); compose uses ``/readyz?allow_degraded=true`` for the
replicas so the load balancer starts only once they have started (which needs
PostgreSQL); later outages make it say ``degraded`` with a 200, since the replica
serves on (plain ``/readyz`` would answer 503).
Standard library only, so the image needs no curl.
"""

from __future__ import annotations

import os
import sys
import urllib.request

TIMEOUT_SECONDS = 2.0


def main(argv: list[str]) -> int:
    path = argv[1] if len(argv) > 1 else "/healthz"
    if not path.startswith("/"):
        print(f"usage: arona-healthcheck [/path], got {path!r}", file=sys.stderr)
        return 2
    # The server listens on ARONA_PORT (the image sets 8420) on every address.
    port = os.environ.get("ARONA_PORT") or "8420"
    url = f"http://127.0.0.1:{port}{path}"
    try:
        with urllib.request.urlopen(url, timeout=TIMEOUT_SECONDS) as response:
            status = response.status
    except OSError as exc:  # refused, timed out, or an HTTP error status (HTTPError)
        print(f"unhealthy: GET {url}: {exc}", file=sys.stderr)
        return 1
    if status != 200:
        print(f"unhealthy: GET {url}: HTTP {status}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
