"""Picked ports: free, and never where outgoing connections take theirs."""

from __future__ import annotations

import socket

from app.lib.ports import LOWEST_PORT, first_ephemeral_port, free_port


def test_free_ports_sit_below_the_ephemeral_range_and_can_be_listened_on():
    first_ephemeral = first_ephemeral_port()
    picked = {free_port() for _ in range(20)}
    assert all(LOWEST_PORT <= port < first_ephemeral for port in picked)
    assert len(picked) > 1  # picked at random, not one fixed port
    for port in picked:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))
            sock.listen()


def test_a_port_in_use_is_never_picked():
    with socket.socket() as held:
        held.bind(("127.0.0.1", free_port()))
        held.listen()
        taken = held.getsockname()[1]
        assert all(free_port() != taken for _ in range(200))
