"""Ports for servers started on a port picked in advance (one that binds only later).

A port from ``bind((host, 0))`` comes from the kernel's ephemeral range, the same range
every outgoing connection takes its local port from. Between the pick and the server's
bind (a model server may load weights for minutes first), or while a server is down to
be restarted on the same port, any connection on the host can take that port, and a
client polling the port can even connect to itself on it: the server then fails with
"address in use". The ports here come from below the ephemeral range, where no
outgoing connection goes.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
LINUX_FIRST_EPHEMERAL_PORT = 32_768
LOWEST_PORT = 20_000
ATTEMPTS = 500


def first_ephemeral_port() -> int:
    try:
        return int(EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return LINUX_FIRST_EPHEMERAL_PORT


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing is bound to on ``host`` now, below the ephemeral range."""
    highest = first_ephemeral_port() - 1
    if highest <= LOWEST_PORT:
        raise OSError(f"no room below the ephemeral range in {EPHEMERAL_RANGE}")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    picker = random.SystemRandom()
    for _ in range(ATTEMPTS):
        port = picker.randint(LOWEST_PORT, highest)
        with socket.socket(family, socket.SOCK_STREAM) as sock:
            try:
                # No SO_REUSEADDR: a port with a connection in TIME_WAIT is skipped too.
                sock.bind((host, port))
            except OSError:
                continue
            return port
    raise OSError(f"no free port in {LOWEST_PORT}-{highest} after {ATTEMPTS} tries")
