"""The one free-port helper the tests share: servers they start (moto, Ray, PostgreSQL, Dagster's UI,
torchrun's rendezvous) need a port that is free now."""

from __future__ import annotations

import socket


def free_port() -> int:
    """A loopback port that was free a moment ago. Racy in principle, but servers asked for port 0 do not all
    report back the port they took (torchrun's --master_port 0 hangs), so this is the usual way."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
