"""`free_ports`: distinct loopback ports a test's servers can each bind (probed one at a time, the kernel handed
the same port out twice and nginx refused a duplicate listen in CI)."""

from __future__ import annotations

import socket

from gateway.local.redis_server import free_ports


def test_the_ports_are_distinct_and_each_can_be_bound() -> None:
    for _ in range(20):
        ports = free_ports(8)
        assert len(set(ports)) == 8
    held = []
    try:
        for port in ports:
            server = socket.socket()
            held.append(server)
            server.bind(("127.0.0.1", port))
    finally:
        for server in held:
            server.close()
