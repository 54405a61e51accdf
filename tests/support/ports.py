"""Loopback ports for the servers tests start, and for the ones they need absent."""

from __future__ import annotations

import socket


def free_port() -> int:
    """A loopback port nothing listens on (the probe that found it is closed): a server
    can be started there, and until one is, every connect is refused."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
