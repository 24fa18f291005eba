"""Ports: held from the moment they are picked, or picked where nothing takes them.

``bind_tcp`` holds a port for a server of this process until it starts listening.
``free_port`` is for a server that binds later, in another process.

A port from ``bind((host, 0))`` comes from the kernel's ephemeral range, the same range
every outgoing connection takes its local port from. Between the pick and the server's
bind (a model server may load weights for minutes first), or while a server is down to
be restarted on the same port, any connection on the host can take that port, and a
client polling the port can even connect to itself on it: the server then fails with
"address in use". ``free_port`` picks below the ephemeral range, where no outgoing
connection goes.
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


def bind_tcp(host: str, port: int) -> socket.socket:
    """A TCP socket bound to ``(host, port)`` (0: a free port the kernel picks), not
    listening yet: connections are refused until a server starts on it, but the port
    is held, so no other listener and no outgoing connection can take it meanwhile."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP explicitly: asyncio only sets TCP_NODELAY on accepted sockets whose
    # proto says TCP, and without it small responses stall ~40 ms on delayed ACKs.
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    return sock
