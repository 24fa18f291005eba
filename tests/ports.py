"""Free loopback ports for servers a test starts (or restarts) on a port it chose.

A port from ``bind(("127.0.0.1", 0))`` comes from the kernel's ephemeral range, the
same range every outgoing connection takes its local port from. Between the pick and
the server's bind, or while a server is stopped to be restarted on the same port, any
connection of the suite can take that port: the server then fails with "address in
use". (A client reconnecting to a stopped server can even connect to itself on it.)
The ports here come from below the ephemeral range, where no outgoing connection goes.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
LOWEST_PORT = 20_000
ATTEMPTS = 500


def _first_ephemeral_port() -> int:
    try:
        return int(EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32_768  # Linux's default


def free_port() -> int:
    """A port nothing is bound to now, below the ephemeral range."""
    highest = _first_ephemeral_port() - 1
    if highest <= LOWEST_PORT:
        raise RuntimeError(f"no room below the ephemeral range in {EPHEMERAL_RANGE}")
    picker = random.SystemRandom()
    for _ in range(ATTEMPTS):
        port = picker.randint(LOWEST_PORT, highest)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                # No SO_REUSEADDR: a port with a connection in TIME_WAIT is skipped too.
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port in {LOWEST_PORT}-{highest} after {ATTEMPTS} tries")
