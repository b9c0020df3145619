"""Ports for local servers: several chosen together are distinct and free."""

from __future__ import annotations

import socket

from compass_dev.processes import free_ports


def test_ports_chosen_together_are_distinct_and_can_be_listened_on() -> None:
    """A server given one port for two listeners fails to start (tritonserver refused gRPC and
    metrics on one port in CI), so ports chosen together never repeat."""
    ports = free_ports(64)
    assert len(set(ports)) == 64
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
        listener.bind(("127.0.0.1", ports[0]))
        listener.listen()
